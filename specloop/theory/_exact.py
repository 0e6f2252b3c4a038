"""Exact and high-precision evaluations used by `specloop.theory.check`.

Acceptance rates of integer-count cases are exact rationals (``fractions.Fraction``);
expected tokens per round are exact rationals; KL divergences (logarithms) are computed
with mpmath at ``PRECISION_DIGITS`` significant digits for vocabularies up to
``EXACT_VOCAB_LIMIT`` and with float64 ``math.fsum`` above it.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
from scipy.special import rel_entr

from specloop.theory._cases import Case

__all__ = ["PRECISION_DIGITS", "EXACT_VOCAB_LIMIT", "acceptance_exact", "tv_exact",
           "tokens_exact", "kl_mp", "kl_float", "to_mpf"]

PRECISION_DIGITS = 60
EXACT_VOCAB_LIMIT = 64


def acceptance_exact(case: Case) -> Fraction:
    """Acc = sum min(p, q) as an exact Fraction."""
    return Fraction(int(np.minimum(case.p_counts, case.q_counts).sum()), case.denominator)


def tv_exact(case: Case) -> Fraction:
    """TV = sum |p - q| / 2 as an exact Fraction."""
    return Fraction(int(np.abs(case.p_counts - case.q_counts).sum()), 2 * case.denominator)


def tokens_exact(acc: Fraction, k: int, convention: str = "committed") -> Fraction:
    """E[n_t] = sum_{j=0}^{k} Acc^j (committed) or sum_{j=1}^{k} Acc^j (accepted), exact."""
    total, power = Fraction(0), Fraction(1)
    for _ in range(k + 1):
        total += power
        power *= acc
    return total - 1 if convention == "accepted" else total


def to_mpf(x: Fraction) -> mpmath.mpf:
    return mpmath.mpf(x.numerator) / mpmath.mpf(x.denominator)


def kl_mp(case: Case) -> mpmath.mpf:
    """KL(p || q) in nats at PRECISION_DIGITS digits (mpmath.inf if q misses p's support)."""
    total = mpmath.mpf(0)
    n = mpmath.mpf(case.denominator)
    for a, b in zip(case.p_counts.tolist(), case.q_counts.tolist()):
        if a == 0:
            continue
        if b == 0:
            return mpmath.inf
        if a != b:
            total += (mpmath.mpf(a) / n) * mpmath.log(mpmath.mpf(a) / mpmath.mpf(b))
    return total


def kl_float(case: Case) -> float:
    """KL(p || q) in float64 via an exactly-rounded sum of the terms (inf if unsupported)."""
    terms = rel_entr(case.p_counts.astype(np.float64), case.q_counts.astype(np.float64))
    if np.isinf(terms).any():
        return math.inf
    return max(math.fsum(terms.tolist()) / case.denominator, 0.0)
