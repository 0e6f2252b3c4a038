"""Verdicts on measured comparisons (issue 18): every verdict that compares
measurements carries its effect estimate, the confidence interval of that estimate
and the sample size it rests on, and says "holds" only when the interval says so.

The rule (`decide`), for a claim "the effect is greater than the threshold" (the
threshold is the claimed size when the claim has one, else the no-effect value:
1 for a ratio, 0 for a difference):

* **holds** -- the whole interval lies above the threshold;
* **does not hold** -- the whole interval lies below it;
* **undecided** -- the interval contains it, or there is no interval (n < 2, NaN).

A claim "less than" mirrors it. The intervals come from the data:

* `ratio_estimate`: paired ratios (per prompt, per (pass, prompt), per episode):
  geometric mean with a Student-t interval on the mean log ratio -- the interval
  `specloop.realmodels.streams.compare.paired_gain` gives the prompt stream, through
  the same `log_ratio_t_interval`;
* `difference_estimate`: paired differences (e.g. per seed): mean with a Student-t
  interval.

Exact verdicts (the theory check's counterexample search, closed-form efficiencies)
are not comparisons of measurements and keep their plain true/false.

`measured_claim` builds the claim dict a figure returns (`FigureResult.claims`) and
`all_of` the verdict on a claim that needs several comparisons to hold at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["HOLDS", "DOES_NOT_HOLD", "UNDECIDED", "VERDICTS", "Estimate", "decide",
           "ratio_estimate", "difference_estimate", "measured_claim", "all_of", "verdict_of"]

HOLDS, DOES_NOT_HOLD, UNDECIDED = "holds", "does not hold", "undecided"
VERDICTS = (HOLDS, DOES_NOT_HOLD, UNDECIDED)
CONFIDENCE = 0.95
_DIRECTIONS = ("greater", "less")


@dataclass(frozen=True)
class Estimate:
    """A measured effect with its interval.

    Attributes:
        effect: the point estimate (a ratio or a difference; units of the data).
        interval: (lo, hi), the two-sided `confidence` interval (NaN, NaN when n < 2).
        n: the number of paired observations it rests on.
        statistic: how it was computed, in words (for the report).
        confidence: the interval's level, in (0, 1).
    """

    effect: float
    interval: tuple[float, float]
    n: int
    statistic: str
    confidence: float = CONFIDENCE


def decide(effect: float, interval: Sequence[float], n: int, direction: str = "greater",
           claimed_size: float | None = None, null: float = 0.0) -> str:
    """The verdict on a measured comparison.

    Args:
        effect: point estimate (only checked: it must lie in the interval when all
            three numbers are finite).
        interval: (lo, hi) confidence interval of the effect.
        n: sample size; below 2 there is no interval and the verdict is undecided.
        direction: ``"greater"`` (the claim: effect > threshold) or ``"less"``.
        claimed_size: the size the claim states (e.g. 1.3 for ">= 1.3x"); None: the
            claim is only the direction, and the threshold is ``null``.
        null: the no-effect value (1.0 for ratios, 0.0 for differences).

    Returns:
        `HOLDS` when the interval lies entirely on the claimed side of the
        threshold, `DOES_NOT_HOLD` when entirely on the other side, else `UNDECIDED`.

    Raises:
        ValueError: unknown direction, lo > hi, n < 0, or an effect outside its interval.
    """
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
    if int(n) < 0:
        raise ValueError(f"sample size n must be >= 0, got {n}")
    lo, hi = (float(x) for x in interval)
    if lo > hi:
        raise ValueError(f"interval must have lo <= hi, got [{lo}, {hi}]")
    if int(n) < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNDECIDED
    if math.isfinite(effect) and not lo <= effect <= hi:
        raise ValueError(f"effect {effect} lies outside its interval [{lo}, {hi}]")
    threshold = float(null if claimed_size is None else claimed_size)
    above, below = lo > threshold, hi < threshold
    if direction == "less":
        above, below = below, above
    return HOLDS if above else DOES_NOT_HOLD if below else UNDECIDED


def ratio_estimate(ratios: Iterable[float], statistic: str,
                   confidence: float = CONFIDENCE) -> Estimate:
    """Geometric mean of paired ratios with a Student-t interval on the mean log ratio
    (mapped back by exp), as `stream_compare.paired_gain` does for the stream.

    Args:
        ratios: positive ratios, one per pair (e.g. tokens/s of A / tokens/s of B on
            the same prompt and pass).
        statistic: description for the report (what a ratio is, what a pair is).

    Raises:
        ValueError: no ratios, a ratio <= 0 or not finite, confidence outside (0, 1).
    """
    from specloop.realmodels.streams.compare import log_ratio_t_interval
    values = np.asarray(list(ratios), dtype=float)
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"ratios must be positive and finite (at least one), got {values.tolist()}")
    mean, half = log_ratio_t_interval(np.log(values), confidence)
    interval = (math.exp(mean - half), math.exp(mean + half)) if math.isfinite(half) else (math.nan, math.nan)
    return Estimate(math.exp(mean), interval, int(values.size), statistic, confidence)


def difference_estimate(differences: Iterable[float], statistic: str,
                        confidence: float = CONFIDENCE) -> Estimate:
    """Mean of paired differences with a Student-t interval (NaN interval for n < 2;
    zero width when every difference is equal).

    Raises:
        ValueError: no differences, a difference not finite, confidence outside (0, 1).
    """
    from scipy import stats
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    values = np.asarray(list(differences), dtype=float)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"differences must be finite (at least one), got {values.tolist()}")
    mean = float(values.mean())
    if values.size < 2:
        return Estimate(mean, (math.nan, math.nan), 1, statistic, confidence)
    half = float(stats.t.ppf(0.5 + confidence / 2, values.size - 1) * values.std(ddof=1)
                 / math.sqrt(values.size))
    return Estimate(mean, (mean - half, mean + half), int(values.size), statistic, confidence)


def measured_claim(claim: str, statement: str, estimate: Estimate | None, *, null: float,
                   direction: str = "greater", claimed_size: float | None = None, evidence: str = "",
                   why_missing: str = "") -> dict:
    """A figure's claim dict for a measured comparison: ``claim``, ``statement``,
    ``verdict`` (one of `VERDICTS`), ``holds`` (True / False / None for the same),
    ``effect``, ``interval`` ([lo, hi]), ``n``, ``threshold``, ``direction``,
    ``statistic``, ``measured`` (True) and ``evidence``. ``estimate`` None (the data
    has no paired samples): undecided, with ``why_missing`` as the evidence. ``null``:
    the no-effect value (1.0 for a ratio, 0.0 for a difference); see `decide`."""
    threshold = float(null if claimed_size is None else claimed_size)
    if estimate is None:
        return {"claim": claim, "statement": statement, "verdict": UNDECIDED, "holds": None,
                "effect": None, "interval": [None, None], "n": 0, "threshold": threshold,
                "direction": direction, "statistic": "no paired samples", "measured": True,
                "evidence": why_missing or evidence}
    verdict = decide(estimate.effect, estimate.interval, estimate.n, direction, claimed_size, null)
    return {"claim": claim, "statement": statement, "verdict": verdict, "holds": _holds(verdict),
            "effect": estimate.effect, "interval": [estimate.interval[0], estimate.interval[1]],
            "n": estimate.n, "threshold": threshold, "direction": direction,
            "statistic": f"{estimate.statistic}; {100 * estimate.confidence:g} % interval",
            "measured": True, "evidence": evidence}


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
