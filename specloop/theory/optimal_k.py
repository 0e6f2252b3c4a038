"""Optimal candidate length k: exact integer argmax vs Corollary 4's closed form.

Source: OnlineSpec Appendix C.1, Corollary 4 and its proof. The speedup of a chain
of k drafts with acceptance rate Acc and cost_ratio = a / A is
gamma(k) = E[n_t](k) / (cost_ratio k + 1) (Eq. (7)), with E[n_t] counted by
``convention`` (see `specloop.theory.tokens`; the main text uses "committed",
(1 - Acc^(k+1))/(1 - Acc); the proof of Corollary 4 uses "appendix", (1 - Acc^k)/(1 - Acc)).

Exactness. E[n_t](k) is concave in k and the denominator affine, so gamma is strictly
quasi-concave for 0 < Acc < 1: "gamma(k+1) > gamma(k)" switches from true to false
exactly once, and the first k where it is false is the smallest maximiser (ties go to
the smaller k). `optimal_k_exact` binary-searches that switch using the equivalent,
cancellation-free test Acc^n(k) (c k + 1) > c E[n_t](k) in logs, and decides it in
exact rational arithmetic (``fractions.Fraction`` of the float inputs, which are exact
binary rationals) whenever the log margin is below 1e-9 and k <= 20000. Searches stop at k = 2^60 (reached only for
cost ratios below about 1e-16).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from specloop.theory._validation import validate_nonnegative, validate_unit_interval
from specloop.theory.tokens import CONVENTIONS

__all__ = ["optimal_k_exact", "optimal_k_paper", "optimal_k_efficiency",
           "round_paper_k", "speedup_scalar"]

_EXACT_K_LIMIT = 20_000
_K_CEILING = 2 ** 60


def _scalars(acceptance_rate, cost_ratio, convention):
    if np.ndim(acceptance_rate) or np.ndim(cost_ratio):
        raise ValueError("acceptance_rate and cost_ratio must be scalars here")
    acc = float(validate_unit_interval(acceptance_rate, "acceptance_rate"))
    ratio = float(validate_nonnegative(cost_ratio, "cost_ratio"))
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")
    return acc, ratio


def speedup_scalar(acc: float, k: int, ratio: float, convention: str = "committed") -> float:
    """Float speedup gamma(k) for scalar Acc, integer k >= 0, cost_ratio (no validation)."""
    n = k + 1 if convention != "appendix" else k
    tokens = float(n) if acc == 1.0 else (-math.expm1(n * math.log(acc)) / (1.0 - acc)
                                            if acc > 0.0 else float(n > 0))
    if convention == "accepted":
        tokens = max(tokens - 1.0, 0.0)
    return tokens / (ratio * k + 1.0)


def _speedup_fraction(acc: float, k: int, ratio: float, convention: str) -> Fraction:
    a, c = Fraction(acc), Fraction(ratio)
    n = k + 1 if convention != "appendix" else k
    tokens = Fraction(n) if a == 1 else (1 - a ** n) / (1 - a)
    if convention == "accepted":
        tokens -= 1
    return tokens / (c * k + 1)


def _unbounded(acc: float, ratio: float, convention: str) -> bool:
    if acc == 0.0:
        return False
    if ratio == 0.0:
        return True
    return acc == 1.0 and (convention != "committed" or ratio < 1.0)


def _search_upper(acc: float, ratio: float, convention: str) -> int:
    """A k beyond which gamma(k) < the reference value, from gamma <= 1/((1-Acc)(c k + 1))."""
    reference = speedup_scalar(acc, 0 if convention == "committed" else 1, ratio, convention)
    if reference <= 0.0:
        return 1
    bound = (1.0 / ((1.0 - acc) * reference) - 1.0) / ratio
    return _K_CEILING if not bound < _K_CEILING else int(math.ceil(bound)) + 2


def _n_tokens(k: int, convention: str) -> int:
    """Number of terms of the geometric sum E[n_t](k) (before subtracting 1 for "accepted")."""
    return k if convention == "appendix" else k + 1


def _increase_margin(acc: float, ratio: float, convention: str, k: int) -> float:
    """log of inc(k) (c k + 1) / (c N(k)); > 0 iff gamma(k+1) > gamma(k).

    With N(k) = E[n_t](k) and inc(k) = N(k+1) - N(k) = Acc^n(k):
    gamma(k+1) > gamma(k)  <=>  inc(k) (c k + 1) > c N(k). Computed in logs
    (cancellation-free), so it stays accurate where gamma itself is flat in float64.
    """
    n = _n_tokens(k, convention)
    log_a = math.log(acc)
    tokens = -math.expm1(n * log_a) / (1.0 - acc)
    if convention == "accepted":
        tokens -= 1.0
    if tokens <= 0.0:
        return math.inf
    return n * log_a + math.log1p(ratio * k) - math.log(ratio) - math.log(tokens)


def _increases_exact(acc: float, ratio: float, convention: str, k: int) -> bool:
    a, c = Fraction(acc), Fraction(ratio)
    n = _n_tokens(k, convention)
    tokens = (1 - a ** n) / (1 - a) - (1 if convention == "accepted" else 0)
    return a ** n * (c * k + 1) > c * tokens


def _increases(acc: float, ratio: float, convention: str, k: int) -> bool:
    """gamma(k+1) > gamma(k), decided exactly (Fractions) when the float margin is < 1e-9."""
    margin = _increase_margin(acc, ratio, convention, k)
    if abs(margin) < 1e-9 and k <= _EXACT_K_LIMIT:
        return _increases_exact(acc, ratio, convention, k)
    return margin > 0.0


def optimal_k_exact(acceptance_rate, cost_ratio, convention: str = "committed",
                    k_max: int | None = None) -> int:
    """argmax over integers 0 <= k (<= k_max) of gamma(k); k = 0 means do not speculate.

    Args:
        acceptance_rate: scalar Acc in [0, 1].
        cost_ratio: scalar a / A >= 0.
        convention: "committed" (main text), "appendix" (App. C.1) or "accepted".
        k_max: optional cap (int >= 0). Rule: the result is the smallest maximiser over
            0..k_max; since gamma is unimodal this is min(unconstrained argmax, k_max).
    Returns:
        int, the smallest maximiser.
    Raises:
        ValueError: Acc outside [0, 1]; cost_ratio < 0; k_max < 0; or an unbounded argmax
            (gamma strictly increasing in k: cost_ratio = 0 with Acc > 0, or Acc = 1 with
            cost_ratio < 1 -- any cost_ratio for the "appendix"/"accepted" counts) with
            ``k_max=None``.
    """
    acc, ratio = _scalars(acceptance_rate, cost_ratio, convention)
    if k_max is not None and (int(k_max) != k_max or k_max < 0):
        raise ValueError(f"k_max must be an integer >= 0, got {k_max!r}")
    cap = _K_CEILING if k_max is None else int(k_max)
    if _unbounded(acc, ratio, convention):
        if k_max is None:
            raise ValueError(f"the speedup increases without bound in k at acceptance_rate={acc}, "
                             f"cost_ratio={ratio} ({convention} counting); pass k_max to cap it")
        return cap
    if acc == 0.0 or (acc == 1.0 and ratio >= 1.0):
        base = 1 if (convention == "appendix" and acc == 0.0) else 0
        return min(base, cap)
    lo, hi = 0, min(_search_upper(acc, ratio, convention), cap)
    while lo < hi:  # first k with gamma(k+1) <= gamma(k): the smallest maximiser
        mid = (lo + hi) // 2
        if _increases(acc, ratio, convention, mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def optimal_k_paper(acceptance_rate, cost_ratio):
    """Corollary 4's closed form k = C / (cost_ratio (1 - Acc)), unrounded.

    C = -1 + Acc + sqrt(1 - 2Acc + Acc^2 + 3c - 4 Acc c + Acc^2 c) with c = cost_ratio.
    Computed in the algebraically equal, cancellation-free form (u = 1 - Acc)
    k = (2 + u) / (u + sqrt(u^2 + c u (2 + u))), which also gives the limits:
    k = (2 + u)/(2u) at c = 0 and k = +inf at Acc = 1. It is the positive root of
    c u k^2 + 2 u k - (2 + u) = 0, the stationarity condition of the proof's
    second-order Taylor approximation of the "appendix" speedup.

    Args:
        acceptance_rate: Acc in [0, 1] (array-like); cost_ratio: c >= 0 (array-like).
    Returns:
        float for scalar inputs, else a float64 array (inf where Acc = 1).
    Raises:
        ValueError: Acc outside [0, 1] or NaN; cost_ratio < 0, NaN or inf.
    """
    acc = validate_unit_interval(acceptance_rate, "acceptance_rate")
    ratio = validate_nonnegative(cost_ratio, "cost_ratio")
    u = 1.0 - acc
    with np.errstate(divide="ignore"):
        k = (2.0 + u) / (u + np.sqrt(u * u + ratio * u * (2.0 + u)))
    return float(k) if np.ndim(k) == 0 else k


def round_paper_k(k_paper: float) -> float:
    """Rounding rule for the closed form: nearest integer (halves up), clipped at >= 0; inf stays inf."""
    if math.isinf(k_paper):
        return math.inf
    return float(max(0, math.floor(k_paper + 0.5)))


def _speedup_limit(acc: float, ratio: float, convention: str) -> float:
    """lim_{k->inf} gamma(k)."""
    if ratio > 0.0:
        return 1.0 / ratio if acc == 1.0 else 0.0
    if acc == 1.0:
        return math.inf
    return (acc if convention == "accepted" else 1.0) / (1.0 - acc)


def optimal_k_efficiency(acceptance_rate, cost_ratio, convention: str = "committed",
                         k_max: int | None = None) -> float:
    """speedup(rounded closed-form k) / speedup(exact k), in [0, 1].

    Rounding: `round_paper_k` (nearest integer, halves up, clipped at >= 0), then capped
    at k_max if given. Degenerate inputs never give NaN: where the exact argmax is
    unbounded the denominator is the supremum lim_k gamma(k); where the closed form is
    infinite (Acc = 1) its speedup is that limit; inf / inf and 0 / 0 count as 1.

    Raises:
        ValueError: as `optimal_k_exact` (except the unbounded case, handled above).
    """
    acc, ratio = _scalars(acceptance_rate, cost_ratio, convention)
    k_round = round_paper_k(optimal_k_paper(acc, ratio))
    if k_max is not None:
        k_round = min(k_round, float(k_max))
    if _unbounded(acc, ratio, convention) and k_max is None:
        best = _speedup_limit(acc, ratio, convention)
    else:
        best = speedup_scalar(acc, optimal_k_exact(acc, ratio, convention, k_max), ratio,
                              convention)
    paper = (_speedup_limit(acc, ratio, convention) if math.isinf(k_round)
             else speedup_scalar(acc, int(k_round), ratio, convention))
    if best == paper or best == 0.0:
        return 1.0
    if math.isinf(best):
        return 0.0
    return min(paper / best, 1.0)
