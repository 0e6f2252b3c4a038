"""Sampled tree siblings of the small-LM draft are lossless.

The toy case: p_target = [.30, .25, .20, .15, .10], q_draft = [.70, .15,
.10, .04, .01] (a draft far from the target: TV = 0.40), two root children, drafted
by `SmallLMDrafter.propose` (a tiny LM whose next-token distribution is exactly q)
and verified by `verify_tree`. The old rule (i.i.d. siblings, duplicates dropped)
emits [.300, .280, .210, .133, .077] exactly (enumerated over the 25 sibling pairs):
chi-square noncentrality 0.0113 per draw against p. With N draws and the threshold
p-value 1e-3 (critical value 18.47 at 4 degrees of freedom) the test detects the
old rule with probability P(ncx2(4, 0.0113 N) > 18.47) = 1 - 1.4e-5 at N = 6000
(0.79 at N = 2000), while a correct rule fails it with probability 1e-3 (fixed seed,
so the outcome is deterministic). The pruned case (budget 1 of the two siblings)
and decoder-level cases with a far draft (tiny random Llamas, exact joint by
enumeration, with and without a binding verify budget) guard the selection of
sampled nodes as well.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch
from scipy import stats

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.drafters.small_lm import SmallLMDrafter
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from specloop.realmodels.sampling import SamplingConfig, processed_probs
from specloop.realmodels.verify import verify_tree
from specloop.strategies.base import DraftPlan, TreePlan
from tests.realmodels.decoder_util import as_loaded, chi_square_pvalue, exact_joint, one_thread, tiny_llama  # noqa: F401 (fixture)

P_TARGET = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10], dtype=torch.float64)
Q_DRAFT = torch.tensor([0.70, 0.15, 0.10, 0.04, 0.01], dtype=torch.float64)
P_VALUE_THRESHOLD = 1e-3
DRAWS = 6000

pytestmark = pytest.mark.usefixtures("one_thread")


def _constant_lm(q: torch.Tensor):
    """A 1-layer Llama whose next-token distribution is ``q`` after any context:
    every token embeds to the same vector, attention and MLP outputs are zero, and
    the LM head maps the (constant) normed state to log q."""
    model = tiny_llama(vocab=q.numel(), seed=0, layers=1, hidden=8)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.zero_()
        emb[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = model.get_output_embeddings().weight
        head.zero_()
        head[:, 0] = 1.0
        scale = float(model(torch.tensor([[0]])).logits[0, -1, 0])   # the normed state's first entry
        head[:, 0] = q.log().float() / scale
        got = processed_probs(model(torch.tensor([[1, 2, 3]])).logits[0, -1], SamplingConfig(1.0))
    torch.testing.assert_close(got.double(), q, atol=1e-6, rtol=0)
    return model


def _chi2_pvalue(counts: np.ndarray, p: np.ndarray) -> float:
    return float(stats.chisquare(counts, p / p.sum() * counts.sum()).pvalue)


def _first_token_counts(width: int, max_tokens: int, draws: int, seed: int) -> np.ndarray:
    """First committed token of ``draws`` rounds: `SmallLMDrafter.propose` (tree of
    ``width`` root children, at most ``max_tokens`` nodes) + `verify_tree` against
    P_TARGET."""
    drafter = SmallLMDrafter(_constant_lm(Q_DRAFT))
    drafter.reset(None)
    gen = torch.Generator().manual_seed(seed)
    plan = DraftPlan(1, TreePlan(branching=(width,)))
    ids = torch.tensor([0, 1, 2])
    counts = np.zeros(P_TARGET.numel())
    for _ in range(draws):
        proposal = drafter.propose(DraftRequest(ids, plan, max_tokens, SamplingConfig(1.0), gen))
        assert proposal.q_draft is not None and int(proposal.size) >= 1
        p_rows = torch.cat([P_TARGET[None], torch.full((proposal.size, P_TARGET.numel()), 0.2,
                                                       dtype=torch.float64)])
        out = verify_tree(p_rows, proposal.tokens, proposal.parents, proposal.q_draft, gen)
        first = int(proposal.tokens[out.accepted_nodes[0]]) if out.accepted_nodes else out.next_token
        counts[first] += 1
    return counts


def test_two_sampled_siblings_far_draft_are_lossless():
    counts = _first_token_counts(width=2, max_tokens=16, draws=DRAWS, seed=18)
    assert _chi2_pvalue(counts, P_TARGET.numpy()) > P_VALUE_THRESHOLD, counts / counts.sum()


def test_pruned_sampled_siblings_are_lossless():
    """Budget 1 of two sampled siblings: keeping the likelier one (the old rerank by
    cumulative probability) verifies a token that is not a draw from its q row
    (old rule: [.390, .198, .150, .145, .117] exactly, noncentrality 0.054 per draw)."""
    counts = _first_token_counts(width=2, max_tokens=1, draws=DRAWS, seed=19)
    assert _chi2_pvalue(counts, P_TARGET.numpy()) > P_VALUE_THRESHOLD, counts / counts.sum()


def test_siblings_are_distinct_and_rows_exclude_earlier_siblings():
    drafter = SmallLMDrafter(_constant_lm(Q_DRAFT))
    drafter.reset(None)
    gen = torch.Generator().manual_seed(3)
    plan = DraftPlan(1, TreePlan(branching=(4,)))
    for _ in range(50):
        prop = drafter.propose(DraftRequest(torch.tensor([0, 1]), plan, 16, SamplingConfig(1.0), gen))
        toks = prop.tokens.tolist()
        assert len(toks) == 4 and len(set(toks)) == 4
        for i, tok in enumerate(toks):
            row = prop.q_draft[i].double()
            expected = Q_DRAFT.clone()
            expected[toks[:i]] = 0.0
            torch.testing.assert_close(row, expected / expected.sum(), atol=1e-5, rtol=0)
    # fewer tokens of positive probability than the width: as many siblings as there are
    prop = drafter.propose(DraftRequest(torch.tensor([0, 1]), plan, 16, SamplingConfig(1.0, top_k=2), gen))
    assert sorted(prop.tokens.tolist()) == [0, 1]


# -- decoder level: a draft far from the target -----------------------------------
VOCAB = 6



def _exact_joint(model, prompt, sampling, length):
    return exact_joint(model, prompt, sampling, length, VOCAB)


@pytest.mark.parametrize("shape", ["3x2", "3x2,v=3"])
def test_decoder_tree_sampling_far_draft_preserves_target(shape):
    """Tiny random target and an unrelated draft (first-token TV 0.59, checked
    > 0.3), T = 1, tree "3x2" (three sampled root siblings, two children each)
    and "3x2,v=3" (the verify budget of 3 of the 9 nodes binds), 3 new tokens:
    the first two emitted tokens follow the target's exact joint (chi-square,
    cells with expected count < 5 pooled). The old code fails both at p < 1e-4
    with these 2000 draws (seed 7: 2.7e-8 and 4.5e-9)."""
    target = tiny_llama(VOCAB, seed=0, layers=1, init_range=0.3)
    draft = tiny_llama(VOCAB, seed=3, layers=1, init_range=0.6)
    sampling = SamplingConfig(1.0)
    prompt = [2, 4, 1]
    with torch.no_grad():
        p = processed_probs(target(torch.tensor([prompt])).logits[0, -1], sampling)
        q = processed_probs(draft(torch.tensor([prompt])).logits[0, -1], sampling)
    assert 0.5 * float((p - q).abs().sum()) > 0.3, "the draft must be far from the target"
    length = 2
    joint = _exact_joint(target, prompt, sampling, length)
    keys = list(joint)
    probs = np.array([joint[k] for k in keys])
    dec = SpeculativeDecoder(as_loaded(target), SmallLMDrafter(draft),
                             policy=FixedDraftPolicy(2, parse_tree_shape(shape)), sampling=sampling,
                             eos_token_id=[], seed=7)
    n = 2000
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):
        counts[tuple(dec.generate(prompt, length + 1).new_tokens[:length])] += 1
    assert chi_square_pvalue(counts, keys, probs, n, check_support=False) > P_VALUE_THRESHOLD
