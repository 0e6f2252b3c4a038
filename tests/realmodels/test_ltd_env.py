"""LTD over the real decoder: the step-wise engine (no thread) that applies a policy's
hooks to any tree drafter, wall-clock accounting and the gymnasium environments, on a
tiny random Llama (no downloads) with a small deterministic EAGLE-2-style tree drafter."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium.utils import env_checker
from gymnasium.utils.passive_env_checker import env_reset_passive_checker, env_step_passive_checker

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import (BaseDrafter, DraftProposal, DraftRequest, policy_continues,
                                              policy_verify_size)
from specloop.ltd.env_real import (RealHarness, RealTreeEngine, make_real_depth_env, make_real_size_env,
                                   select_subtree)
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.record import RoundRecord
from specloop.strategies.base import DraftPlan, TreePlan
from specloop.ltd.policy import LTDConfig, LTDPolicy, cycle_reward
from tests.realmodels.heads_b_util import VOCAB, tiny_target

CFG = LTDConfig(top_k=3, max_depth=4, verify_sizes=(2, 4, 8), size_obs_probs=16)


class BigramTreeDrafter(BaseDrafter):
    """EAGLE-2 dynamic tree from a fixed bigram table (deterministic, node_probs set),
    honouring the policy hooks like the real tree drafters."""

    name = "bigram-tree"

    def __init__(self, seed: int = 0, max_depth: int = 4):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64), -1)
        self.max_depth = max_depth

    def propose(self, request: DraftRequest) -> DraftProposal:
        tree = request.plan.tree
        k, depth = tree.top_k, min(tree.max_depth, request.plan.num_draft_tokens)
        tokens, parents, probs = [], [], []
        frontier = [(-1, int(request.ids[-1]), 1.0)]
        for level in range(1, depth + 1):
            layer = []
            for node, tok, p in frontier:
                top_p, top_t = self.table[tok].topk(k)
                for q, t in zip(top_p.tolist(), top_t.tolist()):
                    tokens.append(t)
                    parents.append(node)
                    probs.append(p * q)
                    layer.append((len(tokens) - 1, t, p * q))
            parent_best = max(p for _, _, p in frontier)
            frontier = sorted(layer, key=lambda x: -x[2])[:k]
            if not policy_continues(request, level, [p for _, _, p in layer], parent_best):
                break
        size = policy_verify_size(request, level, probs, min(tree.verify_size or len(tokens), len(tokens)))
        keep = np.sort(np.argsort(-np.asarray(probs), kind="stable")[:size])
        remap = {int(old): new for new, old in enumerate(keep)}
        return DraftProposal(torch.tensor([tokens[i] for i in keep]),
                             torch.tensor([remap[parents[i]] if parents[i] >= 0 else -1 for i in keep]), None,
                             torch.tensor([probs[i] for i in keep]))


@pytest.fixture(scope="module")
def harness():
    torch.manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,)) for n in (5, 9, 7)]
    target = SimpleNamespace(model=tiny_target(), tokenizer=None)     # LoadedModel-like
    return RealHarness(target, BigramTreeDrafter(), prompts, CFG, max_new_tokens=12)


def test_select_subtree_is_closed_and_best():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
        depths = np.zeros(n, dtype=int)
        probs = np.zeros(n)
        for i in range(n):
            depths[i] = 1 if parents[i] < 0 else depths[parents[i]] + 1
            probs[i] = rng.random() * (1.0 if parents[i] < 0 else probs[parents[i]])
        d, v = int(rng.integers(1, 5)), int(rng.integers(1, 10))
        keep = select_subtree(depths, parents, probs, d, v)
        assert set(parents[keep][parents[keep] >= 0]) <= set(keep)
        assert (depths[keep] <= d).all() and len(keep) == min(v, int((depths <= d).sum()))


class StopAtTwo(LTDPolicy):
    """Plans the full depth cap but stops after depth 2 and verifies 4 nodes."""

    def continue_drafting(self, step):
        return step.depth < 2

    def verify_size(self, candidates):
        return 4


def test_ltd_engine_cuts_depth_and_size(harness):
    """Through drive_round the engine drafts the cap-depth tree, reveals it to the hooks,
    verifies the best 4 nodes of depth <= 2 and charges only the levels asked for."""
    import threading
    from specloop.realmodels.sampling import SamplingConfig
    from specloop.strategies.engine import drive_round

    base = BigramTreeDrafter()
    policy = StopAtTwo(CFG, static_depth=4)
    engine = RealTreeEngine(harness)
    threads = threading.active_count()
    engine.start_prompt(torch.tensor([4, 5, 6]))
    record = drive_round(policy, engine)
    assert threading.active_count() == threads          # no worker thread any more
    assert (record.tree_depth, record.num_draft_tokens) == (2, 4)
    full = base.propose(DraftRequest(torch.tensor([4, 5, 6]), DraftPlan(2, TreePlan(top_k=3, max_depth=2)), 100,
                                     SamplingConfig(), torch.Generator()))
    best = torch.sort(full.node_probs, descending=True).values[:4]     # = a depth-2 draft's best 4 nodes
    kept = torch.as_tensor(engine._probs[select_subtree(engine._depths, engine._parents, engine._probs, 2, 4)])
    assert torch.allclose(torch.sort(kept, descending=True).values, best.double())
    assert engine._drafted == 4 and record.draft_time >= 0


def test_harness_static_policy_is_lossless_and_accounts_time(harness):
    trace, depths, sizes = harness.run(LTDPolicy(CFG, static_depth=3, static_verify_size=8))
    assert len(trace) > 0 and (depths <= 3).all() and (sizes <= 8).all()
    assert all(r.draft_time >= 0 and r.verify_time > 0 for r in trace)
    plain = SpeculativeDecoder(harness.target, harness.base, policy=FixedDraftPolicy(0))
    tokens = {}
    for r in trace:
        tokens[r.stream_index] = tokens.get(r.stream_index, 0) + r.tokens_per_round
    for index, prompt in enumerate(harness.prompts):
        assert tokens[index] == len(plain.generate(prompt, 12).new_tokens)
    engine = RealTreeEngine(harness)
    for prompt in harness.prompts:                       # the engine's committed text is plain greedy
        engine.start_prompt(prompt)
        while not engine.episode_done:
            from specloop.strategies.engine import drive_round
            drive_round(LTDPolicy(CFG, static_depth=3), engine)
        assert engine.session.new_tokens == plain.generate(prompt, 12).new_tokens
    assert np.all(np.diff(harness.layer_costs) >= 0) and harness.target_time > 0


def test_native_hooks_take_the_same_decisions_as_the_emulation(harness):
    """With a drafter that honours the hooks itself, the native harness (all wall
    clock, no calibration) drafts exactly the emulated trees and stays lossless."""
    native = RealHarness(harness.target, harness.base, harness.prompts, CFG, max_new_tokens=12, native=True)
    assert not native.layer_costs.any()
    emulated = harness.run(StopAtTwo(CFG, static_depth=4))
    direct = native.run(StopAtTwo(CFG, static_depth=4))
    assert (direct[1] <= 2).all() and (direct[2] <= 4).all()
    np.testing.assert_array_equal(direct[1], emulated[1])
    np.testing.assert_array_equal(direct[2], emulated[2])
    assert [r.tokens_per_round for r in direct[0]] == [r.tokens_per_round for r in emulated[0]]
    plain = SpeculativeDecoder(harness.target, harness.base, policy=FixedDraftPolicy(0))
    hooked = SpeculativeDecoder(harness.target, harness.base, policy=StopAtTwo(CFG, static_depth=4))
    for prompt in harness.prompts:
        assert plain.generate(prompt, 12).new_tokens == hooked.generate(prompt, 12).new_tokens


@pytest.mark.parametrize("factory", [make_real_depth_env, make_real_size_env])
def test_real_envs_follow_gymnasium_api(harness, factory):
    env = factory(harness, reward="throughput")
    env_checker.check_observation_space(env.observation_space)
    env_checker.check_action_space(env.action_space)
    env_checker.check_reset_return_type(env)
    obs, _ = env_reset_passive_checker(env, seed=0)
    steps, records = 0, 0
    rng = np.random.default_rng(0)
    while steps < 40:
        obs, reward, term, trunc, info = env_step_passive_checker(env, int(rng.integers(env.action_space.n)))
        assert env.observation_space.contains(obs)
        if "record" in info:
            rec = RoundRecord.from_dict(info["record"])
            assert reward == pytest.approx(cycle_reward(rec, "throughput", harness.target_time))
            records += 1
        else:
            assert reward == 0.0
        steps += 1
        if term or trunc:
            obs, _ = env.reset()
    env.engine.close()
    assert records > 0


def test_real_env_seeded_determinism_of_observations(harness):
    runs = []
    for _ in range(2):
        env = make_real_size_env(harness, reward="accepted_length")
        obs, _ = env.reset(seed=3)
        out = [obs]
        for a in [0, 2, 1, 2, 0, 1]:
            obs, reward, term, trunc, _ = env.step(a)
            out += [obs, reward]
            if term or trunc:
                obs, _ = env.reset()
        env.engine.close()
        runs.append(out)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_round_costs_are_timed_on_decoder_rounds(harness):
    """`measure_round_costs`: per-depth draft seconds and a non-decreasing verify
    table over every token count, from real rounds of the tiny target."""
    from specloop.ltd.record import measure_round_costs

    costs = measure_round_costs(harness.target, harness.base, harness.prompts[0], CFG, max_depth=3, max_verify=8,
                                repeats=1, tokens=6)
    layer, verify = costs["layer_seconds"], costs["verify_seconds"]
    assert layer.shape == (4,) and layer[0] == 0 and (layer[1:] > 0).all() and (np.diff(layer) >= 0).all()
    assert verify.shape == (10,) and verify[0] == 0 and (verify[1:] > 0).all() and (np.diff(verify[1:]) >= 0).all()
    assert 1 in costs["points"] and max(costs["points"]) <= 9 and costs["round_overhead_s"] >= 0
    with pytest.raises(ValueError, match="max_depth"):
        measure_round_costs(harness.target, harness.base, harness.prompts[0], CFG, max_depth=0, max_verify=8)
