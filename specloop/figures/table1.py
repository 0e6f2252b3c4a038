"""Figure: Table 1 of OnlineSpec (online drafts against their frozen drafts) from the
committed stream-scale replays, without recomputing them.

Every ``results/stream_scale*/summary-<protocol>[-<variant>].json`` in the repository is
the summary of a `specloop stream scale` run (or of the part of one that had finished
when it was committed) over the held-out ShareGPT stream
(``data/answers/sharegpt-heldout-1200``: 400 code -> 400 writing -> 400 chat) or a
sub-stream of it. Runs differ in protocol, sub-stream, seeds and update mode (chunk or
round; see each run's ``README.md``), so every row names its run, prompts, seeds and
domains. Its ``vs_frozen`` blocks hold the paired per-prompt tau ratio of each online
method over its frozen draft (geometric mean of the per-prompt ratios, t interval on
their logs), per domain too. `main` gathers one row per (run, protocol, online method)
(`table_rows`; a row repeating another run's numbers exactly, a copied run, is kept
once with the copy named in ``also_in``), plots the gains with their 95 % intervals
beside the paper's +20 % class and tau against T for the runs of at least
`MIN_TAU_VS_T` prompts, and decides "the online draft beats its frozen draft" and "by
the paper's +20 %" on the largest run of each (protocol, method) (`claims`).

Rerunning a row: rebuild the recording from the answer set (about 40 minutes),
``specloop stream record --from-answers data/answers/sharegpt-heldout-1200 --out REC``,
then the command in that run's ``results/<folder>/README.md`` with REC as its recording
(older READMEs name the folder the recording had then); ``update_hours`` is the
measured time of the row's online updates at one thread, most of an online run's time
(the replay's decoding adds roughly a tenth). The plan and the order of the runs still
to do are in ``results/table1/README.md``.

Source: OnlineSpec, Table 1 (speedups and accepted lengths of online against frozen
drafts, +20 % class of gains) and Appendix B.2 (updates priced in the background).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from specloop.figures._base import FigureResult, FigureUnavailable, new_figure, save_figure, write_csv, write_json

__all__ = ["main", "table_rows", "claims", "results_root", "PAPER_GAIN"]

NAME = "table1"
#: the class of tau gain OnlineSpec's Table 1 reports for online over frozen drafts
PAPER_GAIN = 0.20
#: runs of at least this many prompts get a tau-against-T curve
MIN_TAU_VS_T = 300
COLUMNS = ["run", "protocol", "method", "frozen", "prompts", "seeds", "domains", "tau_frozen", "tau_online", "gain",
           "gain_ci_low", "gain_ci_high", "gain_code", "gain_writing", "gain_chat", "speedup_background",
           "speedup_serial", "update_hours", "also_in"]


def results_root() -> Path:
    """The repository's ``results/`` folder (beside the package).

    Raises:
        FigureUnavailable: it is not there (an installed package without the repository).
    """
    root = Path(__file__).resolve().parents[2] / "results"
    if not root.is_dir():
        raise FigureUnavailable(f"no committed results folder at {root} (run from a clone of the repository)")
    return root


def _domain_gain(vs: dict, domain: str) -> float | None:
    block = (vs.get("per_domain") or {}).get(f"sharegpt-{domain}") or {}
    return block.get("gain")


def _run_name(path: Path, protocol: str) -> str:
    """``<folder>``, or ``<folder>:<variant>`` for ``summary-<protocol>-<variant>.json``."""
    variant = path.stem[len(f"summary-{protocol}"):].lstrip("-")
    return f"{path.parent.name}:{variant}" if variant else path.parent.name


def _method_rows(path: Path, summary: dict) -> list[dict]:
    protocol = summary["protocol"]
    methods = summary.get("methods") or {}
    rows = []
    for name, m in methods.items():
        vs = m.get("vs_frozen")
        if not vs or not vs.get("n"):
            continue
        frozen = methods.get(vs["frozen"]) or {}
        lo, hi = vs.get("gain_ci") or (math.nan, math.nan)
        rows.append({"run": _run_name(path, protocol), "protocol": protocol, "method": m.get("label", name),
                     "frozen": frozen.get("label", vs["frozen"]), "prompts": int(vs["n"]),
                     "seeds": len(m.get("seeds") or [None]),
                     "domains": "+".join(d.replace("sharegpt-", "") for d in (vs.get("per_domain") or {})),
                     "tau_frozen": frozen.get("mean_accepted_length"), "tau_online": m.get("mean_accepted_length"),
                     "gain": vs.get("gain"), "gain_ci_low": lo, "gain_ci_high": hi,
                     **{f"gain_{d}": _domain_gain(vs, d) for d in ("code", "writing", "chat")},
                     "speedup_background": m.get("speedup"), "speedup_serial": m.get("speedup_with_training"),
                     "update_hours": (m.get("update_seconds") or 0.0) / 3600.0, "also_in": "",
                     "tau_vs_T": m.get("tau_vs_T") or {}, "frozen_tau_vs_T": frozen.get("tau_vs_T") or {}})
    return rows


def table_rows(root: str | Path) -> list[dict]:
    """One row per (run, protocol, online method) of the committed summaries.

    Args:
        root: the folder holding ``stream_scale*/summary-*.json`` (one protocol each).

    Returns:
        dicts with `COLUMNS` plus ``tau_vs_T`` / ``frozen_tau_vs_T`` ({T as a string:
        tau over the first T prompts}), sorted by protocol, method, prompts and run.
        Gains are fractions (0.045 for +4.5 %) of the paired per-prompt tau ratio;
        ``gain_<domain>`` None where the run has no prompt of that domain; speedups
        are priced tokens/s over plain greedy decoding's (background: updates off the
        decoder; serial: added to it); ``update_hours`` the measured update seconds /
        3600; ``seeds`` their number; ``also_in`` the runs whose row repeats this one.
    """
    rows, seen = [], {}
    for path in sorted(Path(root).glob("stream_scale*/summary-*.json")):
        for row in _method_rows(path, json.loads(path.read_text(encoding="utf-8"))):
            key = (row["protocol"], row["method"], row["prompts"], row["gain"], row["gain_ci_low"], row["gain_ci_high"])
            if key in seen:                  # a copied run: the same paired numbers
                first = seen[key]
                first["also_in"] = ", ".join(filter(None, [first["also_in"], row["run"]]))
                continue
            seen[key] = row
            rows.append(row)
    return sorted(rows, key=lambda r: (r["protocol"], r["method"], r["prompts"], r["run"]))


def claims(rows: list[dict]) -> list[dict]:
    """For the largest run of each (protocol, online method): "online beats frozen"
    (the paired tau ratio's interval above 1) and "by the paper's +20 %" (above 1.2).

    Returns:
        `specloop.report.verdicts.measured_claim` dicts, two per (protocol, method).
    """
    from specloop.report.verdicts import Estimate, measured_claim
    largest: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["protocol"], r["method"])
        if key not in largest or (r["prompts"], r["seeds"]) > (largest[key]["prompts"], largest[key]["seeds"]):
            largest[key] = r
    out = []
    for (protocol, method), r in sorted(largest.items()):
        estimate = Estimate(1 + r["gain"], (1 + r["gain_ci_low"], 1 + r["gain_ci_high"]), r["prompts"],
                            f"paired per-prompt tau ratio {method} / {r['frozen']} (geometric mean, t interval "
                            "on log ratios)")
        evidence = (f"results/{r['run']}: {r['prompts']} prompts, {r['seeds']} seed(s); per domain "
                    + " / ".join(f"{100 * r[f'gain_{d}']:+.1f} %" if r[f"gain_{d}"] is not None else "-"
                                 for d in ("code", "writing", "chat")) + " (code / writing / chat)")
        slug = re.sub(r"[^a-z0-9+-]+", "_", f"{protocol}_{method}".lower().replace(" + ", "+"))
        out.append(measured_claim(f"table1_{slug}_beats_frozen",
                                  f"{method} accepts more tokens per round than frozen {r['frozen']} ({protocol}; "
                                  "paired per-prompt tau ratio above 1)", estimate, null=1.0, evidence=evidence))
        out.append(measured_claim(f"table1_{slug}_paper_gain",
                                  f"{method} gains at least {100 * PAPER_GAIN:.0f} % per-prompt tau over frozen "
                                  f"{r['frozen']} ({protocol}; the class of OnlineSpec Table 1)", estimate, null=1.0,
                                  claimed_size=1 + PAPER_GAIN, evidence=evidence))
    return out


_COLOURS = {"in-domain": "C0", "off-domain": "C1"}


def _plot(rows: list[dict], out: Path) -> list[Path]:
    fig, (ax, ax_t) = new_figure(ncols=2, width=6.4, height=max(3.8, 0.3 * len(rows) + 1.2))
    labels = [f"{r['method']} / {r['frozen']}, {r['prompts']}x{r['seeds']} ({r['run']})" for r in rows]
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows):
        ax.errorbar(100 * r["gain"], y, xerr=[[100 * (r["gain"] - r["gain_ci_low"])],
                                              [100 * (r["gain_ci_high"] - r["gain"])]],
                    fmt="o", ms=4, color=_COLOURS.get(r["protocol"], "C2"), capsize=2)
    ax.axvline(0, color="k", lw=0.8)
    ax.axvline(100 * PAPER_GAIN, color="C3", ls=":", lw=1, label="the paper's +20 % class")
    ax.set_yticks(ys, labels, fontsize=6)
    ax.set_ylim(-1, len(rows) + 1)
    ax.set(xlabel="per-prompt tau gain over the frozen draft (%, paired, 95 % interval)",
           title="online vs frozen (blue in-domain, orange off-domain)")
    ax.legend(fontsize=7, loc="upper left")
    long = [r for r in rows if len(r["tau_vs_T"]) > 2 and r["prompts"] >= MIN_TAU_VS_T]
    for marker, r in zip("osD^v<>", long):
        colour = _COLOURS.get(r["protocol"], "C2")
        for curve, ls, label in ((r["tau_vs_T"], "-", r["method"]), (r["frozen_tau_vs_T"], "--",
                                                                     f"{r['frozen']}, frozen")):
            ts = sorted(curve, key=int)
            ax_t.plot([int(t) for t in ts], [curve[t] for t in ts], marker=marker, ls=ls, color=colour,
                      label=f"{label} ({r['protocol']}, {r['run']})")
    ax_t.set(xlabel="prompts served T", ylabel="tau over the first T prompts",
             title=f"tau against T (runs >= {MIN_TAU_VS_T} prompts; -- frozen)")
    ax_t.legend(fontsize=6)
    return save_figure(fig, out, NAME)


def main(out_dir: str | Path, quick: bool = False) -> FigureResult:
    """Gather the committed Table 1 rows, save ``table1.csv`` / ``table1.json``, plot
    them and return the claims (the same at every scale: nothing is recomputed).

    Raises:
        FigureUnavailable: no results folder, or no committed summary with a paired comparison.
    """
    root = results_root()
    rows = table_rows(root)
    if not rows:
        raise FigureUnavailable(f"no committed stream-scale summary with a paired comparison under {root}")
    out = Path(out_dir)
    table = [{k: r[k] for k in COLUMNS} for r in rows]
    data = [write_csv(out / f"{NAME}.csv", table, columns=COLUMNS), write_json(out / f"{NAME}.json", rows)]
    largest = max(rows, key=lambda r: (r["prompts"], r["seeds"]))
    copies = [r for r in rows if r["also_in"]]
    copied = "; ".join(f"{r['method']} of {r['run']} (also in {r['also_in']})" for r in copies)
    notes = [f"Read from {len({r['run'] for r in rows})} committed runs (results/stream_scale*/summary-*.json); "
             "nothing is recomputed here. Gains are paired per-prompt tau ratios minus 1, 95 % t intervals on "
             "the log ratios; speedups are priced (background: updates off the decoder, OnlineSpec App. B.2; "
             "serial: the decoder waits for them). Runs differ in sub-stream, seeds and update mode (chunk or "
             "round): see results/<folder>/README.md."
             + (f" Rows of copied runs are kept once: {copied}." if copies else ""),
             "Rerun a row: `specloop stream record --from-answers data/answers/sharegpt-heldout-1200 --out REC` "
             "(about 40 minutes), then the command in results/<folder>/README.md with REC as its recording (older "
             "READMEs name the folder the recording had then); update_hours (one thread) is "
             f"most of a run's time, e.g. {largest['update_hours']:.1f} h for {largest['method']} over "
             f"{largest['prompts']} prompts. The runs still to do and their hours: results/table1/README.md."]
    return FigureResult(name=NAME, title="Table 1: online drafts against their frozen drafts (committed replays)",
                        data_paths=data, image_paths=_plot(rows, out), claims=claims(rows), table=table,
                        numbers={"runs": len({r["run"] for r in rows}), "rows": len(rows),
                                 "largest_prompts": largest["prompts"],
                                 "update_hours_total": sum(r["update_hours"] for r in rows)},
                        notes=notes)
