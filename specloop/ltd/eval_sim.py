"""LTD (Learning To Draft, ICLR 2026) evaluation in the simulator and on recorded
real rounds: the back ends of ``specloop ltd eval --env sim|replay``.

* `sim_eval`: static trees grid-searched (D, V) on separate tuning episodes of the
  simulated tree world (`specloop.ltd.env_sim`), then on the evaluation episodes
  the best static tree, LTD, its ablations and the reward ablation, plus the
  measured per-decision overhead of the exported actors.
* `replay_eval`: the same rows on a recording of the real decoder
  (`specloop.ltd.env_replay`), grid-searched on a tuning recording, with the
  held-out grid's best static tree and the clairvoyant per-round oracle.
* `replay_grid_pairs`: the best static trees of a recording, which the real
  evaluation re-measures (`specloop.ltd.eval_real.RealEvalConfig.grid_pairs`).

Rows and grid search: `specloop.ltd.evaluate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specloop.ltd.evaluate import (ablation_policies, add_named_policies, evaluate_rows, grid_search_static,
                                   load_optional, replay_ltd_config)

__all__ = ["SimEvalConfig", "sim_eval", "sim_overhead", "ReplayEvalConfig", "replay_eval", "replay_config",
           "replay_grid_pairs"]


@dataclass(frozen=True)
class SimEvalConfig:
    """``ltd eval --env sim``.

    Attributes:
        policy: LTD policy name or file path; its variants (``-independent``,
            ``-size-<reward>``) are looked up beside it.
        episodes: evaluation prompts (episodes); the grid search tunes on
            max(8, episodes // 3) other episodes.
        seed: evaluation seed (the tuning episodes use seed + 1000).
        extra_policies: policy names / paths evaluated as extra rows.
    """

    policy: str = "ltd-sim"
    episodes: int = 48
    seed: int = 0
    extra_policies: tuple[str, ...] = ()


def sim_eval(config: SimEvalConfig) -> tuple[dict, dict]:
    """Rows of ``ltd eval --env sim``.

    Returns:
        (result, decisions): result has env, policy, rows, best_static, grid,
        policy_overhead, cost_source, episodes, rounds_per_episode; decisions maps
        each row's label to (depths, sizes, tokens_per_round) per cycle.

    Raises:
        FileNotFoundError: the policy (or an extra policy) does not exist.
    """
    from specloop.ltd.env_sim import TreeWorld, run_policy
    from specloop.ltd.policy import REWARDS, LTDPolicy, load_policy, variant_name

    name = config.policy
    ltd = load_policy(name)
    world = TreeWorld(config=ltd.config)

    def runner(seed, episodes):
        def run(policy):
            res = run_policy(policy, world, episodes, seed=seed)
            return res.trace, res.depths, res.sizes
        return run

    best, grid = grid_search_static(runner(config.seed + 1000, max(8, config.episodes // 3)), ltd.config)
    run = runner(config.seed, config.episodes)
    best_tps = run(LTDPolicy(ltd.config, static_depth=best["depth"], static_verify_size=best["verify_size"]))[0] \
        .tokens_per_second()
    independent = load_optional(variant_name(name, "-independent"))
    policies = ablation_policies(ltd, independent, best)
    for reward in REWARDS:
        ablation = load_optional(variant_name(name, f"-size-{reward}"))
        if ablation is not None:
            policies[f"reward={reward} (size-only)"] = LTDPolicy(ltd.config, None, ablation.size_actor,
                                                                 static_depth=best["depth"])
    if independent is not None and independent.size_actor is not None:   # trained alone, throughput reward
        policies["reward=throughput (size-only)"] = LTDPolicy(ltd.config, None, independent.size_actor,
                                                              static_depth=best["depth"])
    add_named_policies(policies, config.extra_policies)
    rows, decisions = evaluate_rows(run, policies, best_tps)
    overhead = sim_overhead(ltd, world, config.seed)
    result = {"env": "sim", "policy": name, "rows": rows, "best_static": best, "grid": grid,
              "policy_overhead": overhead, "cost_source": world.cost_source,
              "episodes": config.episodes, "rounds_per_episode": world.options.rounds_per_episode}
    return result, decisions


def sim_overhead(ltd, world, seed: int) -> dict:
    """Measured seconds of the exported actors per decision vs the simulated round
    time: policy_seconds_per_round, round_seconds (s) and overhead_fraction."""
    from specloop.ltd.env_sim import run_policy

    res = run_policy(ltd, world, 4, seed=seed, charge_policy_time=False)
    round_time = res.trace.total_time / len(res.trace)
    per_round = res.policy_seconds / len(res.trace)
    return {"policy_seconds_per_round": per_round, "round_seconds": round_time,
            "overhead_fraction": per_round / round_time}


def replay_config(data):
    """The `LTDConfig` a recording (`specloop.ltd.env_replay.ReplayData`) supports:
    its top_k and max_depth, V up to its max_verify."""
    return replay_ltd_config(int(data.meta.get("config", {}).get("top_k", 6)), data.max_depth, data.max_verify)


def replay_grid_pairs(recording: str | Path, top: int) -> list[tuple[int, int]]:
    """The ``top`` best static (D, V) of the full grid on ``recording`` (priced by
    its measured costs), best first.

    Raises:
        ValueError: top < 1. FileNotFoundError: no such recording.
    """
    from specloop.ltd.env_replay import load_replay, run_replay_policy

    if top < 1:
        raise ValueError(f"--grid-top must be >= 1, got {top}")
    data = load_replay(recording)
    config = replay_config(data)
    _, rows = grid_search_static(lambda p: run_replay_policy(p, data, config), config)
    rows.sort(key=lambda r: -r["tokens_per_s"])
    return [(r["depth"], r["verify_size"]) for r in rows[:top]]


@dataclass(frozen=True)
class ReplayEvalConfig:
    """``ltd eval --env replay``.

    Attributes:
        tune_replay: recording the static trees are grid-searched on.
        replay: recording the rows are evaluated on (held-out prompts).
        policy: LTD policy name or path (its ``-independent`` variant beside it).
        fine_tuned: the transfer row's policy (skipped when None or missing).
        extra_policies: policy names / paths evaluated as extra rows.
    """

    tune_replay: Path
    replay: Path
    policy: str = "ltd-replay"
    fine_tuned: str | None = "ltd-real"
    extra_policies: tuple[str, ...] = ()


def replay_eval(config: ReplayEvalConfig) -> tuple[dict, dict]:
    """Rows of ``ltd eval --env replay``: the tuning grid's best static tree first
    (rows are relative to it), LTD, its ablations, the extra and transfer rows.

    Returns:
        (result, decisions): result has env, policy, rows, best_static, grid,
        heldout_best_static, oracle_tokens_per_s, oracle_vs_best_static,
        autoregressive_step_s (s), prompts, tune_prompts.

    Raises:
        FileNotFoundError: a recording or the policy does not exist.
    """
    from specloop.ltd.env_replay import load_replay, oracle_tokens_per_second, run_replay_policy
    from specloop.ltd.policy import fine_tuned_label, load_policy, variant_name

    name = config.policy
    ltd = load_policy(name)
    tune = load_replay(config.tune_replay)
    held = load_replay(config.replay)
    ltd_config = ltd.config
    best, grid = grid_search_static(lambda p: run_replay_policy(p, tune, ltd_config), ltd_config)

    def run(policy):
        return run_replay_policy(policy, held, ltd_config)

    policies = add_named_policies(ablation_policies(ltd, load_optional(variant_name(name, "-independent")), best),
                                  config.extra_policies)
    tuned = load_optional(config.fine_tuned) if config.fine_tuned else None
    if tuned is not None:
        policies[fine_tuned_label(config.fine_tuned)] = tuned
    rows, decisions = evaluate_rows(run, policies, None)
    best_tps = rows[0]["tokens_per_s"]
    held_best = max(grid_search_static(run, ltd_config)[1], key=lambda r: r["tokens_per_s"])
    oracle = oracle_tokens_per_second(held, ltd_config)
    return ({"env": "replay", "policy": name, "rows": rows, "best_static": best, "grid": grid,
             "heldout_best_static": held_best, "oracle_tokens_per_s": oracle,
             "oracle_vs_best_static": oracle / best_tps,
             "autoregressive_step_s": held.autoregressive_step_s,
             "prompts": len(held.prompts), "tune_prompts": len(tune.prompts)}, decisions)
