"""Figure: frozen Hydra against online Opt-Hydra replayed over a held-out sub-stream
of the committed answer set ``data/answers/sharegpt-heldout-1200`` (1200 ShareGPT
prompts, 400 code -> 400 writing -> 400 chat, SmolLM2-135M float32 greedy answers),
and the verdict "online beats frozen" at a size where its interval can exclude 1.

Steps (`main`):

1. `rebuild_substream`: the recording of every ``every``-th prompt of the set
   (`specloop.realmodels.answers.rebuild.rebuild_recording`, the library side of
   ``specloop stream record --from-answers DIR --every N``): one teacher-forced
   prefill per prompt, no generation, into the part's folder.
2. `run_substream`: the stream-scale grid (`specloop.realmodels.streams.scale`) replays
   frozen ``hydra`` and online ``opt-hydra`` (round mode: a micro-update every round,
   batch 4) with the shipped drafts (the in-domain protocol: the shipped Hydra was
   fine-tuned on the target's answers to the ShareGPT warm-up split, disjoint from these
   held-out prompts) plus the greedy baseline whose priced tokens/s is every speedup's
   denominator, on the process backend (two workers, one torch thread each);
   `specloop.realmodels.streams.scale_results.protocol_summary` aggregates.
3. `substream_claim`: the verdict row from the summary's ``vs_frozen`` (paired
   per-prompt tau ratio, t interval on log ratios); `main` plots tau per chunk and
   deletes the recording and the replays' state files, keeping the JSON results.
4. `committed_claim`: the same comparison read from the largest committed Table 1
   replay of the same protocol (`COMMITTED`, ``results/<folder>/summary.json``: the
   whole 1200-prompt stream, else its every-4th sub-stream), beside the one rebuilt
   here. In-domain the gain is a few percent, which 40 prompts cannot resolve
   (half-width about 6 points) while 300 or 1200 can; the rebuilt replay is the
   reproduction check (``consistent``: its interval holds the committed effect).
"""
from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

from specloop.figures._base import (FigureResult, FigureUnavailable, new_figure, require, save_figure, sizes,
                                    write_csv, write_json)

__all__ = ["main", "SIZES", "ANSWER_SET", "COMMITTED", "answer_set_dir", "rebuild_substream", "run_substream",
           "substream_claim", "committed_claim", "chunk_rows"]

NAME = "online_substream"
ANSWER_SET = "sharegpt-heldout-1200"
FROZEN, ONLINE = "hydra", "opt-hydra"
PROTOCOL = "in-domain"
#: round mode with the online flags' defaults (`specloop.cli._online_flags`): a
#: micro-update every round from a replay buffer, batch 4
ONLINE_CONFIG = {"mode": "round", "batch_size": 4, "update_every": 1, "epochs": 2, "precondition": "none"}

#: every: the sub-stream step over the 1200 prompts (30: 40 prompts, 4: 300; 200: 6);
#: chunk: prompts per chunk of the figure; k: draft tokens per round
SIZES = {
    "full": {"every": 4, "prompts": None, "chunk": 20, "k": 4, "workers": 2},
    "quick": {"every": 30, "prompts": None, "chunk": 10, "k": 4, "workers": 2},
    "tiny": {"every": 200, "prompts": None, "chunk": 2, "k": 4, "workers": 2},
}

CLAIM = "online_beats_frozen_substream"
COMMITTED_CLAIM = "online_beats_frozen_committed_stream"
#: committed Table 1 replays of the same protocol, largest first (``results/<folder>``)
COMMITTED = ("stream_scale_indomain_full", "stream_scale_indomain_every4")
STATEMENT = ("online beats frozen (held-out sub-stream replay): Opt-Hydra reaches a higher mean accepted "
             "length than frozen Hydra over a domain-shifting held-out ShareGPT sub-stream")


def answer_set_dir(root: str | Path | None = None) -> Path:
    """The committed held-out answer set's folder.

    Args:
        root: the folder holding ``data/`` (None: the repository the package sits in,
            ``<repo>/specloop/..``, as ``pip install -e .`` from a clone leaves it).

    Returns:
        ``root/data/answers/sharegpt-heldout-1200``.

    Raises:
        FigureUnavailable: no ``manifest.json`` there (e.g. a non-editable install
            without the repository's ``data/``).
    """
    import specloop
    base = Path(root) if root is not None else Path(specloop.__file__).resolve().parents[1]
    folder = base / "data" / "answers" / ANSWER_SET
    if not (folder / "manifest.json").is_file():
        raise FigureUnavailable(f"the held-out answer set {ANSWER_SET} is not at {folder} "
                                "(it ships with the repository: install with `pip install -e .` from a clone)")
    return folder


