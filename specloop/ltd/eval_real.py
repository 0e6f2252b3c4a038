"""LTD (Learning To Draft, ICLR 2026) on the real decoder: evaluation, fine-tuning
and recording with typed configs; the back ends of ``specloop ltd eval|train
--env real`` and ``specloop ltd record``.

* `real_eval`: static trees grid-searched on HumanEval warm-up prompts, then on
  held-out prompts the best static tree, LTD and its ablations and the transfer row
  (`RealEvalConfig`), wall clock, device synchronised
  (`specloop.ltd.env_real.RealHarness`).
* `fine_tune_real`: fine-tunes a (sim-trained) policy in the real-decoder
  gymnasium environments (`RealFineTuneConfig`).
* `record_real`: records every position's draft tree and target tokens for the
  replay (`specloop.ltd.record.record_replay`, `RecordConfig`).

The target comes from the config (`RealLTDSetup.target`, default the first name of
the model registry, `specloop.realmodels.loading.registry_names`). Rows and grid
search: `specloop.ltd.evaluate`.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specloop.ltd.evaluate import (ablation_policies, add_named_policies, evaluate_rows, grid_search_static,
                                   load_optional, replay_ltd_config)

__all__ = ["default_target", "RealLTDSetup", "prompt_ids", "build_harness", "RealEvalConfig", "real_eval",
           "real_overhead", "RealFineTuneConfig", "fine_tune_real", "RecordConfig", "record_real",
           "REAL_GRID_DEPTHS"]

REAL_GRID_DEPTHS = (1, 2, 3, 4, 5, 6, 8)   # V: the config's sizes >= 4
HOOKS = ("native", "emulated")


def default_target() -> str:
    """The model registry's embedded default target (its first name)."""
    from specloop.realmodels.loading import registry_names
    return registry_names()[0]


@dataclass(frozen=True)
class RealLTDSetup:
    """Target, drafter and prompts of an LTD run on the real decoder.

    Attributes:
        target: registry name, HF id or local path (default `default_target`).
        drafter: EAGLE-2 tree drafter name (`specloop.realmodels.registry.drafters`).
        dtype: target dtype ("bfloat16": the simulator's cost column; "float32"
            for exactness).
        prompts: HumanEval prompts per pass.
        max_new_tokens: tokens generated per prompt.
        seed: torch / decoder seed.
    """

    target: str = field(default_factory=default_target)
    drafter: str = "eagle"
    dtype: str = "bfloat16"
    prompts: int = 8
    max_new_tokens: int = 64
    seed: int = 0


def prompt_ids(target, split: str, count: int) -> list[torch.Tensor]:
    """The first ``count`` HumanEval prompts of ``split`` ("warmup" / "heldout") as
    int64 token-id tensors of ``target`` (a `LoadedModel`)."""
    from specloop.data.prompts import load_prompts
    prompts = load_prompts("humaneval", split, count)
    return [torch.tensor(target.tokenizer(p.text)["input_ids"], dtype=torch.long) for p in prompts]


def build_harness(setup: RealLTDSetup, config, split: str, native: bool = False):
    """A `RealHarness` of ``setup``'s target and drafter on ``split``'s prompts
    (``config``: `LTDConfig`; ``native``: the drafter's own hooks, else emulated).

    Raises:
        FileNotFoundError: the target's package or the drafter's checkpoint is missing.
    """
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.loading import load_model
    from specloop.ltd.env_real import RealHarness

    torch.manual_seed(setup.seed)
    target = load_model(setup.target, dtype=setup.dtype)
    base = make_drafter(setup.drafter, target, train_if_missing=False, progress=False, dtype=setup.dtype)
    return RealHarness(target, base, prompt_ids(target, split, setup.prompts), config, setup.max_new_tokens,
                       seed=setup.seed, native=native)


@dataclass(frozen=True)
class RealEvalConfig:
    """``ltd eval --env real``.

    Attributes:
        setup: target, drafter, prompts (`RealLTDSetup`).
        out: folder of the grid file ``ltd_grid_real.json``.
        policy: LTD policy name or path (its ``-independent`` variant beside it).
        fine_tuned: the transfer row's policy (a row only when it exists).
        extra_policies: policy names / paths evaluated as extra rows.
        hooks: "native" (the drafter stops and sizes itself; all wall clock) or
            "emulated" (draft to the cap, charge calibrated layer costs).
        repeats: passes over the prompts, the policies interleaved in each.
        paired: run the policies back to back per prompt (paired speed ratios).
        grid_pairs: (D, V) candidates of the static grid (e.g.
            `specloop.ltd.eval_sim.replay_grid_pairs`); None = the full grid.
        reuse_grid: reuse ``out/ltd_grid_real.json`` when it exists.
        grid_only: only grid-search (and save) the static trees.
    """

    setup: RealLTDSetup = field(default_factory=RealLTDSetup)
    out: Path = Path("results/ltd")
    policy: str = "ltd-sim"
    fine_tuned: str = "ltd-real"
    extra_policies: tuple[str, ...] = ()
    hooks: str = "native"
    repeats: int = 1
    paired: bool = False
    grid_pairs: tuple[tuple[int, int], ...] | None = None
    reuse_grid: bool = False
    grid_only: bool = False

    def __post_init__(self):
        if self.hooks not in HOOKS:
            raise ValueError(f"hooks must be one of {HOOKS}, got {self.hooks!r}")


