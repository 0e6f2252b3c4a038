"""The LTD replay environment over recorded rounds (`specloop.ltd.env_replay`), on
synthetic recordings whose greedy output is known: a round accepts the longest
prefix of the true continuation present as a kept path."""
from __future__ import annotations

import json

import numpy as np
import pytest
from gymnasium.utils import env_checker

from specloop.ltd.evaluate import grid_search_static
from specloop.ltd.env_replay import (ReplayTreeEngine, accepted_path, load_replay, oracle_tokens_per_second,
                                     run_replay_policy)
from specloop.ltd.policy import LTDConfig, LTDPolicy
from specloop.strategies.subtree import select_subtree
from specloop.ltd.train import DepthEnv, SizeEnv

CFG = LTDConfig(top_k=3, max_depth=4, verify_sizes=(2, 4, 8), size_obs_probs=16)
VOCAB = 20


def _tree(rng, truth: np.ndarray, top_k: int, max_depth: int):
    """An EAGLE-2-shaped tree (top_k roots, top_k children of the best top_k nodes
    per layer) whose nodes sometimes continue ``truth``; target_next = the true next
    token on the true path, a random token elsewhere."""
    tokens, parents, depths, probs, on_path = [], [], [], [], []
    frontier = [(-1, 1.0, True)]
    for depth in range(1, max_depth + 1):
        layer = []
        for node, prob, good in frontier:
            kids = rng.choice(VOCAB, size=top_k, replace=False)
            if good and depth <= truth.size and rng.random() < 0.7 and truth[depth - 1] not in kids:
                kids[rng.integers(top_k)] = truth[depth - 1]
            cond = np.sort(rng.dirichlet(np.ones(top_k)))[::-1]
            for tok, c in zip(kids, cond):
                tokens.append(int(tok))
                parents.append(node)
                depths.append(depth)
                probs.append(prob * float(c))
                on_path.append(good and depth <= truth.size and tok == truth[depth - 1])
                layer.append((len(tokens) - 1, prob * float(c), on_path[-1]))
        frontier = sorted(layer, key=lambda x: -x[1])[:top_k]
    target_next = np.array([int(truth[d]) if good and d < truth.size else int(rng.integers(VOCAB))
                            for d, good in zip(depths, on_path)], dtype=np.int64)
    return (np.array(tokens, np.int64), np.array(parents, np.int64), np.array(depths, np.int64),
            np.array(probs), target_next)


def write_replay(tmp_path, prompts: int = 3, positions: int = 25, seed: int = 0, max_verify: int = 8):
    """A synthetic recording in ``tmp_path``; returns each prompt's true text."""
    rng = np.random.default_rng(seed)
    outputs = []
    for p in range(prompts):
        out = rng.integers(VOCAB, size=positions + CFG.max_depth + 1)   # the target's text runs on
        outputs.append(out)
        arrays = {k: [] for k in ("tokens", "parents", "depths", "probs", "target_next")}
        offsets = [0]
        for t in range(positions):
            tree = _tree(rng, out[t:], CFG.top_k, CFG.max_depth)
            for key, arr in zip(arrays, tree):
                arrays[key].append(arr)
            offsets.append(offsets[-1] + tree[0].size)
        data = {k: np.concatenate(v) for k, v in arrays.items()}
        np.savez(tmp_path / f"prompt-{p:04d}.npz", node_offsets=np.array(offsets), root_next=out[:positions],
                 context_length=np.arange(positions) + 10, prompt_ids=np.arange(10), **data)
    costs = {"verify_seconds": [0.0] + [0.04 + 0.001 * n for n in range(1, max_verify + 2)],
             "layer_seconds": [0.0, 0.004, 0.008, 0.012, 0.016], "round_overhead_s": 0.001,
             "autoregressive_step_s": 0.041, "max_depth": CFG.max_depth, "max_verify": max_verify,
             "config": {"top_k": CFG.top_k}}
    (tmp_path / "costs.json").write_text(json.dumps(costs))
    return outputs


@pytest.fixture()
def replay(tmp_path):
    outputs = write_replay(tmp_path)
    return load_replay(tmp_path), outputs


def _longest_kept_prefix(tokens, parents, keep, truth) -> int:
    kept, node, n = set(int(i) for i in keep), -1, 0
    while n < truth.size:
        hits = [i for i in kept if parents[i] == node and tokens[i] == truth[n]]
        if not hits:
            break
        node, n = hits[0], n + 1
    return n


