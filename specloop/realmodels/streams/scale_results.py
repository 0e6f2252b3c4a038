"""The online-at-scale grid's results: per protocol, the stream JSON of
``specloop stream`` per method (aggregated over seeds), the learning-rate grid, tau
against the stream length T, the stated targets as computed verdicts, and figures.

Per protocol (``summary-<protocol>.json``; all protocols in ``summary.json``):

* ``methods[m]`` (default learning rate): ``mean_accepted_length`` (mean over seeds),
  ``seeds`` (tau of each seed), ``speedup`` / ``speedup_with_training`` (replayed
  tokens/s over the greedy baseline's, update time excluded / included; App. B.2's
  asynchronous and serial prices), ``per_chunk`` / ``per_domain`` (tau, seed mean),
  ``tau_vs_T`` (tau over the first T prompts), ``update_seconds``,
  ``per_prompt_by_seed`` ({seed: {"index", "rounds", "tokens"}: int lists, one entry a
  prompt}, so that runs of other seeds can be pooled with this one later), and for an online
  method ``vs_frozen`` (`specloop.stats.paired_gain` of the per-prompt tau pooled over
  seeds against the frozen draft: ``gain``, ``gain_ci``, ``wilcoxon_p``, per domain).
* ``lr_grid[m]``: {learning rate: tau} of the learning-rate jobs (Table 5 (i)-(ii));
  the targets compare them with the optimistic / ensemble rows by paired intervals.
* ``targets``: each stated target with its numbers and a boolean (None when a
  method it needs did not run).

Figures: ``per_chunk-<protocol>.png`` (tau per chunk, OnlineSpec Figure 3),
``tau_vs_T-<protocol>.png`` (Table 5 (iii)), ``lr-<protocol>.png`` (sensitivity).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["protocol_summary", "scale_targets", "write_results", "t_grid"]


def t_grid(num_prompts: int) -> list[int]:
    """Stream lengths T for tau against T: quarters of the stream (at least 1 prompt),
    the whole stream last."""
    return sorted({max(1, round(num_prompts * f)) for f in (0.25, 0.5, 0.75, 1.0)})


def _pooled(rows_by_seed: Sequence[Sequence[dict]]) -> list[dict]:
    """Per-prompt rounds and tokens summed over seeds (the prompt's tau pooled over seeds)."""
    out: dict[int, list[int]] = {}
    for rows in rows_by_seed:
        for p in rows:
            acc = out.setdefault(int(p["index"]), [0, 0])
            acc[0] += int(p["rounds"])
            acc[1] += int(p["tokens"])
    return [{"index": i, "rounds": r, "tokens": t} for i, (r, t) in sorted(out.items())]


def _tau(rows: Sequence[dict], upto: int | None = None) -> float:
    chosen = [p for p in rows if upto is None or p["index"] < upto]
    rounds = sum(p["rounds"] for p in chosen)
    return sum(p["tokens"] for p in chosen) / rounds if rounds else math.nan


def _per_prompt(rows: Sequence[dict]) -> dict:
    """One seed's per-prompt record, column-wise: stream ``index``, ``rounds``, ``tokens``."""
    return {key: [int(p[key]) for p in rows] for key in ("index", "rounds", "tokens")}


def _method_row(by_seed: dict[int, dict], base_tps: float, domains: list[str]) -> dict:
    from specloop.realmodels.streams.compare import domain_accepted_length
    summaries = list(by_seed.values())
    taus = [s["mean_accepted_length"] for s in summaries]
    pooled = _pooled([s["prompts"] for s in summaries])
    chunks = [np.mean([c[i]["mean_accepted_length"] for c in (s["chunks"] for s in summaries)])
              for i in range(min(len(s["chunks"]) for s in summaries))]
    return {"mean_accepted_length": float(np.mean(taus)), "seeds": taus,
            "speedup": float(np.mean([s["tokens_per_s"] for s in summaries])) / base_tps,
            "speedup_with_training": float(np.mean([s["tokens_per_s_with_training"] for s in summaries])) / base_tps,
            "update_seconds": float(np.mean([s["update_seconds"] for s in summaries])),
            "per_chunk": [float(x) for x in chunks],
            "per_domain": domain_accepted_length(pooled, domains),
            "tau_vs_T": {str(t): _tau(pooled, t) for t in t_grid(len(domains))},
            "per_prompt_by_seed": {str(seed): _per_prompt(s["prompts"]) for seed, s in by_seed.items()},
            "prompts": pooled}


def protocol_summary(results: dict, baseline: dict, domains: list[str], protocol: str) -> dict:
    """One protocol's summary (module docstring).

    Args:
        results: `ScaleJob` -> `run_job` result (or an exception) for this protocol.
        baseline: the greedy baseline's `run_job` result.
        domains: dataset of each stream prompt.
        protocol: its name.
    """
    from specloop.realmodels.streams.runner import frozen_method, resolve_method
    from specloop.stats import paired_gain
    base_tps = baseline["tokens_per_s"]
    grouped: dict[str, dict[int, dict]] = {}
    lr_grid: dict[str, dict[str, float]] = {}
    lr_prompts: dict[str, dict[str, list[dict]]] = {}
    failed = {}
    for job, value in results.items():
        if isinstance(value, Exception):
            failed[job.name] = str(value)
        elif job.lr is None:
            grouped.setdefault(job.method, {})[job.seed] = value
        else:
            lr_grid.setdefault(job.method, {})[f"{job.lr:g}"] = value["mean_accepted_length"]
            lr_prompts.setdefault(job.method, {})[f"{job.lr:g}"] = value["prompts"]
    methods = {name: {"label": resolve_method(name).label, **_method_row(by_seed, base_tps, domains)}
               for name, by_seed in grouped.items()}
    for name, row in methods.items():
        spec = resolve_method(name)
        frozen = frozen_method(spec)
        if spec.learner is not None and frozen in methods:
            a, b = methods[frozen]["prompts"], row["prompts"]
            row["vs_frozen"] = {"frozen": frozen, **paired_gain(a, b), "per_domain": {
                d: paired_gain([p for p in a if domains[p["index"]] == d], [p for p in b if domains[p["index"]] == d])
                for d in dict.fromkeys(domains)}}
    targets = scale_targets(methods, lr_grid, lr_prompts)   # per-prompt rows: the intervals
    for row in methods.values():
        row.pop("prompts")
    return {"protocol": protocol, "methods": methods, "lr_grid": lr_grid, "failed": failed,
            "baseline_tokens_per_s": base_tps, "stream": domains, "targets": targets}


def scale_targets(methods: dict, lr_grid: dict, lr_prompts: dict | None = None) -> dict:
    """The stated targets as verdicts with their numbers: online >= +20 % tau
    over frozen with the interval above 0 (Opt-Hydra, Ens-EAGLE-3); the ordering
    frozen < OSD < optimistic / ensemble (each step by its paired interval, `_ordering`);
    the ensemble within 2 % of the best single learning rate in hindsight and no single
    learning rate above the optimistic / ensemble learners (`_vs_lr_grid`); speedup with
    training >= 1.1x the frozen draft's. ``methods`` rows may carry ``prompts`` (the
    per-prompt rows `protocol_summary` pools) and ``lr_prompts`` ({method: {lr: rows}})
    those of the learning-rate jobs; without them a verdict has no interval and does
    not hold."""
    out = {}
    for name in ("opt-hydra", "ens-eagle3"):
        vs = methods.get(name, {}).get("vs_frozen")
        out[f"{name}_gain_20pct"] = None if vs is None else {
            "gain": vs["gain"], "gain_ci": vs["gain_ci"],
            "holds": bool(vs["gain"] >= 0.20 and vs["gain_ci"][0] > 0)}
        frozen = None if vs is None else methods.get(vs["frozen"])
        out[f"{name}_speedup_with_training_1.1x"] = None if frozen is None else {
            "ratio": methods[name]["speedup_with_training"] / frozen["speedup"],
            "holds": bool(methods[name]["speedup_with_training"] >= 1.1 * frozen["speedup"])}
    for kind in ("hydra", "eagle", "eagle3"):
        names = [kind, f"osd-{kind}", f"opt-{kind}", f"ens-{kind}"]
        tau = {n: methods[n]["mean_accepted_length"] for n in names if n in methods}
        if kind in tau and f"osd-{kind}" in tau and (f"opt-{kind}" in tau or f"ens-{kind}" in tau):
            top = max((n for n in (f"opt-{kind}", f"ens-{kind}") if n in tau), key=tau.get)
            out[f"ordering_{kind}"] = _ordering(methods, [kind, f"osd-{kind}", top], tau)
        out.update(_vs_lr_grid(methods, kind, lr_grid, lr_prompts or {}))
    return out


def _vs_lr_grid(methods: dict, kind: str, lr_grid: dict, lr_prompts: dict) -> dict:
    """Table 5 (i)-(ii) as verdicts for one draft kind, over the OGD / OSD
    learning-rate jobs (``lr_grid`` {method: {lr: tau}}, ``lr_prompts`` their
    per-prompt rows):

    * ``ensemble_vs_best_lr_<kind>``: the ensemble against the best single rate in
      hindsight (the highest tau); ``gap`` / ``gap_ci`` is the paired per-prompt gain
      (`specloop.stats.paired_gain`, 95 %) of the ensemble over it; holds when the
      whole interval lies above -2 %.
    * ``no_lr_beats_online_<kind>``: per rate, the paired gain of the optimistic and
      the ensemble learner over it; holds when no rate's interval lies wholly above
      the better of the two (gain_ci upper end < 0 would say that rate beats it).
    """
    from specloop.stats import paired_gain
    grid, rows = {}, {}
    for method in (f"ogd-{kind}", f"osd-{kind}"):
        for lr, tau in lr_grid.get(method, {}).items():
            grid[f"{method}@{lr}"], rows[f"{method}@{lr}"] = tau, lr_prompts.get(method, {}).get(lr)
    if not grid:
        return {}
    out, best = {}, max(grid, key=grid.get)
    ens = methods.get(f"ens-{kind}")
    if ens is not None:
        gain = _gain_or_nan(paired_gain, rows[best], ens.get("prompts"))
        out[f"ensemble_vs_best_lr_{kind}"] = {
            "ensemble": ens["mean_accepted_length"], "best_single_lr": grid[best], "best_lr": best,
            "gap": gain["gain"], "gap_ci": gain["gain_ci"], "gap_of_means": ens["mean_accepted_length"] / grid[best] - 1,
            "holds": bool(gain["gain_ci"][0] >= -0.02)}
    online = {n: methods[n] for n in (f"opt-{kind}", f"ens-{kind}") if n in methods}
    if online:
        per_lr = {lr: {n: {k: v for k, v in _gain_or_nan(paired_gain, rows[lr], m.get("prompts")).items()
                           if k in ("gain", "gain_ci")} for n, m in online.items()} for lr in grid}
        top = max(online, key=lambda n: online[n]["mean_accepted_length"])
        out[f"no_lr_beats_online_{kind}"] = {
            "online": top, "per_lr": per_lr,
            "holds": bool(all(g[top]["gain_ci"][1] >= 0 for g in per_lr.values()))}
    return out


def _gain_or_nan(paired_gain, lower, higher) -> dict:
    if lower and higher:
        return paired_gain(lower, higher)
    return {"gain": math.nan, "gain_ci": [math.nan, math.nan]}


def _ordering(methods: dict, names: list[str], tau: dict) -> dict:
    """frozen < OSD < the better of optimistic / ensemble: every step holds only when
    the paired per-prompt gain of the higher row over the lower (`paired_gain`, 95 %
    Student-t interval on the mean log ratio) has its interval above 0;
    ``holds_on_means`` is the ordering of the seed-mean taus alone."""
    from specloop.stats import paired_gain
    steps = []
    for lower, higher in zip(names, names[1:]):
        rows = (methods[lower].get("prompts"), methods[higher].get("prompts"))
        gain = paired_gain(*rows) if all(rows) else {"gain": math.nan, "gain_ci": [math.nan, math.nan]}
        steps.append({"lower": lower, "higher": higher, "gain": gain["gain"], "gain_ci": gain["gain_ci"],
                      "holds": bool(gain["gain_ci"][0] > 0)})
    return {"tau": tau, "order": names, "steps": steps, "holds": all(st["holds"] for st in steps),
            "holds_on_means": bool(all(tau[a] < tau[b] for a, b in zip(names, names[1:])))}


def write_results(summaries: dict[str, dict], out: str | Path) -> Path:
    """Write ``summary.json``, ``summary-<protocol>.json`` and the figures; returns
    the folder."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summaries, indent=1), encoding="utf-8")
    for protocol, summary in summaries.items():
        (folder / f"summary-{protocol}.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        _plot(summary, folder, protocol)
    return folder


def _plot(summary: dict, folder: Path, protocol: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from specloop.realmodels.streams.runner import resolve_method
    methods = summary["methods"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, (name, m) in enumerate(methods.items()):
        ax.plot(m["per_chunk"], "-" if resolve_method(name).learner else "--", marker="o", ms=3, color=f"C{i}",
                label=m["label"])
    ax.set(xlabel="chunk (stream order)", ylabel="mean accepted length", title=f"per-chunk tau ({protocol})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / f"per_chunk-{protocol}.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for i, (name, m) in enumerate(methods.items()):
        ts = sorted(int(t) for t in m["tau_vs_T"])
        ax.plot(ts, [m["tau_vs_T"][str(t)] for t in ts], marker="o", ms=3, color=f"C{i}", label=m["label"])
    ax.set(xlabel="T (prompts served)", ylabel="mean accepted length", title=f"tau against T ({protocol})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / f"tau_vs_T-{protocol}.png", dpi=120)
    plt.close(fig)
    if summary["lr_grid"]:
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for i, (name, grid) in enumerate(summary["lr_grid"].items()):
            lrs = sorted(grid, key=float)
            ax.plot([float(x) for x in lrs], [grid[x] for x in lrs], marker="o", color=f"C{i}", label=name)
            ens = methods.get("ens-" + resolve_method(name).drafter)
            if ens:
                ax.axhline(ens["mean_accepted_length"], color=f"C{i}", ls=":", label=ens["label"])
        ax.set(xscale="log", xlabel="learning rate", ylabel="mean accepted length",
               title=f"learning-rate sensitivity ({protocol})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / f"lr-{protocol}.png", dpi=120)
        plt.close(fig)
