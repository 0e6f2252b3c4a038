"""Paired comparisons of stream methods (issue 7): an online draft against its frozen
counterpart on the same prompts.

Every method of one ``specloop stream`` run serves the same prompts, so the fair
comparison is paired per prompt: ratio_i = tau_online,i / tau_frozen,i of the mean
accepted lengths (tokens per round) on prompt i. Prompt-to-prompt spread in tau is
large (code vs chat, repetition), so a paired test sees gains that a comparison of
two pooled means would miss, and does not mistake a prompt mix for a gain.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

__all__ = ["per_prompt_counts", "paired_gain", "domain_accepted_length", "log_ratio_t_interval"]


def per_prompt_counts(records: Iterable) -> list[dict]:
    """Rounds and emitted tokens per prompt.

    Args:
        records: `specloop.record.RoundRecord` s (any order) with ``stream_index``
            and ``tokens_per_round``.

    Returns:
        ``[{"index", "rounds", "tokens"}]`` sorted by prompt index; the prompt's mean
        accepted length is tokens / rounds (tokens per target forward).
    """
    counts: dict[int, list[int]] = {}
    for r in records:
        row = counts.setdefault(int(r.stream_index), [0, 0])
        row[0] += 1
        row[1] += int(r.tokens_per_round)
    return [{"index": i, "rounds": n, "tokens": t} for i, (n, t) in sorted(counts.items())]


def domain_accepted_length(prompts: Sequence[dict], domains: Sequence[str]) -> dict[str, float]:
    """Round-weighted mean accepted length per domain (tokens / rounds over its prompts).

    Args:
        prompts: `per_prompt_counts` rows.
        domains: dataset name of each stream position (``domains[index]``).

    Raises:
        IndexError: a prompt index outside ``domains``.
    """
    totals: dict[str, list[int]] = {}
    for p in prompts:
        row = totals.setdefault(domains[p["index"]], [0, 0])
        row[0] += p["rounds"]
        row[1] += p["tokens"]
    return {d: t / n for d, (n, t) in totals.items() if n}


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
