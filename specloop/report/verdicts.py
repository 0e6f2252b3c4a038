"""Claim dicts for the report: `measured_claim` builds the claim a figure returns
(`FigureResult.claims`) from an `Estimate`, `all_of` the verdict on a claim that needs
several comparisons to hold at once, `verdict_of` a claim dict's verdict.

The verdict rule itself (`decide`) and the intervals (`ratio_estimate`,
`difference_estimate`) live in `specloop.stats`; they are re-exported here so the
report and figure code can take everything it needs from one module.

Exact verdicts (the theory check's counterexample search, closed-form efficiencies)
are not comparisons of measurements and keep their plain true/false.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from specloop.stats import (CONFIDENCE, DOES_NOT_HOLD, HOLDS, UNDECIDED, VERDICTS, Estimate, decide,
                            difference_estimate, ratio_estimate)

__all__ = ["HOLDS", "DOES_NOT_HOLD", "UNDECIDED", "VERDICTS", "CONFIDENCE", "Estimate", "decide",
           "ratio_estimate", "difference_estimate", "measured_claim", "all_of", "verdict_of"]


def measured_claim(claim: str, statement: str, estimate: Estimate | None, *, null: float,
                   direction: str = "greater", claimed_size: float | None = None, evidence: str = "",
                   why_missing: str = "", wall_clock: bool = False) -> dict:
    """A figure's claim dict for a measured comparison: ``claim``, ``statement``,
    ``verdict`` (one of `VERDICTS`), ``holds`` (True / False / None for the same),
    ``effect``, ``interval`` ([lo, hi]), ``n``, ``threshold``, ``direction``,
    ``statistic``, ``measured`` (True) and ``evidence``. ``estimate`` None (the data
    has no paired samples): undecided, with ``why_missing`` as the evidence. ``null``:
    the no-effect value (1.0 for a ratio, 0.0 for a difference); see `decide`.
    ``wall_clock``: the comparison is of measured times (kept as ``wall_clock``; the
    report marks such a verdict when its part ran under load)."""
    threshold = float(null if claimed_size is None else claimed_size)
    if estimate is None:
        return {"claim": claim, "statement": statement, "verdict": UNDECIDED, "holds": None,
                "effect": None, "interval": [None, None], "n": 0, "threshold": threshold,
                "direction": direction, "statistic": "no paired samples", "measured": True,
                "wall_clock": bool(wall_clock), "evidence": why_missing or evidence}
    verdict = decide(estimate.effect, estimate.interval, estimate.n, direction, claimed_size, null)
    return {"claim": claim, "statement": statement, "verdict": verdict, "holds": _holds(verdict),
            "effect": estimate.effect, "interval": [estimate.interval[0], estimate.interval[1]],
            "n": estimate.n, "threshold": threshold, "direction": direction,
            "statistic": f"{estimate.statistic}; {100 * estimate.confidence:g} % interval",
            "measured": True, "wall_clock": bool(wall_clock), "evidence": evidence}


def all_of(claim: str, statement: str, parts: Sequence[tuple[str, dict]], evidence: str = "") -> dict:
    """One claim that needs every part (``(label, measured_claim dict)``) to hold:
    holds when all hold, does not hold when any does not, else undecided. Its
    effect / interval / n are those of the deciding part: the first that does not
    hold, else the one whose interval lies closest to (or across) its threshold.

    Raises:
        ValueError: no parts.
    """
    if not parts:
        raise ValueError(f"claim {claim!r} has no comparisons")
    verdicts = [p["verdict"] for _, p in parts]
    verdict = DOES_NOT_HOLD if DOES_NOT_HOLD in verdicts else HOLDS if set(verdicts) == {HOLDS} else UNDECIDED
    label, part = min(parts, key=lambda lp: (lp[1]["verdict"] != DOES_NOT_HOLD, _margin(lp[1])))
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts)
    return {**part, "claim": claim, "statement": statement, "verdict": verdict, "holds": _holds(verdict),
            "wall_clock": any(p.get("wall_clock", False) for _, p in parts),
            "statistic": f"{part['statistic']}; shown: {label} (the deciding comparison of {len(parts)})",
            "evidence": f"{counts}" + (f"; {evidence}" if evidence else "")}


def _margin(part: Mapping[str, Any]) -> float:
    """How far the interval clears the threshold on the claimed side (negative:
    it crosses or misses it; -inf without an interval)."""
    lo, hi = part["interval"]
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return -math.inf
    return lo - part["threshold"] if part["direction"] == "greater" else part["threshold"] - hi


def _holds(verdict: str) -> bool | None:
    return True if verdict == HOLDS else False if verdict == DOES_NOT_HOLD else None


def verdict_of(claim: Mapping[str, Any]) -> str:
    """A claim dict's verdict: its ``verdict`` when it has one (measured claims),
    else from ``holds`` (exact claims: True / False / None)."""
    if claim.get("verdict") in VERDICTS:
        return claim["verdict"]
    holds = claim.get("holds")
    return UNDECIDED if holds is None else HOLDS if bool(holds) else DOES_NOT_HOLD
