"""Speedup (acceleration rate gamma) for linear and measured cost models.

Sources: OnlineSpec Eq. (7) (proof of Theorem 1): with a draft step costing a
seconds, a target forward A seconds and cost_ratio = a / A,
gamma = E[n_t] / (cost_ratio * k + 1); Leviathan et al. 2023 Theorem 3.8 is the same
expression with c for cost_ratio. `speedup_measured` replaces the constant verify
cost A by a measured cost that depends on the number of verified tokens (k + 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from specloop.theory._validation import validate_nonnegative, validate_num_draft_tokens
from specloop.theory.tokens import expected_tokens_chain

__all__ = ["VerifyCostTable", "speedup_linear", "speedup_measured", "speedup_upper_bound"]


@dataclass(frozen=True)
class VerifyCostTable:
    """Measured seconds of one target verification forward vs the number of tokens verified.

    Evaluation (``table(n)``): piecewise-linear interpolation between the measured
    points; past the last point, linear extrapolation along the last segment; before
    the first point, linear extrapolation along the first segment, clipped at 0
    seconds. A single-point table is constant. The simulator's cost model reuses it.

    Attributes:
        num_tokens: (M,) strictly increasing token counts, >= 1 (tokens).
        seconds: (M,) non-negative finite seconds per verification forward.
    Raises:
        ValueError: empty or mismatched arrays, non-increasing or < 1 token counts,
            NaN / negative / infinite seconds.
    """

    num_tokens: np.ndarray
    seconds: np.ndarray

    def __post_init__(self) -> None:
        n = np.asarray(self.num_tokens, dtype=np.float64).reshape(-1)
        s = np.asarray(self.seconds, dtype=np.float64).reshape(-1)
        if n.size == 0 or n.size != s.size:
            raise ValueError(f"VerifyCostTable needs equally long, non-empty num_tokens and "
                             f"seconds, got {n.size} and {s.size}")
        if not np.all(np.isfinite(n)) or (n < 1).any() or (np.diff(n) <= 0).any():
            raise ValueError(f"VerifyCostTable.num_tokens must be finite, >= 1 and strictly "
                             f"increasing, got {n.tolist()}")
        validate_nonnegative(s, "VerifyCostTable.seconds")
        object.__setattr__(self, "num_tokens", n)
        object.__setattr__(self, "seconds", s)

    def __call__(self, num_tokens) -> np.ndarray:
        """Seconds for verifying ``num_tokens`` tokens (array-like, >= 0); float64 array."""
        x = validate_nonnegative(num_tokens, "num_tokens")
        n, s = self.num_tokens, self.seconds
        if n.size == 1:
            return np.broadcast_to(s[0], x.shape).astype(np.float64)
        out = np.interp(x, n, s)
        hi_slope = (s[-1] - s[-2]) / (n[-1] - n[-2])
        lo_slope = (s[1] - s[0]) / (n[1] - n[0])
        out = np.where(x > n[-1], s[-1] + hi_slope * (x - n[-1]), out)
        out = np.where(x < n[0], np.maximum(s[0] + lo_slope * (x - n[0]), 0.0), out)
        return out


def speedup_linear(acceptance_rate, num_draft_tokens, cost_ratio,
                   convention: str = "committed") -> np.ndarray:
    """gamma = E[n_t] / (cost_ratio * k + 1) (OnlineSpec Eq. (7)).

    Args:
        acceptance_rate: Acc in [0, 1].
        num_draft_tokens: k >= 0 (tokens).
        cost_ratio: a / A >= 0 (draft step seconds over target forward seconds).
        convention: counting of E[n_t], see `specloop.theory.tokens`.
    Returns:
        float64 array (broadcast of the inputs), the speedup over autoregressive decoding.
    Raises:
        ValueError: Acc outside [0, 1]; k < 0; cost_ratio < 0, NaN or inf.
    """
    tokens = expected_tokens_chain(acceptance_rate, num_draft_tokens, convention)
    k = validate_num_draft_tokens(num_draft_tokens)
    ratio = validate_nonnegative(cost_ratio, "cost_ratio")
    return tokens / (ratio * k + 1.0)


def speedup_upper_bound(num_draft_tokens, cost_ratio) -> np.ndarray:
    """(k + 1) / (cost_ratio * k + 1): Theorem 1's upper bound (Acc = 1), float64."""
    k = validate_num_draft_tokens(num_draft_tokens)
    ratio = validate_nonnegative(cost_ratio, "cost_ratio")
    return (k + 1.0) / (ratio * k + 1.0)


VerifyCost = Union[VerifyCostTable, Callable[[np.ndarray], np.ndarray]]


def speedup_measured(acceptance_rate, num_draft_tokens, draft_time, verify_time_fn_or_table:
                     VerifyCost, target_time, convention: str = "committed") -> np.ndarray:
    """gamma = E[n_t] * target_time / (k * draft_time + verify_time(k + 1)).

    Plain autoregressive decoding commits one token per target forward of
    ``target_time`` seconds; a speculative round costs k draft steps plus one
    verification forward over the k + 1 tokens (k drafts + the last committed token).

    Args:
        acceptance_rate: Acc in [0, 1].
        num_draft_tokens: k >= 0 (tokens); broadcasts with acceptance_rate.
        draft_time: seconds per draft step, >= 0.
        verify_time_fn_or_table: `VerifyCostTable` or a callable mapping an array of
            verified-token counts to seconds.
        target_time: seconds of one plain target forward (1 token), > 0.
        convention: counting of E[n_t], see `specloop.theory.tokens`.
    Returns:
        float64 array of speedups.
    Raises:
        ValueError: invalid Acc/k; negative or NaN times; target_time == 0; the verify
            cost returning NaN, negative values or a round costing 0 seconds.
    """
    tokens = expected_tokens_chain(acceptance_rate, num_draft_tokens, convention)
    k = validate_num_draft_tokens(num_draft_tokens)
    a = validate_nonnegative(draft_time, "draft_time")
    big_a = validate_nonnegative(target_time, "target_time")
    if (big_a <= 0).any():
        raise ValueError("target_time must be > 0 seconds")
    if not callable(verify_time_fn_or_table):
        raise ValueError("verify_time_fn_or_table must be a VerifyCostTable or a callable")
    verify = validate_nonnegative(np.asarray(verify_time_fn_or_table(k + 1.0), np.float64),
                                  "verify time")
    round_time = k * a + verify
    if (round_time <= 0).any():
        raise ValueError("a speculative round must cost > 0 seconds (draft + verify)")
    return tokens * big_a / round_time