def test_accepted_path_is_the_longest_kept_prefix_of_the_truth(replay):
    data, outputs = replay
    for prompt, out in zip(data.prompts, outputs):
        for t in range(prompt.positions):
            tokens, parents, depths, probs, target_next = prompt.tree(t)
            for depth in (1, 2, 4):
                for size in (1, 3, 8):
                    keep = select_subtree(depths, parents, probs, depth, size)
                    got = accepted_path(parents, tokens, target_next, int(prompt.root_next[t]), keep)
                    assert got == _longest_kept_prefix(tokens, parents, keep, out[t:])


@pytest.mark.parametrize("depth,size", [(1, 2), (3, 4), (4, 8)])
def test_static_replay_commits_the_recorded_output_once(replay, depth, size):
    data, outputs = replay
    trace, depths, sizes = run_replay_policy(LTDPolicy(CFG, static_depth=depth, static_verify_size=size), data, CFG)
    for index, out in enumerate(outputs):
        rounds = [r for r in trace if r.stream_index == index]
        assert sum(r.tokens_per_round for r in rounds) == data.prompts[index].positions
        assert all(r.accepted_tokens == r.tokens_per_round - 1 for r in rounds[:-1])
    assert (depths <= depth).all() and (sizes <= size).all()
    for r in trace:
        assert r.draft_time == pytest.approx(data.layer_seconds[r.tree_depth])
        assert r.verify_time == pytest.approx(data.verify_seconds[r.verified_tokens])
        assert r.verified_tokens == r.num_draft_tokens + 1 and r.update_time == data.round_overhead_s


def test_last_position_is_a_plain_round(replay):
    data, _ = replay
    engine = ReplayTreeEngine(data, CFG)
    engine.reset(np.random.default_rng(0), prompt=0)
    engine.position = data.prompts[0].positions - 1
    engine.begin_round()
    engine.deepen()
    record = engine.finish(8)
    assert (record.num_draft_tokens, record.tree_depth, record.tokens_per_round) == (0, 0, 1)
    assert engine.episode_done


def test_replay_is_deterministic_and_leaves_the_data_alone(replay):
    data, _ = replay
    before = [p.probs.copy() for p in data.prompts]

    def grid():
        return grid_search_static(lambda p: run_replay_policy(p, data, CFG), CFG, [1, 2], [2, 8])

    first = grid()
    assert first == grid()
    assert all(np.array_equal(a, p.probs) for a, p in zip(before, data.prompts))
    assert oracle_tokens_per_second(data, CFG) > 0


def test_gym_envs_over_the_replay_pass_the_checker(replay):
    data, _ = replay
    for env in (DepthEnv(ReplayTreeEngine(data, CFG), fixed_verify_size=4), SizeEnv(ReplayTreeEngine(data, CFG))):
        env_checker.check_env(env, skip_render_check=True)
        obs, _ = env.reset(seed=1)
        assert obs.shape == env.observation_space.shape


def test_bad_recordings_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no recorded prompts"):
        load_replay(tmp_path / "missing")
    write_replay(tmp_path, prompts=1, positions=3)
    (tmp_path / "costs.json").unlink()
    with pytest.raises(FileNotFoundError, match="costs.json"):
        load_replay(tmp_path)
    write_replay(tmp_path, prompts=1, positions=3)
    with np.load(tmp_path / "prompt-0000.npz") as f:
        arrays = dict(f)
    arrays["probs"] = arrays["probs"] * 3.0
    np.savez(tmp_path / "prompt-0000.npz", **arrays)
    with pytest.raises(ValueError, match="outside"):
        load_replay(tmp_path)
    arrays["probs"] = arrays["probs"][:-1]
    np.savez(tmp_path / "prompt-0000.npz", **arrays)
    with pytest.raises(ValueError, match="lengths"):
        load_replay(tmp_path)


def test_verify_sizes_beyond_the_recording_are_refused(tmp_path):
    write_replay(tmp_path, prompts=1, positions=4, max_verify=4)
    data = load_replay(tmp_path)
    with pytest.raises(ValueError, match="max_verify"):
        ReplayTreeEngine(data, CFG)            # CFG verifies up to 8 nodes
    engine = ReplayTreeEngine(data, LTDConfig(top_k=3, max_depth=4, verify_sizes=(2, 4), size_obs_probs=16))
    engine.reset(np.random.default_rng(0))
    engine.begin_round()
    with pytest.raises(ValueError, match="verify_size"):
        engine.finish(5)
