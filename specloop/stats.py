"""Statistics of measured comparisons: the verdict rule and the paired intervals it
rests on (used by the report, the figures and the stream results). Every verdict that
compares measurements carries its effect estimate, the confidence interval of that estimate
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
  `paired_gain` gives the prompt stream (per-prompt accepted lengths), through the
  same `log_ratio_t_interval`;
* `difference_estimate`: paired differences (e.g. per seed): mean with a Student-t
  interval.

Exact verdicts (the theory check's counterexample search, closed-form efficiencies)
are not comparisons of measurements and keep their plain true/false.

The claim dicts a figure returns (`measured_claim`, `all_of`, `verdict_of`) are built
in `specloop.report.verdicts`, which re-exports these names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

__all__ = ["HOLDS", "DOES_NOT_HOLD", "UNDECIDED", "VERDICTS", "CONFIDENCE", "Estimate", "decide",
           "ratio_estimate", "difference_estimate", "log_ratio_t_interval", "paired_gain"]

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
    (mapped back by exp), as `paired_gain` does for the stream.

    Args:
        ratios: positive ratios, one per pair (e.g. tokens/s of A / tokens/s of B on
            the same prompt and pass).
        statistic: description for the report (what a ratio is, what a pair is).

    Raises:
        ValueError: no ratios, a ratio <= 0 or not finite, confidence outside (0, 1).
    """
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


def log_ratio_t_interval(log_ratio: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean of paired log ratios and the half-width of its two-sided Student-t
    interval (NaN for fewer than 2 values); ``exp(mean -+ half)`` bounds the
    geometric-mean ratio.

    Raises:
        ValueError: confidence outside (0, 1), or no values.
    """
    from scipy import stats
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    values = np.asarray(log_ratio, dtype=float)
    if values.size == 0:
        raise ValueError("no log ratios")
    n = values.size
    if n < 2:
        return float(values.mean()), math.nan
    return float(values.mean()), float(stats.t.ppf(0.5 + confidence / 2, n - 1) * values.std(ddof=1) / math.sqrt(n))


def paired_gain(frozen: Sequence[dict], online: Sequence[dict], confidence: float = 0.95) -> dict:
    """Per-prompt paired gain of ``online`` over ``frozen`` in mean accepted length.

    Args:
        frozen / online: `per_prompt_counts` rows; only prompts present in both count.
        confidence: two-sided level of the interval, in (0, 1).

    Returns:
        ``n`` (paired prompts), ``gain`` (geometric-mean ratio - 1), ``gain_ci``
        ([lo, hi], Student-t interval on the mean log ratio, mapped back; NaN for
        n < 2), ``pooled_gain`` (ratio of round-weighted taus over the paired
        prompts - 1), ``better`` / ``worse`` / ``ties`` (prompt counts), and
        ``wilcoxon_p`` (two-sided Wilcoxon signed-rank test of the per-prompt tau
        differences, scipy.stats.wilcoxon; 1.0 when every pair ties, NaN for n < 2).

    Raises:
        ValueError: confidence outside (0, 1), or a prompt with zero rounds.
    """
    from scipy import stats
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    a = {p["index"]: p for p in frozen}
    b = {p["index"]: p for p in online}
    shared = sorted(set(a) & set(b))
    if any(a[i]["rounds"] < 1 or b[i]["rounds"] < 1 for i in shared):
        raise ValueError("a prompt with zero rounds has no mean accepted length")
    tau_f = np.array([a[i]["tokens"] / a[i]["rounds"] for i in shared], dtype=float)
    tau_o = np.array([b[i]["tokens"] / b[i]["rounds"] for i in shared], dtype=float)
    n = len(shared)
    out = {"n": n, "better": int(np.sum(tau_o > tau_f)), "worse": int(np.sum(tau_o < tau_f)),
           "ties": int(np.sum(tau_o == tau_f)), "gain": math.nan, "gain_ci": [math.nan, math.nan],
           "pooled_gain": math.nan, "wilcoxon_p": math.nan}
    if n == 0:
        return out
    log_ratio = np.log(tau_o / tau_f)
    out["gain"] = float(np.expm1(log_ratio.mean()))
    out["pooled_gain"] = float(sum(b[i]["tokens"] for i in shared) / sum(b[i]["rounds"] for i in shared)
                               / (sum(a[i]["tokens"] for i in shared) / sum(a[i]["rounds"] for i in shared)) - 1)
    if n >= 2:
        half = log_ratio_t_interval(log_ratio, confidence)[1]
        out["gain_ci"] = [float(np.expm1(log_ratio.mean() - half)), float(np.expm1(log_ratio.mean() + half))]
        diff = tau_o - tau_f
        out["wilcoxon_p"] = 1.0 if not np.any(diff) else float(stats.wilcoxon(diff).pvalue)
    return out
