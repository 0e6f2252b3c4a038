"""Write DIR/report.md from the parts' results: a status table, the verdicts, the
theory-check table, every figure embedded with its numbers and table, and the
machine and versions."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specloop.figures._base import fmt
from specloop.report.machine import UNDER_LOAD_FACTOR
from specloop.report.parts import PartResult
from specloop.report.verdicts import DOES_NOT_HOLD, HOLDS, UNDECIDED, verdict_of

__all__ = ["write_report", "markdown_table", "collect_claims", "summary_line", "VERDICT_COLUMNS"]

_THEORY_COLUMNS = ("claim", "holds", "cases", "violations", "worst_ratio", "counterexample")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``rows`` (dicts); numbers via `fmt`.

    Returns '' for no rows.
    """
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [_cell(row.get(c)) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, (dict, list)):
        text = str(value)
        text = text if len(text) <= 80 else text[:77] + "..."
    else:
        text = fmt(value)
    return text.replace("|", "\\|").replace("\n", " ")


def collect_claims(results: Iterable[PartResult]) -> list[dict]:
    """Every verdict the parts computed: the theory check's claims and each
    figure's ``claims``; each row has ``source``, ``claim``, ``statement``,
    ``verdict`` (holds / **does not hold** / undecided), ``effect``, ``interval``,
    ``n`` and ``statistic`` (for a measured comparison, `specloop.report.verdicts`;
    "exact" / "—" otherwise) and ``evidence``."""
    rows = []
    for res in results:
        if res.status != "ok":
            continue
        for claim in res.data.get("claims", []):
            rows.append({"source": f"{res.name} (specloop theory check)",
                         "claim": claim.get("claim"), "statement": claim.get("statement", ""),
                         "verdict": _verdict(claim), **_statistics(claim, exact=True),
                         "evidence": _theory_evidence(claim)})
        under_load = bool(res.load.get("under_load"))
        for claim in (res.figure or {}).get("claims", []):
            marked = under_load and bool(claim.get("wall_clock"))
            evidence = claim.get("evidence", "")
            if marked:
                evidence = (f"measured under load: mean 1-minute load {res.load['mean']:.1f} "
                            f"(max {res.load['max']:.1f}) on {res.load.get('cores')} cores"
                            + (f"; {evidence}" if evidence else ""))
            rows.append({"source": res.name, "claim": claim.get("claim"),
                         "statement": claim.get("statement", ""),
                         "verdict": _verdict(claim) + (" (under load)" if marked else ""),
                         **_statistics(claim), "evidence": evidence, "under_load": marked})
    return rows


def _verdict(claim: Mapping[str, Any]) -> str:
    verdict = verdict_of(claim)
    return f"**{verdict}**" if verdict == DOES_NOT_HOLD else verdict


def _statistics(claim: Mapping[str, Any], exact: bool = False) -> dict:
    """The effect, interval, n and statistic cells of one claim."""
    if not claim.get("measured"):
        return {"effect": None, "interval": "—", "n": None,
                "statistic": "exact (counterexample search)" if exact else "check on the computed numbers"}
    lo, hi = claim.get("interval") or (None, None)
    interval = f"[{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None else "none (n < 2)"
    side = ">" if claim.get("direction", "greater") == "greater" else "<"
    return {"effect": claim.get("effect"), "interval": interval, "n": claim.get("n"),
            "statistic": f"{claim.get('statistic', '')}; claim: effect {side} {fmt(claim.get('threshold'))}"}


def _theory_evidence(claim: Mapping[str, Any]) -> str:
    parts = [f"{k}={fmt(claim.get(k))}" for k in ("cases", "violations", "worst_ratio")
             if k in claim]
    return ", ".join(parts)


VERDICT_COLUMNS = ("claim", "source", "statement", "verdict", "effect", "interval", "n", "statistic",
                   "evidence")
_VERDICT_RULE = [
    "A verdict on a measured comparison gives the effect, its 95 % interval and the sample size n: "
    "it *holds* only when the whole interval lies on the claimed side of the claimed size (or of "
    "no effect: 1 for a ratio, 0 for a difference), *does not hold* when the whole interval lies on "
    "the other side, and is *undecided* otherwise (`specloop.report.verdicts`). Exact verdicts "
    "(counterexample searches, closed forms, bound checks on computed numbers) have no interval. "
    "A verdict on measured times from a part whose mean 1-minute load exceeded "
    f"{UNDER_LOAD_FACTOR:g} x the cores is marked *(under load)*: another job shared the cores.", ""]


