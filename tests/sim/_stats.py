"""Goodness-of-fit helpers for the simulator's exactness tests."""
from __future__ import annotations

import numpy as np
from scipy import stats

#: significance level of every exactness test: with fixed seeds the tests are
#: deterministic; a correct kernel fails one with probability ALPHA per check.
ALPHA = 1e-6


def chi_square_pvalue(tokens: np.ndarray, p: np.ndarray, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test that ``tokens`` are i.i.d. draws from p.

    Tokens where p == 0 make the p-value 0 (exactly impossible). Categories whose
    expected count is below ``min_expected`` are pooled into one bin (the usual
    validity condition of the chi-square approximation); with fewer than two bins
    left the support check above is the whole test and the p-value is 1.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    n = tokens.size
    if n == 0:
        return 1.0
    counts = np.bincount(tokens, minlength=p.size).astype(float)
    if counts[p <= 0].sum() > 0:
        return 0.0
    expected = n * p
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    exp = np.asarray(exp)
    exp *= n / exp.sum()
    return float(stats.chisquare(np.asarray(obs), exp).pvalue)


def committed_by_context(tokens: np.ndarray, contexts: np.ndarray, num_contexts: int,
                         iid: bool) -> dict[int, list[int]]:
    """Group committed tokens (R, L) (-1 padded) by the context they were drawn in."""
    from specloop.sim.streams import next_context

    groups: dict[int, list[int]] = {}
    for row, c in zip(tokens, contexts):
        c = int(c)
        for x in row:
            if x < 0:
                break
            groups.setdefault(c, []).append(int(x))
            c = next_context(c, int(x), num_contexts, iid)
    return groups


def min_pvalue_by_context(tokens, contexts, p_table, iid) -> float:
    """Smallest per-context chi-square p-value, Bonferroni-corrected."""
    groups = committed_by_context(tokens, contexts, p_table.shape[0], iid)
    pvalues = [chi_square_pvalue(np.asarray(g), p_table[c]) for c, g in groups.items()]
    return min(1.0, min(pvalues) * len(pvalues))
