"""LTD policies: observations, reward, exported actors, save / load, conformance."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specloop.record import RoundRecord
from specloop.strategies.base import DraftPlan, DraftPolicy, DraftStep, PlanState, TreeCandidates
from specloop.ltd.policy import (LTDConfig, LTDPolicy, MLPActor, cycle_reward, depth_observation,
                                 load_policy, policy_path, save_policy, size_observation)

CFG = LTDConfig(top_k=4, max_depth=6, verify_sizes=(2, 4, 8, 16), size_obs_probs=24)


def _actors(seed: int = 0) -> tuple[MLPActor, MLPActor]:
    torch.manual_seed(seed)
    return (MLPActor(CFG.depth_obs_dim, (32,), 2),
            MLPActor(CFG.size_obs_dim, (32, 16), len(CFG.verify_sizes)))


def _steps(n: int, seed: int) -> list[DraftStep]:
    rng = np.random.default_rng(seed)
    return [DraftStep(int(rng.integers(1, 6)), int(rng.integers(1, 3000)), rng.random(int(rng.integers(1, 9))),
                      0.5, 0.5) for _ in range(n)]


def _cands(n: int, seed: int) -> list[TreeCandidates]:
    rng = np.random.default_rng(seed)
    return [TreeCandidates(int(rng.integers(1, 7)), int(rng.integers(1, 3000)), rng.random(int(rng.integers(1, 60))))
            for _ in range(n)]


probs = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=0, max_size=40)


@settings(max_examples=40, deadline=None)
@given(probs, st.integers(0, 20), st.integers(0, 10_000))
def test_observations_sorted_padded_and_inputs_untouched(values, depth, length):
    arr = np.asarray(values, dtype=np.float64)
    before = arr.copy()
    obs = depth_observation(DraftStep(depth, length, arr, 0.0, 0.0), CFG)
    size = size_observation(TreeCandidates(depth, length, arr), CFG)
    np.testing.assert_array_equal(arr, before)
    assert obs.shape == (CFG.depth_obs_dim,) and size.shape == (CFG.size_obs_dim,)
    assert obs.dtype == np.float32 and size.dtype == np.float32
    for vec, n in ((obs[2:], CFG.top_k), (size[2:], CFG.size_obs_probs)):
        assert np.all(np.diff(vec) <= 0)                      # sorted descending, zero padded
        expected = np.sort(arr)[::-1][:n].astype(np.float32)
        np.testing.assert_array_equal(vec[: expected.size], expected)
        assert np.all(vec[expected.size:] == 0)
    assert obs[0] == pytest.approx(min(depth, CFG.max_depth) / CFG.max_depth)
    assert obs[1] == pytest.approx(min(length / CFG.context_scale, 4.0))


def test_observations_reject_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        depth_observation(DraftStep(1, 5, np.array([0.2, np.nan]), 0, 0), CFG)
    with pytest.raises(ValueError, match="probabilities"):
        size_observation(TreeCandidates(1, 5, np.array([1.5])), CFG)
    with pytest.raises(ValueError, match=">= 0"):
        size_observation(TreeCandidates(-1, 5, np.array([0.5])), CFG)


def test_config_validation():
    with pytest.raises(ValueError, match="increasing"):
        LTDConfig(verify_sizes=(4, 4))
    with pytest.raises(ValueError):
        LTDConfig(top_k=0)
    assert LTDConfig.from_dict(CFG.to_dict()) == CFG


def test_cycle_reward_is_throughput_from_the_record():
    rec = RoundRecord(0, 0, 8, 3, 9, 2, 3, draft_time=0.006, verify_time=0.05)
    assert cycle_reward(rec) == pytest.approx(3 / 0.056)
    assert cycle_reward(rec, "throughput", 0.033) == pytest.approx(3 / 0.056 * 0.033)
    assert cycle_reward(rec, "accepted_length") == 3
    assert cycle_reward(rec, "time_cost", 0.033) == pytest.approx(-0.056 / 0.033)
    with pytest.raises(ValueError, match="unknown reward"):
        cycle_reward(rec, "speed")
    with pytest.raises(ValueError, match="zero"):
        cycle_reward(RoundRecord(0, 0, 0, 0, 1, 0, 1), "throughput")
    assert cycle_reward(rec, "net_tokens", 0.033, rate=1.5) == pytest.approx(3 - 1.5 * 0.056 / 0.033)
    with pytest.raises(ValueError, match="rate"):
        cycle_reward(rec, "net_tokens", 0.033)


def test_net_token_reward_ranks_policies_by_total_throughput():
    """Dinkelbach: with the rate set to a policy mix's throughput, the summed
    net-token reward is positive exactly for mixes with a higher total throughput,
    while the mean per-cycle ratio can rank them the other way."""
    cheap = [RoundRecord(0, 0, 1, 1, 2, 0, 1, 0.001, 0.009)] * 5 + [RoundRecord(0, 0, 9, 9, 10, 9, 10, 0.1, 0.4)]
    steady = [RoundRecord(0, 0, 2, 2, 3, 1, 2, 0.004, 0.036)] * 10

    def total(rs):
        return sum(r.tokens_per_round for r in rs) / sum(r.draft_time + r.verify_time for r in rs)

    def mean_ratio(rs):
        return sum(cycle_reward(r) for r in rs) / len(rs)

    assert total(steady) > total(cheap) and mean_ratio(cheap) > mean_ratio(steady)    # 50 > 27; 87 > 50
    rate = total(cheap) * 0.033                       # tokens per target forward of the cheap mix
    assert sum(cycle_reward(r, "net_tokens", 0.033, rate) for r in steady) > 0
    assert sum(cycle_reward(r, "net_tokens", 0.033, rate) for r in cheap) == pytest.approx(0.0, abs=1e-9)


def test_actor_shape_checks():
    depth, size = _actors()
    with pytest.raises(ValueError, match="depth_actor"):
        LTDPolicy(CFG, depth_actor=size)
    with pytest.raises(ValueError, match="size_actor"):
        LTDPolicy(CFG, size_actor=depth)
    with pytest.raises(ValueError, match="static_depth"):
        LTDPolicy(CFG, static_depth=CFG.max_depth + 1)


def test_policy_protocol_plan_and_hooks():
    depth, size = _actors()
    policy = LTDPolicy(CFG, depth, size)
    assert isinstance(policy, DraftPolicy)
    plan = policy.plan(PlanState(0, 100, None))
    assert isinstance(plan, DraftPlan) and plan.tree.top_k == CFG.top_k
    assert plan.num_draft_tokens == CFG.max_depth == plan.tree.max_depth
    assert policy.plan(PlanState(0, 100, 1)).num_draft_tokens == 0        # one token left: no room
    assert policy.plan(PlanState(0, 100, 3)).tree.max_depth == 2
    for step in _steps(30, 1):
        assert isinstance(policy.continue_drafting(step), bool)
    assert policy.continue_drafting(DraftStep(2, 10, np.ones(3), 1, 1)) is False   # cap 2 from the last plan
    for cand in _cands(30, 2):
        v = policy.verify_size(cand)
        assert 1 <= v <= cand.node_probs.size and (v in CFG.verify_sizes or v == cand.node_probs.size)
    depths, sizes = policy.decision_arrays()
    assert depths.shape == sizes.shape == (30,)


def test_static_policy_is_a_static_tree():
    policy = LTDPolicy(CFG, static_depth=3, static_verify_size=8)
    policy.plan(PlanState())
    assert [policy.continue_drafting(DraftStep(d, 5, np.ones(2), 1, 1)) for d in (1, 2, 3, 4)] == \
        [True, True, False, False]
    assert policy.verify_size(TreeCandidates(3, 5, np.full(20, 0.1))) == 8
    assert policy.verify_size(TreeCandidates(1, 5, np.full(4, 0.1))) == 4


@pytest.mark.parametrize("deterministic", [True, False])
def test_seeded_determinism_and_no_mutation(deterministic):
    runs = []
    for _ in range(2):
        depth, size = _actors(3)
        policy = LTDPolicy(CFG, depth, size, deterministic=deterministic, seed=11)
        policy.plan(PlanState())
        steps, cands = _steps(40, 5), _cands(40, 6)
        before = [s.candidate_probs.copy() for s in steps] + [c.node_probs.copy() for c in cands]
        out = [policy.continue_drafting(s) for s in steps] + [policy.verify_size(c) for c in cands]
        after = [s.candidate_probs for s in steps] + [c.node_probs for c in cands]
        for a, b in zip(before, after):
            np.testing.assert_array_equal(a, b)
        runs.append(out)
    assert runs[0] == runs[1]


def test_state_dict_round_trip():
    depth, size = _actors()
    policy = LTDPolicy(CFG, depth, size, deterministic=False, seed=4)
    policy.plan(PlanState())
    for c in _cands(5, 0):
        policy.verify_size(c)
    policy.observe(RoundRecord(0, 0, 4, 2, 5, 1, 2, 0.01, 0.03))
    state = policy.state_dict()
    other = LTDPolicy(CFG, depth, size, deterministic=False, seed=99)
    other.load_state_dict(state)
    assert other.decisions == policy.decisions and other.rounds_observed == 1
    cands = _cands(20, 8)
    assert [policy.verify_size(c) for c in cands] == [other.verify_size(c) for c in cands]


def test_save_load_by_name_and_path(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path / "cache"))
    depth, size = _actors(7)
    policy = LTDPolicy(CFG, depth, size, static_depth=4, static_verify_size=8, name="x")
    path = save_policy(policy, "mine", {"steps": 5})
    assert path == tmp_path / "cache" / "mine.pt" == policy_path("mine")
    loaded = load_policy("mine")
    assert loaded.config == CFG and loaded.meta == {"steps": 5}
    assert (loaded.static_depth, loaded.static_verify_size) == (4, 8)
    for a, b in ((depth, loaded.depth_actor), (size, loaded.size_actor)):
        for (k1, v1), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
            assert k1 == k2 and torch.equal(v1, v2)
    steps, cands = _steps(30, 1), _cands(30, 2)
    assert [policy.continue_drafting(s) for s in steps] == [loaded.continue_drafting(s) for s in steps]
    assert [policy.verify_size(c) for c in cands] == [loaded.verify_size(c) for c in cands]
    other = save_policy(LTDPolicy(CFG, None, size), tmp_path / "file.pt")
    assert load_policy(other).depth_actor is None


def test_load_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no LTD policy"):
        load_policy("does-not-exist")
    bad = tmp_path / "bad.pt"
    torch.save({"format": 1, "config": {"top_k": 2}}, bad)
    with pytest.raises(ValueError, match="not an LTD policy"):
        load_policy(bad)
    with pytest.raises(ValueError, match="empty"):
        policy_path(" ")


def test_shipped_pretrained_policy_loads_if_present():
    from specloop.ltd.policy import PRETRAINED_DIR
    files = sorted(PRETRAINED_DIR.glob("*.pt")) if PRETRAINED_DIR.is_dir() else []
    for path in files:
        policy = load_policy(path)
        assert policy.depth_actor is not None or policy.size_actor is not None
        assert math.isfinite(sum(float(p.detach().sum()) for p in (policy.depth_actor or policy.size_actor).parameters()))


def test_actor_numpy_fast_path_matches_torch_and_refreshes():
    depth, size = _actors(5)
    rng = np.random.default_rng(0)
    for actor in (depth, size):
        for _ in range(50):
            obs = rng.random(actor.obs_dim).astype(np.float32)
            assert actor.act(obs) == int(actor(torch.from_numpy(obs)).argmax())
    obs = rng.random(depth.obs_dim).astype(np.float32)
    state = {k: v.clone() for k, v in depth.state_dict().items()}
    state["action_net.bias"] = torch.tensor([0.0, 1e6]) if depth.act(obs) == 0 else torch.tensor([1e6, 0.0])
    before = depth.act(obs)
    depth.load_state_dict(state)
    assert depth.act(obs) == 1 - before
