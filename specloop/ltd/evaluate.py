"""LTD evaluation over any engine: grid search of static trees, evaluation rows
(pooled or paired), the ablation set and the saved outputs of ``specloop ltd eval``.

Learning To Draft (LTD, ICLR 2026) compares its co-trained depth and size
policies with the best static tree found by a grid search over (depth D, verify
size V) and with its ablations (depth-only, size-only, the independently trained
pair, the reward ablation). Everything here is written against a ``run``
callable, so the simulator (`specloop.ltd.eval_sim`), the replay of recorded
rounds and the real decoder (`specloop.ltd.eval_real`) share it:

* ``run(policy) -> (trace, depths, sizes)``: one evaluation pass of a policy; a
  `specloop.record.Trace` and, per round, the tree depth D and verify size V
  (int arrays, one entry per round);
* the paired design calls ``run(policy, [prompt])`` instead (one prompt at a time).

Strategies see no models and no simulator: the callable is all this module knows.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from specloop.record import Trace

__all__ = ["grid_search_static", "evaluate_rows", "evaluate_rows_paired", "per_episode_tokens_per_s",
           "ablation_policies", "load_optional", "add_named_policies", "parse_policy_names", "save_eval",
           "REPLAY_VERIFY_SIZES", "replay_ltd_config"]

# (policy) -> (trace, depth per round, V per round); the paired design passes [prompt] too
Runner = Callable[..., tuple]

# LTDConfig.verify_sizes of replay-trained policies (capped at the recording's max_verify)
REPLAY_VERIFY_SIZES = (2, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48)


def replay_ltd_config(top_k: int, max_depth: int, max_verify: int):
    """The `LTDConfig` a recording of top-``top_k`` trees to depth ``max_depth`` with
    at most ``max_verify`` verified nodes supports: V from `REPLAY_VERIFY_SIZES` up
    to ``max_verify``."""
    from specloop.ltd.policy import LTDConfig

    sizes = tuple(v for v in REPLAY_VERIFY_SIZES if v <= max_verify)
    return LTDConfig(top_k=top_k, max_depth=max_depth, verify_sizes=sizes)


def grid_search_static(run: Runner, config, depths: Iterable[int] | None = None, sizes: Iterable[int] | None = None,
                       pairs: Sequence[tuple[int, int]] | None = None) -> tuple[dict, list[dict]]:
    """Best static tree (D, V) by tokens/s.

    Args:
        run: ``run(policy) -> (trace, depths, sizes)``.
        config: the `specloop.ltd.policy.LTDConfig` of the static policies.
        depths, sizes: the grid (default: 1..config.max_depth x config.verify_sizes).
        pairs: the (D, V) pairs to try instead of a grid.

    Returns:
        (best row, all rows); a row has depth, verify_size, tokens_per_s and
        mean_accepted_length (tokens per round).
    """
    from specloop.ltd.policy import LTDPolicy

    if pairs is None:
        pairs = [(d, v) for d in depths or range(1, config.max_depth + 1) for v in sizes or config.verify_sizes]
    rows = []
    for depth, size in pairs:
        trace, _, _ = run(LTDPolicy(config, static_depth=int(depth), static_verify_size=int(size)))
        rows.append({"depth": int(depth), "verify_size": int(size), "tokens_per_s": trace.tokens_per_second(),
                     "mean_accepted_length": trace.mean_accepted_length()})
    return max(rows, key=lambda r: r["tokens_per_s"]), rows


def ablation_policies(ltd, independent, best: dict) -> dict:
    """The rows of LTD's ablation, the grid-best static tree first: static tree,
    LTD (co-trained), depth-only (size static at the best V), size-only (depth
    static at the best D) and, when ``independent`` is not None, the independently
    trained pair. ``ltd``: an `LTDPolicy`; ``best``: a `grid_search_static` row."""
    from specloop.ltd.policy import LTDPolicy

    cfg, d, v = ltd.config, best["depth"], best["verify_size"]
    out = {f"static D={d} V={v} (grid best)": LTDPolicy(cfg, static_depth=d, static_verify_size=v),
           "LTD (co-trained)": ltd,
           "depth-only (size static)": LTDPolicy(cfg, ltd.depth_actor, None, static_verify_size=v),
           "size-only (depth static)": LTDPolicy(cfg, None, ltd.size_actor, static_depth=d)}
    if independent is not None:
        out["independent (not co-trained)"] = independent
    return out


def load_optional(name):
    """`specloop.ltd.policy.load_policy` of ``name``, or None when there is no such policy."""
    from specloop.ltd.policy import load_policy

    try:
        return load_policy(name)
    except FileNotFoundError:
        return None


def parse_policy_names(text: str | None) -> tuple[str, ...]:
    """Comma-separated policy names / paths -> a tuple (blanks dropped)."""
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


def add_named_policies(policies: dict, names: Iterable[str]) -> dict:
    """Add each named policy (loaded by name or path; FileNotFoundError when missing)
    as a row labelled by its name; returns ``policies``."""
    from specloop.ltd.policy import load_policy

    for name in names:
        policies[name] = load_policy(name)
    return policies


def evaluate_rows_paired(run: Runner, policies: dict, prompts: list, repeats: int = 1) -> tuple[list[dict], dict]:
    """Rows like `evaluate_rows`, measured in a paired design that cancels drift:
    for each pass and prompt the policies run back to back (order reversed on
    alternate prompts), ``run(policy, [prompt])``. Greedy output does not depend on
    the policy, so per (pass, prompt) the time ratio first policy / policy is a
    speed ratio; rows add ``paired_speedup`` (mean of those ratios),
    ``paired_speedup_se`` (its standard error) and ``pair_seconds`` (seconds per
    (pass, prompt), pass-major: any two rows pair element-wise), and
    ``speedup_vs_best_static`` is pooled tokens/s against the first policy's.

    Raises:
        ValueError: repeats < 1 or no prompts.
    """
    if int(repeats) < 1 or not prompts:
        raise ValueError(f"need repeats >= 1 and prompts, got {repeats} and {len(prompts)} prompts")
    labels = list(policies)
    runs: dict = {label: ([], [], [], []) for label in labels}       # records, depths, sizes, seconds per pair
    for rep in range(int(repeats)):
        for i, prompt in enumerate(prompts):
            for label in (labels if (rep + i) % 2 == 0 else labels[::-1]):
                trace, depths, sizes = run(policies[label], [prompt])
                records, ds, vs, seconds = runs[label]
                records.extend(trace)
                ds.extend(depths)
                vs.extend(sizes)
                seconds.append(trace.total_time)
    ref_seconds = np.asarray(runs[labels[0]][3])
    ref_tps = Trace(runs[labels[0]][0]).tokens_per_second()
    rows, decisions = [], {}
    for label in labels:
        records, depths, sizes, seconds = runs[label]
        trace = Trace(records)
        ratios = ref_seconds / np.asarray(seconds)
        rows.append({"config": label, "mean_accepted_length": trace.mean_accepted_length(),
                     "tokens_per_s": trace.tokens_per_second(),
                     "speedup_vs_best_static": trace.tokens_per_second() / ref_tps,
                     "paired_speedup": float(ratios.mean()),
                     "paired_speedup_se": float(ratios.std(ddof=1) / np.sqrt(ratios.size)) if ratios.size > 1 else
                     float("nan"),
                     "mean_depth": float(np.mean(depths)), "mean_verify_size": float(np.mean(sizes)),
                     "rounds": len(trace), "pair_seconds": [float(x) for x in seconds]})
        decisions[label] = (np.asarray(depths), np.asarray(sizes), trace.column("tokens_per_round"))
    return rows, decisions


def evaluate_rows(run: Runner, policies: dict, best_static_tps: float | None, repeats: int = 1,
                  prompts: list | None = None, paired: bool = False) -> tuple[list[dict], dict]:
    """One row per policy: config, mean_accepted_length, tokens_per_s,
    speedup_vs_best_static, mean depth / V, rounds, tokens_per_s_per_episode; and
    the per-cycle decisions ``{label: (depths, sizes, tokens_per_round)}``.

    ``repeats`` passes run every policy once each, interleaved (wall-clock drift
    hits all rows alike), and the rows pool the passes. ``best_static_tps`` None:
    the first policy (the grid-best static tree) measured in these same passes.
    ``paired``: `evaluate_rows_paired` over ``prompts`` instead.

    Raises:
        ValueError: repeats < 1.
    """
    if paired:
        return evaluate_rows_paired(run, policies, prompts or [], repeats)
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs: dict = {label: ([], [], []) for label in policies}
    for _ in range(int(repeats)):
        for label, policy in policies.items():
            trace, depths, sizes = run(policy)
            for store, part in zip(runs[label], (list(trace), list(depths), list(sizes))):
                store.extend(part)
    rows, decisions = [], {}
    for label in policies:
        records, depths, sizes = runs[label]
        trace = Trace(records)
        tps = trace.tokens_per_second()
        if best_static_tps is None:
            best_static_tps = tps
        rows.append({"config": label, "mean_accepted_length": trace.mean_accepted_length(),
                     "tokens_per_s": tps, "speedup_vs_best_static": tps / best_static_tps,
                     "mean_depth": float(np.mean(depths)), "mean_verify_size": float(np.mean(sizes)),
                     "rounds": len(trace), "tokens_per_s_per_episode": per_episode_tokens_per_s(records)})
        decisions[label] = (np.asarray(depths), np.asarray(sizes), trace.column("tokens_per_round"))
    return rows, decisions


def per_episode_tokens_per_s(records) -> list[float]:
    """Tokens/s of each episode (records grouped by ``stream_index``, passes pooled), in
    episode order: the same seeded episodes for every policy, so rows pair by episode."""
    totals: dict = {}
    for r in records:
        tokens, seconds = totals.get(int(r.stream_index), (0, 0.0))
        totals[int(r.stream_index)] = (tokens + r.tokens_per_round, seconds + r.round_time)
    return [t / s if s > 0 else float("nan") for _, (t, s) in sorted(totals.items())]


def save_eval(out: str | Path, result: dict, decisions: dict) -> list[Path]:
    """Write ``ltd_eval_<env>.json`` (the result) and the per-cycle decisions
    ``ltd_decisions_<env>.csv`` (config, cycle, tree_depth, verify_size,
    tokens_per_round) and ``.npz`` (``config_<i>_depth`` / ``_verify_size`` /
    ``_tokens`` int arrays and ``config_labels``) under ``out``; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = result["env"]
    paths = [out / f"ltd_eval_{env}.json", out / f"ltd_decisions_{env}.csv", out / f"ltd_decisions_{env}.npz"]
    paths[0].write_text(json.dumps(result, indent=2))
    arrays = {}
    with open(paths[1], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["config", "cycle", "tree_depth", "verify_size", "tokens_per_round"])
        for i, (label, (depths, sizes, tokens)) in enumerate(decisions.items()):
            arrays[f"config_{i}_depth"], arrays[f"config_{i}_verify_size"] = depths, sizes
            arrays[f"config_{i}_tokens"] = tokens
            for j, (d, v, n) in enumerate(zip(depths, sizes, tokens)):
                writer.writerow([label, j, int(d), int(v), int(n)])
    arrays["config_labels"] = np.asarray(list(decisions))
    np.savez(paths[2], **arrays)
    return paths