def summary_line(claims: Sequence[Mapping[str, Any]]) -> str:
    """"H hold, D do not hold, U undecided." over `collect_claims` rows (measured
    ones counted separately in brackets)."""
    def count(rows, verdict):
        return sum(r["verdict"].removesuffix(" (under load)").strip("*") == verdict for r in rows)
    measured = [c for c in claims if c.get("n") is not None]
    loaded = [c for c in claims if c.get("under_load")]
    line = (f"{count(claims, HOLDS)} hold, {count(claims, DOES_NOT_HOLD)} do not hold, "
            f"{count(claims, UNDECIDED)} undecided (measured comparisons: {count(measured, HOLDS)} / "
            f"{count(measured, DOES_NOT_HOLD)} / {count(measured, UNDECIDED)} of {len(measured)}).")
    if loaded:
        line += (f" {len(loaded)} wall-clock verdict{'s' if len(loaded) > 1 else ''} "
                 f"({count(loaded, HOLDS)} / {count(loaded, DOES_NOT_HOLD)} / {count(loaded, UNDECIDED)}) "
                 f"{'were' if len(loaded) > 1 else 'was'} measured under load (mean 1-minute load above "
                 f"{UNDER_LOAD_FACTOR:g} x the cores) and {'are' if len(loaded) > 1 else 'is'} marked "
                 "*under load*: rerun on a quiet machine before relying on them.")
    return line


def write_report(out_dir: str | os.PathLike, results: Sequence[PartResult], machine: Mapping,
                 config: Mapping[str, Any], total_seconds: float) -> Path:
    """Write ``out_dir/report.md`` and return its path."""
    out = Path(out_dir)
    lines: list[str] = ["# specloop reproduce report", ""]
    lines += [f"Configuration: {', '.join(f'{k}={v}' for k, v in config.items())}. "
              f"Wall time of this invocation: {total_seconds:.0f} s "
              f"(parts reused from an earlier run count their original time below).", ""]
    lines += ["## Parts", "", markdown_table(
        [{"part": r.name, "status": r.status, "seconds": r.seconds, "reused": r.reused,
          "load (1-min mean / max)": _load_cell(r.load), "reason": r.reason} for r in results]), ""]
    claims = collect_claims(results)
    lines += ["## Verdicts on the papers' stated results", "",
              "Each verdict is computed from this run's numbers (never from the papers' text).", ""]
    lines += _VERDICT_RULE
    if claims:
        lines += [summary_line(claims), ""]
    lines += [markdown_table(claims, VERDICT_COLUMNS)
              if claims else "No verdicts: no part that computes one finished.", ""]
    for res in results:
        lines += _part_section(res, out)
    lines += ["## Machine and versions", "",
              "Timings depend on the load of the machine: each part's 1-minute load averages are "
              "in the Parts table; the averages below were taken at the end of the run.", ""]
    lines += [f"- {k}: {v}" for k, v in machine.items() if k != "versions"]
    lines += [f"- {k} {v}" for k, v in machine.get("versions", {}).items()]
    lines.append("")
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _load_cell(load: Mapping[str, Any]) -> str:
    """The Parts table's load cell: mean / max 1-minute load over the part, marked
    when the part ran under load (`specloop.report.machine.LoadMonitor`)."""
    if not load or load.get("mean") is None:
        return "—"
    return f"{load['mean']:.1f} / {load['max']:.1f}" + (" **under load**" if load.get("under_load") else "")


def _part_section(res: PartResult, out: Path) -> list[str]:
    title = (res.figure or {}).get("title") or res.name
    lines = [f"## {res.name}: {title}", ""]
    if res.status != "ok":
        lines += [f"Status: **{res.status}** — {res.reason}", ""]
        return lines
    if res.name == "theory":
        rows = res.data.get("claims", [])
        cols = [c for c in _THEORY_COLUMNS if rows and c in rows[0]]
        lines += [markdown_table(rows, cols or None), ""]
    fig = res.figure or {}
    for image in fig.get("image_paths", []):
        if image.endswith(".png"):
            rel = os.path.relpath(image, out)
            lines += [f"![{res.name}]({rel})", ""]
    numbers = fig.get("numbers", {})
    if numbers:
        lines += [markdown_table([{"quantity": k, "value": v} for k, v in numbers.items()]), ""]
    if fig.get("table"):
        lines += [markdown_table(fig["table"]), ""]
    for note in fig.get("notes", []):
        lines += [f"- {note}"]
    data_files = [os.path.relpath(p, out) for p in fig.get("data_paths", [])]
    if data_files:
        lines += ["", "Data: " + ", ".join(f"`{p}`" for p in data_files)]
    lines += ["", f"({res.seconds:.0f} s{', reused' if res.reused else ''})", ""]
    return lines