def _static_grid(config: RealEvalConfig, ltd_config) -> tuple[dict, list[dict]]:
    """The grid-best static tree and the grid, measured on warm-up prompts (or read
    from ``out/ltd_grid_real.json`` with ``reuse_grid``); saves the grid file."""
    grid_file = Path(config.out) / "ltd_grid_real.json"
    if config.reuse_grid and grid_file.is_file():
        saved = json.loads(grid_file.read_text())
        return saved["best"], saved["grid"]
    tune = build_harness(config.setup, ltd_config, "warmup", native=config.hooks == "native")
    if config.grid_pairs:
        best, grid = grid_search_static(lambda p: tune.run(p), ltd_config, pairs=config.grid_pairs)
    else:
        depths = [d for d in REAL_GRID_DEPTHS if d <= tune.max_depth]
        best, grid = grid_search_static(lambda p: tune.run(p), ltd_config, depths,
                                        [s for s in ltd_config.verify_sizes if s >= 4])
    grid_file.parent.mkdir(parents=True, exist_ok=True)
    grid_file.write_text(json.dumps({"best": best, "grid": grid, "prompts": config.setup.prompts,
                                     "max_new_tokens": config.setup.max_new_tokens, "dtype": config.setup.dtype},
                                    indent=2))
    return best, grid


def real_eval(config: RealEvalConfig, ltd_config=None) -> tuple[dict | None, dict | None]:
    """Rows of ``ltd eval --env real``: the grid-best static tree first (every row
    is measured against it in the same passes), LTD, its ablations, the extra rows
    and the transfer row; ``ltd_config`` (`LTDConfig`, default its defaults) is the
    static grid's config.

    Returns:
        (result, decisions), or (None, None) with ``grid_only``. Rows add
        speedup_vs_autoregressive; result has env, policy, rows, best_static,
        grid, policy_overhead, autoregressive_step_s (s), layer_costs_s, prompts,
        max_new_tokens, dtype, drafter, hooks, repeats, grid_pairs.

    Raises:
        FileNotFoundError: a policy, the target's package or the drafter is missing.
    """
    from specloop.ltd.policy import LTDConfig, fine_tuned_label, load_policy, variant_name

    best, grid = _static_grid(config, ltd_config or LTDConfig())
    if config.grid_only:
        return None, None
    name = config.policy
    ltd = load_policy(name)
    harness = build_harness(config.setup, ltd.config, "heldout", native=config.hooks == "native")
    policies = add_named_policies(ablation_policies(ltd, load_optional(variant_name(name, "-independent")), best),
                                  config.extra_policies)
    tuned_name = config.fine_tuned or "ltd-real"
    tuned = load_optional(tuned_name)
    if tuned is not None:
        policies[fine_tuned_label(tuned_name)] = tuned
    rows, decisions = evaluate_rows(harness.run, policies, None, repeats=config.repeats,
                                    prompts=harness.prompts, paired=config.paired)
    for row in rows:
        row["speedup_vs_autoregressive"] = row["tokens_per_s"] * harness.target_time
    setup = config.setup
    return ({"env": "real", "policy": name, "rows": rows, "best_static": best, "grid": grid,
             "policy_overhead": real_overhead(harness, ltd), "autoregressive_step_s": harness.target_time,
             "layer_costs_s": harness.layer_costs.tolist(), "prompts": setup.prompts,
             "max_new_tokens": setup.max_new_tokens, "dtype": setup.dtype, "drafter": setup.drafter,
             "hooks": "native" if harness.native else "emulated", "repeats": config.repeats,
             "grid_pairs": None if config.grid_pairs is None else list(config.grid_pairs)},
            decisions)


class _TimedPolicy:
    """Wraps a policy and accumulates the wall seconds of its hooks."""

    def __init__(self, policy):
        self.policy, self.seconds = policy, 0.0

    def plan(self, state):
        return self.policy.plan(state)

    def observe(self, record):
        self.policy.observe(record)

    def continue_drafting(self, step):
        t0 = time.perf_counter()
        out = self.policy.continue_drafting(step)
        self.seconds += time.perf_counter() - t0
        return out

    def verify_size(self, cands):
        t0 = time.perf_counter()
        out = self.policy.verify_size(cands)
        self.seconds += time.perf_counter() - t0
        return out


