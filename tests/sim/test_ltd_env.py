"""LTD simulator environments: gymnasium API, reward from the record, seeded
determinism, verification against the simulator's tree rounds, tiny PPO + export."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from scipy import stats

from specloop.record import RoundRecord
from specloop.ltd.env_sim import SimTreeEngine, TreeWorld, TreeWorldOptions, make_depth_env, make_size_env, run_policy
from specloop.sim.trees import simulate_tree_tables
from specloop.strategies.base import TreePlan
from specloop.ltd.policy import LTDConfig, LTDPolicy, MLPActor, cycle_reward
from specloop.ltd.train import train_ppo
from specloop.strategies.trees import DynamicTree

CFG = LTDConfig(top_k=3, max_depth=5, verify_sizes=(2, 4, 8, 12), size_obs_probs=24)


def _world(mode="sampling", **kw) -> TreeWorld:
    opts = dict(vocab_size=24, num_contexts=16, rounds_per_episode=12, mode=mode)
    opts.update(kw)
    return TreeWorld(TreeWorldOptions(**opts), CFG)


@pytest.fixture(scope="module")
def world():
    return _world()


def test_envs_pass_gymnasium_checker(world):
    check_env(make_depth_env(world=world), skip_render_check=True)
    check_env(make_size_env(world=world), skip_render_check=True)


def _rollout(env, seed, steps=80):
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out = [obs]
    for _ in range(steps):
        obs, reward, term, trunc, info = env.step(int(rng.integers(env.action_space.n)))
        out += [obs, reward, info.get("record")]
        if term or trunc:
            obs, _ = env.reset()
    return out


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


@pytest.mark.parametrize("factory", [make_depth_env, make_size_env])
def test_seeded_determinism(world, factory):
    _equal(_rollout(factory(world=world), 3), _rollout(factory(world=world), 3))
    rewards = [[x for x in _rollout(factory(world=world), seed) if isinstance(x, float)] for seed in (3, 4)]
    assert rewards[0] != rewards[1]


def test_reward_is_tokens_over_draft_plus_verify_time(world):
    env = make_size_env(world=world)
    env.reset(seed=0)
    a_time = world.cost_model.target_time
    for action in [0, 1, 2, 3, 3, 1]:
        _, reward, _, _, info = env.step(action)
        rec = RoundRecord.from_dict(info["record"])
        assert rec.num_draft_tokens <= CFG.verify_sizes[action]
        assert rec.verified_tokens == rec.num_draft_tokens + 1
        assert rec.draft_time == pytest.approx(rec.tree_depth * world.cost_model.draft_time)
        assert rec.verify_time == pytest.approx(world.cost_model.verify_seconds(rec.verified_tokens))
        assert reward == pytest.approx(rec.tokens_per_round / (rec.draft_time + rec.verify_time) * a_time)
    depth = make_depth_env(world=world, reward="accepted_length", fixed_verify_size=4)
    depth.reset(seed=1)
    _, r0, _, _, info = depth.step(1)
    assert r0 == 0.0 and info == {}
    _, r1, _, _, info = depth.step(0)
    rec = RoundRecord.from_dict(info["record"])
    assert rec.tree_depth == 2 and r1 == rec.tokens_per_round == cycle_reward(rec, "accepted_length")


def test_depth_env_forces_stop_at_max_depth(world):
    env = make_depth_env(world=world)
    obs, _ = env.reset(seed=0)
    for _ in range(CFG.max_depth - 1):
        obs, reward, _, _, info = env.step(1)
        assert reward == 0.0
    _, reward, terminated, _, info = env.step(1)
    assert RoundRecord.from_dict(info["record"]).tree_depth == CFG.max_depth and reward > 0 and terminated
    with pytest.raises(ValueError, match="reset"):
        env.step(0)


def test_bad_actions_raise(world):
    env = make_size_env(world=world)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="size action"):
        env.step(7)
    with pytest.raises(ValueError, match="unknown reward"):
        make_depth_env(world=world, reward="speed")


@pytest.mark.parametrize("depth,size", [(1, 2), (3, 4), (5, 12), (4, 8)])
def test_greedy_verification_equals_simulator_tree_rounds(depth, size):
    world = _world("greedy")
    engine = SimTreeEngine(world)
    engine.reset(np.random.default_rng(0))
    for context in range(world.options.num_contexts):
        engine.regime, engine._info, engine.depth = 1, world.tree(1, context), depth
        rec = engine.finish(size)
        plan = TreePlan(top_k=CFG.top_k, max_depth=depth, verify_size=size)
        batch = simulate_tree_tables(world.p_tables[1], world.q_tables[1], [context], plan,
                                     np.random.default_rng(1), "greedy")
        assert rec.accepted_tokens == batch.accepted[0]
        assert rec.num_draft_tokens == batch.num_nodes[0]


def test_sampling_verification_agrees_with_simulator_in_distribution():
    world = _world("sampling")
    engine = SimTreeEngine(world)
    engine.reset(np.random.default_rng(0))
    depth, size, context, n = 4, 8, 5, 3000
    mine = []
    for _ in range(n):
        engine.regime, engine._info, engine.depth = 2, world.tree(2, context), depth
        mine.append(engine.finish(size).accepted_tokens)
    plan = TreePlan(top_k=CFG.top_k, max_depth=depth, verify_size=size)
    ref = simulate_tree_tables(world.p_tables[2], world.q_tables[2], [context] * n, plan,
                               np.random.default_rng(2), "sampling").accepted
    table = np.array([np.bincount(mine, minlength=depth + 1), np.bincount(ref, minlength=depth + 1)])
    table = table[:, table.sum(axis=0) > 0]
    assert stats.chi2_contingency(table).pvalue > 1e-3


def test_run_policy_static_ltd_matches_dynamic_tree(world):
    a = run_policy(LTDPolicy(CFG, static_depth=3, static_verify_size=4), world, 2, seed=5)
    b = run_policy(DynamicTree(top_k=CFG.top_k, max_depth=3, verify_size=4), world, 2, seed=5)
    assert [r.to_dict() for r in a.trace] == [r.to_dict() for r in b.trace]
    assert set(a.depths) == {3} and a.sizes.max() <= 4
    with pytest.raises(ValueError, match="top_k"):
        run_policy(DynamicTree(top_k=CFG.top_k + 1, max_depth=3, verify_size=4), world, 1)


def test_world_validation():
    with pytest.raises(ValueError):
        TreeWorldOptions(regime_temperatures=(1.0,), regime_noise=(1.0, 2.0)).validate()
    with pytest.raises(ValueError):
        TreeWorldOptions(mode="beam").validate()
    with pytest.raises(FileNotFoundError):
        TreeWorld(TreeWorldOptions(cost_table="/nonexistent/table.json"), CFG)


@pytest.mark.parametrize("kind,factory", [("depth", make_depth_env), ("size", make_size_env)])
def test_tiny_ppo_and_exported_actor_match_sb3(world, kind, factory):
    env = factory(world=world)
    model, actor, _ = train_ppo(env, kind, 128, seed=0, n_steps=64)
    assert isinstance(actor, MLPActor)
    assert actor.hidden == ((1024,) if kind == "depth" else (1024, 256))
    obs_env = factory(world=world)
    obs, _ = obs_env.reset(seed=9)
    rng = np.random.default_rng(0)
    for _ in range(60):
        sb3_action, _ = model.predict(obs, deterministic=True)
        assert actor.act(obs) == int(sb3_action)
        obs, _, term, trunc, _ = obs_env.step(int(rng.integers(obs_env.action_space.n)))
        if term or trunc:
            obs, _ = obs_env.reset()


def test_fine_tune_continues_from_the_policy_and_leaves_it_untouched(world):
    """`fine_tune` (LTD's transfer step) starts PPO from the policy's weights, keeps
    its config and static fallbacks, trains depth then size per round, and does not
    change the policy it was given."""
    import torch

    from specloop.ltd.env_sim import SimTreeEngine
    from specloop.ltd.train import fine_tune

    depth = train_ppo(make_depth_env(world=world), "depth", 64, seed=0, n_steps=32)[1]
    size = train_ppo(make_size_env(world=world), "size", 64, seed=1, n_steps=32)[1]
    policy = LTDPolicy(CFG, depth, size, static_verify_size=4, name="base")
    before = [t.clone() for t in (*depth.state_dict().values(), *size.state_dict().values())]
    # 64 steps = two PPO updates of 32: the linear decay makes the last update's learning rate 0
    tuned, stages = fine_tune(policy, lambda: SimTreeEngine(world), 64, 64, rounds=2, seed=3, n_steps=32,
                              log=lambda _: None)
    assert [s["kind"] for s in stages] == ["depth", "size", "depth", "size"]
    assert tuned.config == CFG and tuned.static_verify_size == 4 and tuned.static_depth == policy.static_depth
    after = [*depth.state_dict().values(), *size.state_dict().values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "the given policy's actors changed"
    moved = [not torch.equal(a, b) for a, b in zip(depth.state_dict().values(), tuned.depth_actor.state_dict().values())]
    assert any(moved), "fine-tuning did not update the depth actor"
    with pytest.raises(ValueError, match="static"):
        fine_tune(LTDPolicy(CFG, static_depth=2, static_verify_size=4), lambda: SimTreeEngine(world), 32, 32)
    with pytest.raises(ValueError, match="rounds"):
        fine_tune(policy, lambda: SimTreeEngine(world), 32, 32, rounds=0)
