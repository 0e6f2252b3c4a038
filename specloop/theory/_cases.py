"""Generated target/draft cases for `specloop.theory.check` (exact integer representation).

A case holds integer count vectors ``p_counts``, ``q_counts`` (int64, shape (V,)) that
each sum to ``denominator`` N, i.e. p_target = p_counts / N and q_draft = q_counts / N
are exact rationals. Acceptance rates and TV are then exact integer arithmetic at any V.

Families (regimes), each drawn with vocabulary V log-uniform in [2, 1000] and Dirichlet
concentration log-uniform in [0.01, 100]:

* ``dirichlet``: p, q independent Dirichlet draws;
* ``one_hot``: p one-hot; q one-hot (same or other token) or Dirichlet;
* ``equal``: p == q;
* ``disjoint``: p and q on complementary, non-empty supports (Acc = 0, KL = inf);
* ``q_missing_support``: p has full support, q is zero on a non-empty proper subset;
* ``near_degenerate``: N = 10^12 and p within 10^-6 of one-hot; q either p with one
  count moved (Acc = 1 - 10^-12) or another near-one-hot on the same token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FAMILIES", "Case", "draw_case", "draw_vocab", "to_counts"]

FAMILIES = ("dirichlet", "one_hot", "equal", "disjoint", "q_missing_support", "near_degenerate")
DEFAULT_DENOMINATOR = 10 ** 9
FINE_DENOMINATOR = 10 ** 12


@dataclass(frozen=True)
class Case:
    """One exact (p_target, q_draft) pair: p = p_counts / denominator, q likewise."""

    family: str
    p_counts: np.ndarray
    q_counts: np.ndarray
    denominator: int

    @property
    def vocab(self) -> int:
        return int(self.p_counts.size)

    @property
    def p_target(self) -> np.ndarray:
        return self.p_counts / self.denominator

    @property
    def q_draft(self) -> np.ndarray:
        return self.q_counts / self.denominator


def to_counts(x: np.ndarray, denominator: int) -> np.ndarray:
    """Largest-remainder rounding of a probability vector to int64 counts summing to N.

    Zero entries stay zero (their remainder is 0 and the shortfall is below the number
    of entries with a positive remainder).
    """
    scaled = np.asarray(x, np.float64) / np.sum(x) * denominator
    counts = np.floor(scaled).astype(np.int64)
    short = int(denominator - counts.sum())
    if short > 0:
        order = np.argsort(-(scaled - counts), kind="stable")
        counts[order[:short]] += 1
    elif short < 0:
        counts[int(np.argmax(counts))] += short
    return counts


def draw_vocab(rng: np.random.Generator, low: int = 2, high: int = 1000) -> int:
    """Vocabulary size log-uniform on [low, high]."""
    return int(np.clip(round(float(np.exp(rng.uniform(np.log(low), np.log(high))))), low, high))


def _dirichlet(rng, vocab: int) -> np.ndarray:
    concentration = 10.0 ** rng.uniform(-2.0, 2.0)
    x = rng.gamma(concentration, size=vocab)
    if x.sum() <= 0.0 or not np.isfinite(x.sum()):
        x = np.zeros(vocab)
        x[rng.integers(vocab)] = 1.0
    return x / x.sum()


def _one_hot(vocab: int, index: int) -> np.ndarray:
    x = np.zeros(vocab)
    x[index] = 1.0
    return x


def _near_degenerate(rng, vocab: int, n: int):
    index = int(rng.integers(vocab))
    tail = int(rng.integers(1, max(2, n // 10 ** 6)))
    p = np.zeros(vocab, np.int64)
    p[index] = n - tail
    p[(index + 1 + rng.integers(vocab - 1)) % vocab] += tail
    if rng.random() < 0.5:
        q = p.copy()
        src = int(np.argmax(q))
        q[src] -= 1
        q[(src + 1 + rng.integers(vocab - 1)) % vocab] += 1
        return p, q
    q_tail = int(rng.integers(1, max(2, n // 10 ** 6)))
    q = np.zeros(vocab, np.int64)
    q[index] = n - q_tail
    q[(index + 1 + rng.integers(vocab - 1)) % vocab] += q_tail
    return p, q


def draw_case(rng: np.random.Generator, family: str, vocab: int) -> Case:
    """Draw one exact case of ``family`` with vocabulary ``vocab`` (>= 2)."""
    n = DEFAULT_DENOMINATOR
    if family == "dirichlet":
        p, q = to_counts(_dirichlet(rng, vocab), n), to_counts(_dirichlet(rng, vocab), n)
    elif family == "one_hot":
        p = to_counts(_one_hot(vocab, int(rng.integers(vocab))), n)
        mode = rng.integers(3)
        q_float = (_dirichlet(rng, vocab) if mode == 0 else
                   _one_hot(vocab, int(np.argmax(p)) if mode == 1 else int(rng.integers(vocab))))
        q = to_counts(q_float, n)
    elif family == "equal":
        p = to_counts(_dirichlet(rng, vocab), n)
        q = p.copy()
    elif family == "disjoint":
        perm = rng.permutation(vocab)
        cut = int(rng.integers(1, vocab))
        p_float, q_float = np.zeros(vocab), np.zeros(vocab)
        p_float[perm[:cut]] = _dirichlet(rng, cut) + 1e-3
        q_float[perm[cut:]] = _dirichlet(rng, vocab - cut) + 1e-3
        p, q = to_counts(p_float, n), to_counts(q_float, n)
    elif family == "q_missing_support":
        p = to_counts(_dirichlet(rng, vocab) + 1.0 / vocab, n)
        missing = rng.permutation(vocab)[: int(rng.integers(1, vocab))]
        q_float = _dirichlet(rng, vocab) + 1e-3
        q_float[missing] = 0.0
        q = to_counts(q_float, n)
    elif family == "near_degenerate":
        n = FINE_DENOMINATOR
        p, q = _near_degenerate(rng, vocab, n)
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return Case(family, p, q, n)