def rebuild_substream(answers: str | Path, out: str | Path, every: int, prompts: int | None = None) -> dict:
    """Rebuild the recording of every ``every``-th prompt of an answer set into ``out``
    (teacher-forced prefill of prompt + answer; float16 features, top-32; resumable).

    Args:
        answers: the answer-set folder. out: the recording folder.
        every: keep prompts 0, every, 2 every, ... (int >= 1).
        prompts: the first N kept prompts (None: all of them).

    Returns:
        the recording's manifest plus ``seconds`` (wall clock, model load included).

    Raises:
        FigureUnavailable: the model or its packages are missing.
        ValueError: as `rebuild_recording` (bad ``every`` / ``prompts``, other target).
    """
    answer_set = require("specloop.realmodels.answers.answer_set", "open_answer_set")
    rebuild = require("specloop.realmodels.answers.rebuild", "rebuild_recording")
    loading = require("specloop.realmodels.loading", "load_model")
    settings = answer_set.open_answer_set(answers).settings
    start = time.perf_counter()
    try:
        target = loading.load_model(settings["target"], dtype=settings["dtype"])
    except (FileNotFoundError, ImportError) as exc:
        raise FigureUnavailable(f"target {settings['target']!r} cannot be loaded: {exc}") from exc
    manifest = rebuild.rebuild_recording(target, answers, out, prompts=prompts, every=every, batch_size=4)
    del target
    return {**manifest, "seconds": time.perf_counter() - start}


def _jobs(methods, chunk: int, drafts: str | None, online: dict) -> tuple[list, object]:
    """(the grid's jobs, the greedy baseline's job): the online jobs first (the longest,
    so both workers stay busy), then the baseline, then the frozen drafts."""
    from specloop.realmodels.streams.runner import resolve_method
    from specloop.realmodels.streams.scale import baseline_job, plan_jobs
    jobs = plan_jobs({PROTOCOL: drafts}, list(methods), chunk=chunk, online=online)
    online_jobs = [j for j in jobs if resolve_method(j.method).learner is not None]
    baseline = baseline_job(chunk)
    return online_jobs + [baseline] + [j for j in jobs if j not in online_jobs], baseline


def run_substream(recording: str | Path, out: str | Path, *, chunk: int, k: int = 4,
                  methods: tuple[str, ...] = (FROZEN, ONLINE), drafts: str | None = None,
                  online: dict | None = None, target_loader: str | None = None, backend: str = "process",
                  workers: int = 2, deadline: float | None = None) -> dict:
    """Replay ``methods`` and the greedy baseline over a recording with the stream-scale grid.

    Args:
        recording: a recording folder (`specloop.realmodels.recording`).
        out: the grid's results root (``out/<protocol>/<job>/<method>/``; resumable).
        chunk: prompts per chunk. k: draft tokens per round.
        methods: `resolve_method` names (a frozen draft and its online variant).
        drafts: the drafts folder (``drafts/<drafter>``); None = the draft cache /
            shipped drafts.
        online: `OnlineConfig` fields of the online jobs (None: `ONLINE_CONFIG`).
        target_loader: ``"module:function"`` building the target (None: the
            recording's target by name). backend / workers: as `run_grid`.
        deadline: `time.time()` after which no job starts another prompt.

    Returns:
        `protocol_summary` (``methods`` -> tau, speedups, per_chunk, per_domain,
        vs_frozen; ``failed``) plus ``prompts`` (the sub-stream's length), ``chunk``,
        ``stopped_early`` (job names cut by the deadline) and ``seconds`` (wall).

    Raises:
        RuntimeError: the greedy baseline failed (no speedup has a denominator).
        ValueError: unknown method / backend, chunk < 1.
    """
    from specloop.realmodels.recording import open_recording, recorded_items
    from specloop.realmodels.streams.scale import GridSettings, run_grid
    from specloop.realmodels.streams.scale_results import protocol_summary
    start = time.perf_counter()
    domains = [i.dataset for i in recorded_items(open_recording(recording))]
    jobs, base_job = _jobs(methods, chunk, drafts, dict(ONLINE_CONFIG if online is None else online))
    settings = GridSettings(recording=str(recording), out=str(out), num_draft_tokens=int(k), threads=1,
                            target_loader=target_loader, deadline=deadline)
    results = run_grid(jobs, settings, backend=backend, workers=workers)
    baseline = results.pop(base_job)
    if isinstance(baseline, Exception):
        raise RuntimeError(f"the greedy baseline failed: {baseline}") from baseline
    summary = protocol_summary(results, baseline, domains, PROTOCOL)
    stopped = [j.name for j, v in [(base_job, baseline), *results.items()]
               if isinstance(v, dict) and v.get("stopped_early")]
    return {**summary, "prompts": len(domains), "chunk": int(chunk), "stopped_early": stopped,
            "seconds": time.perf_counter() - start}


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def substream_claim(summary: dict, online: str = ONLINE, *, claim_id: str = CLAIM,
                    statement: str = STATEMENT) -> dict:
    """The report's claim row (`specloop.report.verdicts.measured_claim`): the paired
    per-prompt tau ratio of ``online`` over its frozen draft, from ``vs_frozen`` of a
    `run_substream` summary.

    The effect is 1 + gain (a geometric-mean ratio), the interval 1 + gain_ci (95 %),
    n the paired prompts; holds when the interval lies above 1 (gain_ci low end > 0),
    does not hold when it lies below 1 (high end < 0), else undecided (also when the
    method did not run or has no paired comparison).
    """
    from specloop.report.verdicts import Estimate, measured_claim
    row = (summary.get("methods") or {}).get(online) or {}
    vs = row.get("vs_frozen")
    if not vs or not vs.get("n"):
        failed = (summary.get("failed") or {})
        why = (f"undecided: {online} has no paired comparison with its frozen draft"
               + (f" (failed: {failed})" if failed else ""))
        return measured_claim(claim_id, statement, None, null=1.0, why_missing=why)
    lo, hi = (_nan(x) for x in vs["gain_ci"])
    estimate = Estimate(1.0 + float(vs["gain"]), (1.0 + lo, 1.0 + hi), int(vs["n"]),
                        f"paired per-prompt tau ratio {online} / {vs['frozen']} (geometric mean, t interval on "
                        "log ratios)")
    domains = "; ".join(f"{d}: {100 * _nan(g.get('gain')):+.1f} % (n {g.get('n')})"
                        for d, g in (vs.get("per_domain") or {}).items())
    evidence = (f"{online} vs {vs['frozen']}: {vs.get('better', 0)} prompts better, {vs.get('worse', 0)} worse; "
                f"Wilcoxon p = {_nan(vs.get('wilcoxon_p')):.3g}; per domain {domains or '—'}")
    return measured_claim(claim_id, statement, estimate, null=1.0, evidence=evidence)


