"""Online-LR's DPO loss (OnlineSpec Eq. 2) and gradient against a reference computed
by hand; the updater's rounds (DPO and OSD-LR distillation), its frozen reference
and its state."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from specloop.realmodels.reasoning.dpo import DraftUpdater, distill_loss, dpo_loss, sequence_logprob
from specloop.realmodels.reasoning.lookahead import FeedbackPair
from tests.realmodels.reasoning_util import ToyTokenizer, tiny_loaded

BETA = 0.1


@pytest.fixture()
def draft():
    loaded = tiny_loaded(ToyTokenizer(), seed=3, layers=1)
    return loaded.model.double()


def _pair(tok, x="Q: 2+2\n", yw="4\n", yl="5 or 6\n"):
    return FeedbackPair(tuple(tok.encode(x)), tuple(tok.encode(yw)), tuple(tok.encode(yl)), yw, yl)


def _by_hand(model, prompt, response):
    """log pi(y|x) and its gradient w.r.t. the LM head, from the final hidden states:
    sum_i [W h_i]_{y_i} - logsumexp(W h_i); d/dW = sum_i (e_{y_i} - softmax(W h_i)) h_i^T."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0]
    weight = model.lm_head.weight.detach()
    total, grad = 0.0, torch.zeros_like(weight)
    for i, y in enumerate(response):
        h = hidden[len(prompt) - 1 + i]
        logits = [float(weight[v] @ h) for v in range(weight.shape[0])]
        top = max(logits)
        lse = top + math.log(sum(math.exp(z - top) for z in logits))
        total += logits[y] - lse
        probs = torch.tensor([math.exp(z - lse) for z in logits], dtype=weight.dtype)
        onehot = torch.zeros_like(probs)
        onehot[y] = 1.0
        grad += torch.outer(onehot - probs, h)
    return total, grad


def test_dpo_loss_and_gradient_match_the_hand_computation(draft):
    tok = ToyTokenizer()
    pair = _pair(tok)
    reference = copy.deepcopy(draft)
    with torch.no_grad():                       # the policy moved away from the reference
        draft.lm_head.weight.add_(0.05 * torch.randn_like(draft.lm_head.weight))
    for p in draft.parameters():
        p.requires_grad_(True)
    pc, gc = _by_hand(draft, pair.prompt_ids, pair.chosen_ids)
    pr, gr = _by_hand(draft, pair.prompt_ids, pair.rejected_ids)
    rc, _ = _by_hand(reference, pair.prompt_ids, pair.chosen_ids)
    rr, _ = _by_hand(reference, pair.prompt_ids, pair.rejected_ids)
    z = BETA * ((pc - rc) - (pr - rr))
    expected_loss = -math.log(1.0 / (1.0 + math.exp(-z)))
    # d/dW -log sigma(z) = -(1 - sigma(z)) * beta * (d pc - d pr)
    expected_grad = -(1.0 - 1.0 / (1.0 + math.exp(-z))) * BETA * (gc - gr)

    with torch.enable_grad():
        loss = dpo_loss(sequence_logprob(draft, pair.prompt_ids, pair.chosen_ids),
                        sequence_logprob(draft, pair.prompt_ids, pair.rejected_ids),
                        sequence_logprob(reference, pair.prompt_ids, pair.chosen_ids).detach(),
                        sequence_logprob(reference, pair.prompt_ids, pair.rejected_ids).detach(), BETA)
        loss.backward()
    assert float(loss.detach()) == pytest.approx(expected_loss, rel=1e-9, abs=1e-12)
    assert torch.allclose(draft.lm_head.weight.grad, expected_grad, rtol=1e-7, atol=1e-12)
    assert float(sequence_logprob(draft, pair.prompt_ids, pair.chosen_ids)) == pytest.approx(pc, abs=1e-9)
    # at the reference itself the margin is 0: loss log 2
    same = dpo_loss(torch.tensor(pc), torch.tensor(pr), torch.tensor(pc), torch.tensor(pr), BETA)
    assert float(same) == pytest.approx(math.log(2.0))


def test_dpo_round_raises_the_margin_and_keeps_the_reference(draft):
    tok = ToyTokenizer()
    pairs = [_pair(tok), _pair(tok, "Q: 3+1\n", "4\n", "9\n")]
    updater = DraftUpdater(draft, "dpo", lr=1e-3, epochs=3, batch_size=2)
    before = copy.deepcopy(updater.reference.state_dict())

    def margin():
        with torch.no_grad():
            return sum(float(sequence_logprob(draft, p.prompt_ids, p.chosen_ids)
                             - sequence_logprob(draft, p.prompt_ids, p.rejected_ids)) for p in pairs)

    start = margin()
    updater.add(pairs + [FeedbackPair((1,), (), (2,), "", "x")])   # empty chosen step: skipped
    assert len(updater.buffer) == 2
    report = updater.update()
    assert report["pairs"] == 2 and report["steps"] == 3 and report["loss_first"] == pytest.approx(math.log(2))
    assert report["loss_last"] < report["loss_first"] and margin() > start
    assert all(torch.equal(v, updater.reference.state_dict()[k]) for k, v in before.items())
    assert not updater.buffer and updater.update()["pairs"] == 0
    # state round trip: same parameters, optimiser moments and queue
    updater.add(pairs[:1])
    state = updater.state_dict()
    other = DraftUpdater(copy.deepcopy(draft), "dpo", lr=1e-3)
    with torch.no_grad():
        for p in other.model.parameters():
            p.zero_()
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(other.model.parameters(), draft.parameters()))
    assert other.buffer == updater.buffer and other.optimizer.state_dict()["state"].keys() == \
        updater.optimizer.state_dict()["state"].keys()


def test_distillation_round_lowers_the_cross_entropy(draft):
    tok = ToyTokenizer()
    pair = _pair(tok)
    updater = DraftUpdater(draft, "distill", lr=1e-3, epochs=3)
    assert updater.reference is None
    with torch.no_grad():
        start = float(distill_loss(draft, pair))
    updater.add([pair])
    report = updater.update()
    with torch.no_grad():
        assert float(distill_loss(draft, pair)) < start
    assert report["loss_first"] == pytest.approx(start, rel=1e-6)


def test_updater_settings_are_checked(draft):
    assert DraftUpdater(draft).optimizer.defaults["betas"] == (0.9, 0.95)
    assert DraftUpdater(draft).optimizer.defaults["lr"] == 5e-7
    with pytest.raises(ValueError, match="objective"):
        DraftUpdater(draft, "ppo")
    with pytest.raises(ValueError):
        DraftUpdater(draft, lr=0.0)
    with pytest.raises(ValueError):
        sequence_logprob(draft, [], [1])