def real_overhead(harness, policy) -> dict:
    """Measured seconds of the policy's decisions per round vs the round time, on
    the harness's first two prompts: policy_seconds_per_round, round_seconds (s),
    overhead_fraction."""
    timed = _TimedPolicy(policy)
    trace, _, _ = harness.run(timed, harness.prompts[:2])
    round_time = trace.total_time / len(trace)
    per_round = timed.seconds / len(trace)
    return {"policy_seconds_per_round": per_round, "round_seconds": round_time,
            "overhead_fraction": per_round / round_time}


@dataclass(frozen=True)
class RealFineTuneConfig:
    """``ltd train --env real``: one alternation of ``co_depth_steps`` /
    ``co_size_steps`` env steps (PPO rollouts of ``n_steps``; default the smaller
    budget, at most 2048) on warm-up prompts, rewards from the wall clock."""

    setup: RealLTDSetup = field(default_factory=RealLTDSetup)
    co_depth_steps: int = 12_288
    co_size_steps: int = 8_192
    n_steps: int | None = None
    reward: str = "throughput"


def fine_tune_real(policy, config: RealFineTuneConfig):
    """Fine-tune a (sim-trained) `LTDPolicy` on the real decoder
    (`specloop.ltd.train.fine_tune` over `RealTreeEngine`s).
    Returns (the tuned policy, named ``ltd-real``, and the training log)."""
    from specloop.ltd.env_real import RealTreeEngine
    from specloop.ltd.train import fine_tune as fine_tune_policy

    harness = build_harness(config.setup, policy.config, "warmup")
    engines = []

    def make_engine():
        engines.append(RealTreeEngine(harness))
        return engines[-1]

    steps = [s for s in (config.co_depth_steps, config.co_size_steps) if s > 0] or [2048]
    n_steps = config.n_steps or min(2048, *steps)
    try:
        tuned, log = fine_tune_policy(policy, make_engine, config.co_depth_steps, config.co_size_steps, rounds=1,
                                      seed=config.setup.seed, reward=config.reward, n_steps=n_steps)
    finally:
        for engine in engines:
            engine.close()
    tuned.name = "ltd-real"
    return tuned, log


@dataclass(frozen=True)
class RecordConfig:
    """``ltd record``: every position's draft tree (top ``top_k`` EAGLE-2 tree to
    ``max_depth``, at most ``max_verify`` nodes replayable) on the real decoder.

    Attributes:
        out: the recording directory (resumable: prompts on disk are skipped).
        split: HumanEval split of the prompts. costs_from: a recording whose
            ``costs.json`` is copied instead of timing. cost_repeats / cost_tokens:
            timed passes and tokens per setting of the cost tables. setup: target,
            drafter (default eagle3), dtype, prompts, max_new_tokens.
    """

    out: Path
    setup: RealLTDSetup = field(default_factory=lambda: RealLTDSetup(drafter="eagle3"))
    split: str = "warmup"
    max_depth: int = 8
    max_verify: int = 48
    top_k: int = 6
    costs_from: Path | None = None
    cost_repeats: int = 3
    cost_tokens: int = 32


def record_real(config: RecordConfig, progress: Callable[[int, int], None] | None = None) -> int:
    """Record ``config.setup.prompts`` prompts into ``config.out``; ``progress(done,
    total)`` after each. Returns the number of prompts.

    Raises:
        ValueError: the recording on disk was made with other settings (checked
            before any model is loaded).
    """
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.loading import load_model
    from specloop.ltd.record import check_resumable, record_replay

    setup = config.setup
    check_resumable(config.out, max_depth=config.max_depth, max_verify=config.max_verify,
                    max_new_tokens=setup.max_new_tokens, top_k=config.top_k, drafter=setup.drafter,
                    dtype=setup.dtype)    # before loading
    target = load_model(setup.target, dtype=setup.dtype)
    drafter = make_drafter(setup.drafter, target, train_if_missing=False, progress=False, dtype=setup.dtype)
    prompts = prompt_ids(target, config.split, setup.prompts)
    if progress is not None:
        progress(0, len(prompts))
    record_replay(target, drafter, prompts, config.out, replay_ltd_config(config.top_k, config.max_depth,
                                                                          config.max_verify),
                  max_depth=config.max_depth, max_verify=config.max_verify, max_new_tokens=setup.max_new_tokens,
                  progress=progress, costs_from=config.costs_from, repeats=config.cost_repeats,
                  draft_tokens=config.cost_tokens)
    return len(prompts)