def committed_claim(results_root: str | Path, live: dict | None = None) -> dict | None:
    """The claim row of the largest committed replay of `PROTOCOL` (`COMMITTED`).

    Args:
        results_root: the folder holding the ``results/<folder>/summary.json`` files.
        live: the `substream_claim` of the replay rebuilt here; when given, the
            evidence says whether its interval holds the committed effect.

    Returns:
        `substream_claim` of that summary under `COMMITTED_CLAIM`, its evidence
        naming the folder and prompts; None when no committed summary is there.
    """
    import json
    for folder in COMMITTED:
        path = Path(results_root) / folder / "summary.json"
        if path.is_file():
            summary = json.loads(path.read_text(encoding="utf-8")).get(PROTOCOL) or {}
            n = ((summary.get("methods") or {}).get(ONLINE) or {}).get("vs_frozen", {}).get("n")
            claim = substream_claim(summary, claim_id=COMMITTED_CLAIM,
                                    statement=f"{STATEMENT} (committed replay results/{folder}, {n} prompts)")
            if live is not None and live.get("interval") and claim.get("effect") is not None:
                lo, hi = live["interval"]
                inside = lo is not None and hi is not None and lo <= claim["effect"] <= hi
                claim["evidence"] = (f"{claim.get('evidence', '')}; the replay rebuilt here "
                                     f"({'consistent' if inside else 'NOT consistent'}: its interval "
                                     f"[{lo:.3f}, {hi:.3f}] {'holds' if inside else 'misses'} this effect)")
            return claim
    return None


def chunk_rows(summary: dict) -> list[dict]:
    """Per method and chunk of a `run_substream` summary: method, label, online,
    chunk, datasets (the chunk's domains joined by '+'), mean_accepted_length
    (tokens per round, seed mean)."""
    from specloop.realmodels.streams.runner import resolve_method
    stream, size = list(summary.get("stream") or []), int(summary["chunk"])
    rows = []
    for name, m in (summary.get("methods") or {}).items():
        for c, tau in enumerate(m["per_chunk"]):
            rows.append({"method": name, "label": m.get("label", name),
                         "online": resolve_method(name).learner is not None, "chunk": c,
                         "datasets": "+".join(dict.fromkeys(stream[c * size:(c + 1) * size])),
                         "mean_accepted_length": tau})
    return rows


