"""The ``suffix`` drafter (SuffixDecoding) on tiny models: lossless greedy (chain and
tree, EOS inside a block), sampling keeps the target distribution (chi-square),
the global structure learns from earlier requests, the cost rule, state files."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.drafters.suffix import SuffixDrafter, shipped_verify_cost
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan, TreePlan
from tests.realmodels.decoder_util import SpyDrafter, as_loaded, chi_square_pvalue, exact_joint, one_thread, plain_greedy, tiny_llama  # noqa: F401

VOCAB = 12
POLICIES = {
    "chain": lambda: FixedDraftPolicy(4),
    "tree": lambda: FixedDraftPolicy(4, parse_tree_shape("topk=2,depth=4,v=8")),
}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=0)


@pytest.fixture(scope="module")
def peaked():
    """A target with peakier next-token distributions: drafts are accepted often enough
    under sampling for the chi-square test to see the acceptance path."""
    return tiny_llama(VOCAB, seed=0, scale=2.0)


def _prompts(n: int = 24) -> list[list[int]]:
    rng = np.random.default_rng(0)
    prompts = [[5]]
    while len(prompts) < n:
        prompts.append(rng.integers(0, VOCAB - 1, size=int(rng.integers(2, 12))).tolist())
    return prompts + prompts[:4]                       # repeats: the global structure drafts them


def _request(ids, plan, max_tokens=32):
    return DraftRequest(torch.tensor(ids, dtype=torch.long), plan, max_tokens, SamplingConfig(0.0),
                        torch.Generator())


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("cost", ["shipped", "flat"])
def test_greedy_equals_plain_greedy(target, policy, cost):
    drafter = SpyDrafter(SuffixDrafter(verify_cost=None if cost == "shipped" else [1.0]))
    dec = SpeculativeDecoder(as_loaded(target), drafter, policy=POLICIES[policy](), eos_token_id=[])
    for prompt in _prompts():
        result = dec.generate(prompt, 12)
        assert result.new_tokens == plain_greedy(target, prompt, 12), (policy, prompt)
        assert sum(r.tokens_per_round for r in result.trace) == 12
    drafted = [p for p in drafter.proposals if p.size]
    assert drafted and all(p.q_draft is None for p in drafted)
    assert any(not p.is_chain for p in drafted) == (policy == "tree")
    assert any(f.num_accepted for f in drafter.feedback)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_eos_inside_a_drafted_block(target, policy):
    prompt = [4, 7, 1]
    ref = plain_greedy(target, prompt, 10)
    eos = ref[2]
    stop = ref.index(eos)
    drafter = SuffixDrafter(verify_cost=[1.0])
    dec = SpeculativeDecoder(as_loaded(target), drafter, policy=POLICIES[policy](), eos_token_id=eos)
    first = dec.generate(prompt, 10)
    assert first.new_tokens == ref[: stop + 1] and first.stop_reason == "eos"
    second = dec.generate(prompt, 10)                  # the earlier output is drafted from the global trie
    assert second.new_tokens == ref[: stop + 1] and second.stop_reason == "eos"
    assert second.trace[0].accepted_tokens >= stop     # EOS sat inside the accepted block
    assert len(second.trace) == 1


def test_global_structure_learns_from_earlier_requests(target):
    prompts = _prompts(10)[:10]
    on = SuffixDrafter(verify_cost=[1.0])
    off = SuffixDrafter(verify_cost=[1.0], use_global=False)
    taus = {}
    for name, drafter in (("on", on), ("off", off)):
        dec = SpeculativeDecoder(as_loaded(target), drafter, policy=FixedDraftPolicy(6), eos_token_id=[])
        for prompt in prompts:
            dec.generate(prompt, 16)
        taus[name] = np.mean([dec.generate(p, 16).trace.mean_accepted_length() for p in prompts])
    assert taus["on"] > taus["off"] + 1.0, taus       # a second pass is drafted from the first
    tails = sum(min(len(p), 8) for p in prompts)
    assert on.cache.num_tokens == 2 * (10 * 16 + tails) == off.cache.num_tokens



def _exact_joint(model, prompt, sampling, length):
    return exact_joint(model, prompt, sampling, length, VOCAB)


@pytest.mark.parametrize("case", [("chain", SamplingConfig(1.0)), ("tree", SamplingConfig(0.8, top_k=6))])
def test_sampling_preserves_target_distribution(peaked, case):
    target = peaked
    kind, sampling = case
    prompt = [2, 9, 2]
    joint = _exact_joint(target, prompt, sampling, 2)
    keys = list(joint)
    p = np.array([joint[k] for k in keys])
    policy = FixedDraftPolicy(2) if kind == "chain" else FixedDraftPolicy(2, parse_tree_shape("topk=3,depth=2,v=6"))
    drafter = SpyDrafter(SuffixDrafter(verify_cost=[1.0], max_requests=50))
    dec = SpeculativeDecoder(as_loaded(target), drafter, policy=policy, sampling=sampling,
                             eos_token_id=[], seed=11)
    n = 1000
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):
        counts[tuple(dec.generate(prompt, 2).new_tokens)] += 1
    # the drafts were real: most rounds drafted, some drafts were accepted, trees branched
    assert sum(pr.size > 0 for pr in drafter.proposals) > 0.9 * len(drafter.proposals)
    assert sum(f.num_accepted for f in drafter.feedback) > 200
    assert (kind == "tree") == any(not pr.is_chain for pr in drafter.proposals)
    # the tolerance follows the sample count: chi-square's p-value at n draws
    assert chi_square_pvalue(counts, keys, p, n) > 1e-3


def test_proposals_carry_empirical_path_probabilities():
    drafter = SuffixDrafter(verify_cost=[1.0], prior_count=0.0, use_global=False)
    ctx = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
    drafter.reset(torch.tensor(ctx))
    tree = DraftPlan(3, TreePlan(top_k=2, max_depth=3))
    prop = drafter.propose(_request(ctx, tree))
    # after "1 2": 3 twice, 4 once -> p(3) = 2/3, p(4) = 1/3; after "1 2 3": 1 once, 9 once
    paths = {}
    for i in range(prop.size):
        par = int(prop.parents[i])
        paths[i] = (paths[par] if par >= 0 else ()) + (int(prop.tokens[i]),)
    got = {paths[i]: float(prop.node_probs[i]) for i in range(prop.size)}
    assert got[(3,)] == pytest.approx(2 / 3) and got[(4,)] == pytest.approx(1 / 3)
    assert got[(3, 1)] == pytest.approx(1 / 3) and got[(3, 9)] == pytest.approx(1 / 3)
    assert prop.q_draft is None
    chain = drafter.propose(_request(ctx, DraftPlan(3)))
    assert chain.is_chain and chain.tokens.tolist()[:1] == [3]
    # k = 0 means "do not speculate", for a tree plan too
    assert drafter.propose(_request(ctx, DraftPlan(0, TreePlan(top_k=2, max_depth=3)))).size == 0
    assert drafter.propose(_request(ctx, DraftPlan(0))).size == 0


def test_cost_rule_chooses_the_verified_size():
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    sizes = {}
    for name, table in (("flat", [1.0]), ("steep", [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0])):
        drafter = SuffixDrafter(verify_cost=table, use_global=False)
        drafter.reset(torch.tensor(ctx))
        sizes[name] = drafter.propose(_request(ctx, DraftPlan(6))).size
    assert sizes["flat"] == 6 and 0 <= sizes["steep"] < 6, sizes
    # the shipped table is non-decreasing after repair and bfloat16 verification is flatter
    f32, bf16 = shipped_verify_cost("float32"), shipped_verify_cost("torch.bfloat16")
    assert f32.size == bf16.size >= 16 and bf16[15] / bf16[0] < f32[15] / f32[0]


def test_calibration_follows_the_verifier(target):
    drafter = SuffixDrafter(verify_cost=[1.0])
    before = drafter.calibration.trials.sum()
    dec = SpeculativeDecoder(as_loaded(target), drafter, policy=FixedDraftPolicy(4), eos_token_id=[])
    for prompt in _prompts(6):
        dec.generate(prompt, 12)
    assert drafter.calibration.trials.sum() > before
    assert np.all(drafter.calibration.accepted <= drafter.calibration.trials)


def test_state_round_trips_through_a_file(target, tmp_path):
    drafter = SuffixDrafter(max_requests=5)
    dec = SpeculativeDecoder(as_loaded(target), drafter, policy=FixedDraftPolicy(4), eos_token_id=[])
    for prompt in _prompts(8):
        dec.generate(prompt, 10)
    path = tmp_path / "suffix.json"
    drafter.save(path)
    loaded = SuffixDrafter(max_requests=5, state=path)
    assert loaded.state_dict() == json.loads(path.read_text()) == drafter.state_dict()
    assert loaded.cache.trie.items() == drafter.cache.trie.items()
    drafted = 0
    for prompt in _prompts(8):
        for d in (drafter, loaded):
            d.reset(torch.tensor(prompt))
        plan = DraftPlan(4, TreePlan(top_k=3, max_depth=4))
        a, b = drafter.propose(_request(prompt, plan)), loaded.propose(_request(prompt, plan))
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
        assert a.size == 0 or torch.equal(a.node_probs, b.node_probs)
        drafted += a.size
    assert drafted > 0
    with pytest.raises(ValueError, match="depth"):
        SuffixDrafter(depth=8, state=path)
    with pytest.raises(FileNotFoundError):
        SuffixDrafter(state=tmp_path / "missing.json")


def test_registry_and_bad_arguments():
    drafter = make_drafter("suffix", None, dtype="bfloat16", depth=16, max_match=8, device="cpu")
    assert isinstance(drafter, SuffixDrafter) and drafter.cache.depth == 16
    assert np.allclose(drafter.verify_cost[0], shipped_verify_cost("bfloat16")[0])
    corpus = SuffixDrafter(corpus=[[1, 2, 3], [4, 5]])
    assert corpus.cache.num_tokens == 5
    corpus.reset(torch.tensor([7, 8, 1, 2]))             # a warm-started trie drafts the first round
    assert corpus.propose(_request([7, 8, 1, 2], DraftPlan(2))).tokens.tolist() == [3]
    assert corpus.cache.num_tokens == 5
    for kwargs in ({"depth": 1}, {"max_match": 32}, {"max_match": 0}, {"prior_count": -1.0},
                   {"min_prob": 1.0}, {"use_global": False, "use_local": False},
                   {"verify_cost": "flat"}, {"prompt_tail": -1}, {"verify_cost": [0.0]}, {"dtype": "int8"}):
        with pytest.raises(ValueError):
            SuffixDrafter(**kwargs)


def test_calibration_counts_exactly_the_tested_nodes():
    from types import SimpleNamespace
    drafter = SuffixDrafter(verify_cost=[1.0], use_global=False, prior_count=0.0)
    ctx = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
    drafter.reset(torch.tensor(ctx))
    prop = drafter.propose(_request(ctx, DraftPlan(3, TreePlan(top_k=2, max_depth=3))))
    pending_parents, pending_stats = drafter._pending
    path = {}
    for i in range(prop.size):
        par = int(prop.parents[i])
        path[i] = (path[par] if par >= 0 else ()) + (int(prop.tokens[i]),)
    first = next(i for i in range(prop.size) if path[i] == (3,))
    # accept "3", reject its children: tested = the root's children and the children of "3"
    tested = [i for i in range(prop.size) if int(prop.parents[i]) in (-1, first)]
    feedback = SimpleNamespace(proposal=prop, accepted_nodes=(first,), finished=False,
                               committed_tokens=torch.tensor([3, 1]))
    drafter.observe(feedback)
    cal = drafter.calibration
    assert cal.trials.sum() == len(tested) and cal.accepted.sum() == 1
    assert cal.accepted[cal.bucket(*pending_stats[first])] == 1
    assert drafter._seq[-2:] == [3, 1] and drafter._output == [3, 1]
    # a round stopped inside its block (finished) counts only the accepted nodes
    prop = drafter.propose(_request(drafter._seq, DraftPlan(3)))
    assert prop.size > 0
    before = cal.trials.sum()
    drafter.observe(SimpleNamespace(proposal=prop, accepted_nodes=(), finished=True,
                                    committed_tokens=torch.tensor([11])))
    assert cal.trials.sum() == before and drafter.cache.num_tokens == 8 + 3
