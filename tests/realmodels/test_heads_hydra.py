"""Hydra heads: shapes and errors, multi-step training on a tiny cache, lossless
chain/tree drafting through the decoder (tiny target)."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.heads.head_drafting import HydraDrafter
from specloop.realmodels.heads.hydra import HydraConfig, HydraHeads, ReducedVocabHead
from specloop.realmodels.loading import LoadedModel
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.sampling import SamplingConfig
from specloop.realmodels.training.head_loop import LoopConfig
from specloop.realmodels.training.train_hydra import (HydraTrainConfig, fixed_eval_batch, hydra_loss,
                                                      train_hydra_heads)
from specloop.strategies.base import TreePlan
from tests.realmodels.heads_b_util import HIDDEN, VOCAB, frequency_vocab, tiny_cache, tiny_target, token_stream

V_D = 80
NO_EOS = [VOCAB + 7]   # an id the tiny target can never emit: generation runs to max_new_tokens


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = tiny_target()
    folder = tmp_path_factory.mktemp("hydra_cache")
    train = tiny_cache(model, folder / "train", 8192, seed=0)
    val = tiny_cache(model, folder / "val", 2048, seed=1)
    return model, train, val


def make_heads(model, vocab, num_heads=3):
    heads = HydraHeads(HydraConfig(HIDDEN, num_heads, 1, VOCAB, len(vocab)), vocab,
                       model.model.embed_tokens.weight)
    heads.lm_head.init_from_target(model.lm_head.weight)
    return heads


@pytest.fixture(scope="module")
def trained(setup):
    model, train, val = setup
    torch.manual_seed(0)
    heads = make_heads(model, frequency_vocab(train, V_D))
    before = fixed_eval_batch(val, 3, 1024)
    _, logits0 = heads.unroll(before.h, before.tokens)
    report = train_hydra_heads(heads, train, val, LoopConfig(steps=150, batch_size=64, lr=3e-3, warmup=10),
                               HydraTrainConfig(eval_positions=1024), progress=False)
    return heads, report, logits0, before


def test_config_and_vocab_errors():
    with pytest.raises(ValueError):
        HydraConfig(hidden_size=0)
    with pytest.raises(ValueError):
        HydraConfig(hidden_size=8, target_vocab_size=10, draft_vocab_size=11)
    with pytest.raises(ValueError, match="repeated"):
        ReducedVocabHead(8, torch.tensor([1, 1, 2]), 10)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        ReducedVocabHead(8, torch.tensor([1, 10]), 10)
    with pytest.raises(ValueError, match="shape"):
        HydraHeads(HydraConfig(8, 2, 1, 10, 3), torch.tensor([0, 1, 2]), torch.zeros(11, 8))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        HydraHeads(HydraConfig(8, 2, 1, 10, 4), torch.tensor([0, 1, 2]), torch.zeros(10, 8))


def test_to_target_probs_scatters_mass():
    head = ReducedVocabHead(4, torch.tensor([7, 2, 5]), 9)
    q = torch.tensor([[0.5, 0.3, 0.2]])
    full = head.to_target_probs(q)
    assert full.shape == (1, 9)
    assert torch.allclose(full[0, [7, 2, 5]], q[0])
    assert float(full.sum()) == pytest.approx(1.0)
    assert int((full > 0).sum()) == 3
    assert head.target_to_draft.tolist()[7] == 0 and head.target_to_draft.tolist()[0] == -1


def test_unroll_equals_steps_and_rejects_bad_depth(setup):
    model, train, _ = setup
    heads = make_heads(model, frequency_vocab(train, V_D))
    h = torch.randn(5, HIDDEN)
    toks = torch.randint(0, VOCAB, (5, 3))
    z, logits = heads.unroll(h, toks)
    assert z.shape == (5, 3, HIDDEN) and logits.shape == (5, 3, V_D)
    zi = h
    for i in range(3):
        zi, li = heads.step(i, zi, toks[:, i])
        assert torch.allclose(li, logits[:, i], atol=1e-6)
    with pytest.raises(ValueError, match="depth"):
        heads.step(3, h, toks[:, 0])


def test_multistep_gradient_reaches_first_head_through_own_features(setup):
    """Head 3's loss alone must move head 1's weights: features are fed forward."""
    model, train, val = setup
    heads = make_heads(model, frequency_vocab(train, V_D))
    batch = fixed_eval_batch(val, 3, 64)
    _, logits = heads.unroll(batch.h, batch.tokens)
    logits[:, 2].logsumexp(-1).sum().backward()
    assert heads.heads[0].in_proj.weight.grad.abs().sum() > 0


def test_training_improves_heldout_agreement(trained):
    heads, report, logits0, batch = trained
    final = report["final"]
    agree0 = (heads.lm_head.draft_to_target[logits0.argmax(-1)] == batch.topk_ids[..., 0]).float().mean(0)
    for i in range(3):
        assert final[f"top1_head{i + 1}"] > float(agree0[i]) + 0.1
    assert final["chain_accept3"] <= final["chain_accept2"] <= final["chain_accept1"]
    assert report["steps"] == 150 and report["positions"] == 150 * 64
    assert report["train_tokens_available"] == 8192


def test_loss_is_finite_and_decreases(setup, trained):
    model, _, val = setup
    heads, *_ = trained
    fresh = make_heads(model, heads.lm_head.draft_to_target.clone())
    batch = fixed_eval_batch(val, 3, 256)
    with torch.no_grad():
        loss_trained, _ = hydra_loss(heads, batch, HydraTrainConfig())
        loss_fresh, _ = hydra_loss(fresh, batch, HydraTrainConfig())
    assert torch.isfinite(loss_trained) and float(loss_trained) < float(loss_fresh)


@pytest.mark.parametrize("tree", [None, TreePlan(branching=(3, 2, 1)), TreePlan(top_k=3, max_depth=3),
                                  TreePlan(top_k=4, max_depth=3, verify_size=6)])
def test_greedy_speculative_equals_plain_greedy(setup, trained, tree):
    model, *_ = setup
    heads, *_ = trained
    target = LoadedModel(model, None, "tiny", "test")
    for seed, length in ((5, 20), (6, 1), (7, 9)):
        prompt = token_stream(length, seed).tolist()
        plain = SpeculativeDecoder(target, HydraDrafter(heads), policy=FixedDraftPolicy(0),
                                   eos_token_id=NO_EOS).generate(prompt, 30)
        spec = SpeculativeDecoder(target, HydraDrafter(heads), policy=FixedDraftPolicy(3, tree),
                                  eos_token_id=NO_EOS).generate(prompt, 30)
        assert spec.new_tokens == plain.new_tokens
        if tree is not None and tree.verify_size is not None:
            assert max(r.num_draft_tokens for r in spec.trace) <= tree.verify_size
    assert len(spec.trace) < 30   # the trained heads do get tokens accepted


def test_chain_reports_the_distribution_it_sampled_from(setup, trained):
    model, *_ = setup
    heads, *_ = trained
    drafter = HydraDrafter(heads)
    prompt = torch.tensor(token_stream(12, 3))
    with torch.no_grad():
        out = model(prompt[None, :-1], output_hidden_states=True)
    drafter.reset(prompt, target_hidden=(out.hidden_states[-1][0],))
    from specloop.realmodels.drafters.base import DraftRequest
    from specloop.strategies.base import DraftPlan
    gen = torch.Generator().manual_seed(0)
    request = DraftRequest(prompt, DraftPlan(3), 10, SamplingConfig(temperature=0.8, top_k=20), gen)
    prop = drafter.propose(request)
    assert prop.size == 3 and prop.is_chain and prop.q_draft.shape == (3, VOCAB)
    assert torch.allclose(prop.q_draft.sum(-1), torch.ones(3), atol=1e-5)
    assert bool((prop.q_draft[torch.arange(3), prop.tokens] > 0).all())
    assert int((prop.q_draft[0] > 0).sum()) <= 20          # top-k applied to q_draft
    # the first row is exactly head 1's processed distribution on h_t and the pending token
    z, logits = heads.step(0, out.hidden_states[-1][0, -1:], prompt[-1:])
    from specloop.realmodels.sampling import processed_probs
    expect = heads.lm_head.to_target_probs(processed_probs(logits[0], request.sampling))
    assert torch.allclose(prop.q_draft[0], expect, atol=1e-6)


def test_reset_errors(setup, trained):
    heads, *_ = trained
    drafter = HydraDrafter(heads)
    with pytest.raises(ValueError, match="empty"):
        drafter.reset(torch.zeros(0, dtype=torch.long), target_hidden=None)
    with pytest.raises(ValueError, match="hidden"):
        drafter.reset(torch.tensor([1, 2, 3]), target_hidden=None)
    with pytest.raises(ValueError, match="expected 2"):
        drafter.reset(torch.tensor([1, 2, 3]), target_hidden=(torch.zeros(5, HIDDEN),))
    assert drafter.parameters() and all(p.requires_grad for p in drafter.parameters())


def test_registered_trainer_saves_a_draft_the_registry_loads(tmp_path):
    from tests.realmodels.heads_b_util import registered_roundtrip
    drafter, report, target = registered_roundtrip("hydra", tmp_path)
    assert report["optimizer_steps"] == 20 and report["draft_vocab_size"] == 64
    assert 0.0 <= report["heldout_top1"] <= 1.0 and len(report["heldout_top1_per_step"]) == 5
    assert report["positions_seen"] == 20 * 2 * 16 and report["cached_positions"] == 4096
    assert drafter.name == "hydra" and drafter.train_report["heldout_top1"] == report["heldout_top1"]
    prompt = token_stream(10, 3).tolist()
    plain = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(0), eos_token_id=NO_EOS).generate(prompt, 12)
    spec = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(5), eos_token_id=NO_EOS).generate(prompt, 12)
    assert spec.new_tokens == plain.new_tokens
    from specloop.realmodels.registry.drafters import make_drafter
    with pytest.raises(FileNotFoundError, match="draft train"):
        make_drafter("hydra", target, checkpoint=str(tmp_path / "nothing"), train_if_missing=False)


def test_frozen_lm_head_stays_the_targets_rows(setup):
    model, train, val = setup
    heads = make_heads(model, frequency_vocab(train, V_D))
    before = heads.lm_head.proj.weight.detach().clone()
    first = heads.heads[0].in_proj.weight.detach().clone()
    train_hydra_heads(heads, train, val, LoopConfig(steps=5, batch_size=16, lr=1e-2, warmup=1),
                      HydraTrainConfig(eval_positions=64, train_lm_head=False), progress=False)
    assert torch.equal(heads.lm_head.proj.weight, before)
    assert torch.equal(before, model.lm_head.weight[heads.lm_head.draft_to_target])
    assert not torch.equal(heads.heads[0].in_proj.weight, first)


def test_training_continues_from_a_saved_draft_and_keeps_its_vocabulary(tmp_path):
    """``init_from`` (``specloop draft train --init-from``) starts from the saved
    weights and keeps the saved reduced vocabulary even when another size is asked."""
    from safetensors.torch import load_file

    from specloop.realmodels.training.trainer import TrainConfig, get_trainer
    from tests.realmodels.heads_b_util import registered_roundtrip
    _, first, target = registered_roundtrip("hydra", tmp_path)
    config = TrainConfig(target="tiny", kind="hydra", steps=1, batch_size=2, window=17, lr=1e-12,
                         draft_vocab_size=32, quick=True, feature_root=str(tmp_path / "features"),
                         out_dir=str(tmp_path / "continued"), init_from=first["path"])
    second = get_trainer("hydra")(config, loaded=target, progress=False)
    assert second["draft_vocab_size"] == 64
    saved = load_file(str(tmp_path / "hydra" / "draft.safetensors"))
    continued = load_file(str(tmp_path / "continued" / "draft.safetensors"))
    assert saved.keys() == continued.keys()
    for name, tensor in saved.items():
        torch.testing.assert_close(continued[name], tensor, rtol=0, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="draft train"):
        get_trainer("hydra")(TrainConfig(target="tiny", kind="hydra", steps=1, batch_size=2, window=17,
                                         quick=True, feature_root=str(tmp_path / "features"),
                                         out_dir=str(tmp_path / "x"), init_from=str(tmp_path / "none")),
                             loaded=target, progress=False)


class _StopAtTwoVerifyFive(FixedDraftPolicy):
    """Tree policy whose optional hooks stop drafting at depth 2 and verify 5 nodes."""

    def __init__(self):
        super().__init__(4, TreePlan(top_k=3, max_depth=4))
        self.depths, self.sizes = [], []

    def continue_drafting(self, step) -> bool:
        self.depths.append(step.depth)
        return step.depth < 2

    def verify_size(self, candidates) -> int:
        self.sizes.append(candidates.node_probs.size)
        return 5


def test_tree_drafting_honours_the_policy_hooks(setup, trained):
    model, *_ = setup
    heads, *_ = trained
    target = LoadedModel(model, None, "tiny", "test")
    prompt = token_stream(20, 5).tolist()
    policy = _StopAtTwoVerifyFive()
    plain = SpeculativeDecoder(target, HydraDrafter(heads), policy=FixedDraftPolicy(0),
                               eos_token_id=NO_EOS).generate(prompt, 30)
    spec = SpeculativeDecoder(target, HydraDrafter(heads), policy=policy, eos_token_id=NO_EOS).generate(prompt, 30)
    assert spec.new_tokens == plain.new_tokens
    assert set(policy.depths) == {1, 2} and policy.sizes and max(policy.sizes) <= 6
    drafted = [r for r in spec.trace if r.num_draft_tokens]
    assert max(r.num_draft_tokens for r in drafted) == 5 and max(r.tree_depth for r in drafted) == 2