def _plot(rows: list[dict], out: Path) -> list[Path]:
    fig, axes = new_figure(width=6.4, height=3.8)
    ax = axes[0]
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["chunk"])
        ax.plot([r["chunk"] for r in pts], [r["mean_accepted_length"] for r in pts], marker="o", ms=4,
                color=f"C{i}", ls="-" if pts[0]["online"] else "--",
                label=f"{pts[0]['label']} ({'online' if pts[0]['online'] else 'frozen'})")
    labels = {r["chunk"]: r["datasets"].replace("sharegpt-", "") for r in rows}
    ax.set_xticks(sorted(labels), [f"{c}\n{labels[c]}" for c in sorted(labels)], fontsize=6)
    ax.set(xlabel="chunk of prompts (stream order)", ylabel="mean accepted length tau (tokens/round)",
           title="held-out ShareGPT sub-stream (replay): frozen (--) vs online (—)")
    ax.legend(fontsize=7)
    return save_figure(fig, out, NAME)


def _table(summary: dict) -> list[dict]:
    """One report row per method: tau, speedups, per-domain tau, the paired gain."""
    table = []
    for name, m in (summary.get("methods") or {}).items():
        vs = m.get("vs_frozen") or {}
        lo, hi = vs.get("gain_ci") or (None, None)
        table.append({"method": m.get("label", name), "mean_accepted_length": m["mean_accepted_length"],
                      "speedup": m["speedup"], "speedup_with_training": m["speedup_with_training"],
                      **{f"tau_{d.replace('sharegpt-', '')}": t for d, t in (m.get("per_domain") or {}).items()},
                      "gain_vs_frozen": vs.get("gain"), "gain_ci_low": lo, "gain_ci_high": hi,
                      "n": vs.get("n")})
    return table


def _clean(recording: Path, grid: Path) -> None:
    """Delete the recording and the replays' state / parameter files (``*.pt``)."""
    shutil.rmtree(recording, ignore_errors=True)
    for path in grid.rglob("*.pt"):
        path.unlink(missing_ok=True)


def _numbers(cfg: dict, summary: dict, claim: dict, rebuild_s: float) -> dict:
    online = (summary["methods"].get(ONLINE) or {})
    frozen = (summary["methods"].get(FROZEN) or {})
    return {"every": cfg["every"], "prompts": summary["prompts"], "chunk_prompts": cfg["chunk"], "k": cfg["k"],
            "tau_frozen": frozen.get("mean_accepted_length"), "tau_online": online.get("mean_accepted_length"),
            "gain": None if claim["effect"] is None else claim["effect"] - 1.0,
            **{f"gain_ci_{end}": None if x is None else x - 1.0 for end, x in zip(("low", "high"), claim["interval"])},
            "n": claim["n"],
            "verdict": claim["verdict"], "rebuild_seconds": rebuild_s, "replay_seconds": summary["seconds"]}


def main(out_dir: str | Path, quick: bool = False) -> FigureResult:
    """Rebuild the sub-stream, replay frozen Hydra and Opt-Hydra, save
    ``summary.json`` / ``online_substream.csv`` and plot tau per chunk.

    Raises:
        FigureUnavailable: no answer set, model or model packages.
        RuntimeError: the greedy baseline's replay failed.
    """
    cfg = sizes(SIZES, quick)
    out = Path(out_dir)
    answers = answer_set_dir()
    recording, grid = out / "recording", out / "grid"
    try:
        manifest = rebuild_substream(answers, recording, cfg["every"], cfg["prompts"])
        summary = run_substream(recording, grid, chunk=cfg["chunk"], k=cfg["k"], workers=cfg["workers"])
    finally:
        _clean(recording, grid)
    summary["recording_bytes"] = manifest.get("total_bytes")
    claim = substream_claim(summary)
    committed = committed_claim(answers.parents[2] / "results", claim)
    write_json(out / "summary.json", summary)
    rows = chunk_rows(summary)
    data = write_csv(out / f"{NAME}.csv", rows, columns=["method", "label", "online", "chunk", "datasets",
                                                          "mean_accepted_length"])
    notes = [f"Source: {answers.name} (committed answers of {manifest['settings']['target']}, "
             f"{manifest['settings']['dtype']}), every {cfg['every']}-th prompt ({summary['prompts']} prompts, "
             "code -> writing -> chat), recording rebuilt by teacher-forced prefill and replayed "
             f"(`specloop stream scale`, protocol {PROTOCOL}: shipped drafts; Opt-Hydra in round mode, "
             f"micro-update every round, batch 4; k = {cfg['k']}); speedups priced from the verify-cost table.",
             "Recording and replay state deleted after the run; summary.json keeps the results."]
    if summary["failed"]:
        notes.append(f"Failed jobs: {summary['failed']}.")
    return FigureResult(
        name=NAME, title="held-out sub-stream replay: tau per chunk, frozen Hydra vs Opt-Hydra",
        data_paths=[data, out / "summary.json"], image_paths=_plot(rows, out) if rows else [],
        claims=[claim] + ([committed] if committed else []), table=_table(summary), numbers=_numbers(cfg, summary, claim, manifest["seconds"]),
        notes=notes)
