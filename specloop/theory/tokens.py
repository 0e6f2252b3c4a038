"""Expected tokens per round for chain, per-position and tree drafts.

Counting conventions (``convention`` argument):

* ``"committed"`` (default, OnlineSpec main text / Leviathan et al. 2023 Eq. (1)):
  n_t = accepted draft tokens + 1 (the bonus or correction token),
  E[n_t] = (1 - Acc^(k+1)) / (1 - Acc), limit k + 1 at Acc = 1. In [1, k+1].
* ``"appendix"`` (OnlineSpec Appendix C.1, proof of Corollary 4):
  E[n_t] = (1 - Acc^k) / (1 - Acc), limit k at Acc = 1. In [min(k, 1), k].
* ``"accepted"`` (n_t exactly as Algorithm 1 of OnlineSpec defines it, accepted draft
  tokens only): E[n_t] = sum_{j=1..k} Acc^j = (Acc - Acc^(k+1)) / (1 - Acc)
  = committed - 1, limit k at Acc = 1. In [0, k].

All under Assumption 1 (i.i.d. positions: one Acc per round).
"""
from __future__ import annotations

import numpy as np

from specloop.theory._validation import (validate_num_draft_tokens,
                                          validate_unit_interval)

__all__ = ["CONVENTIONS", "expected_tokens_chain", "expected_tokens_positional",
           "expected_tokens_tree"]

CONVENTIONS = ("committed", "appendix", "accepted")


def _geometric_sum(acc: np.ndarray, n: np.ndarray) -> np.ndarray:
    """sum_{j=0}^{n-1} acc^j = (1 - acc^n)/(1 - acc), n real >= 0, stable near acc = 1."""
    acc, n = np.broadcast_arrays(np.asarray(acc, np.float64), np.asarray(n, np.float64))
    safe_acc = np.where((acc > 0.0) & (acc < 1.0), acc, 0.5)
    one_minus_power = -np.expm1(n * np.log(safe_acc))           # 1 - acc^n on (0, 1)
    zero_case = np.where(n > 0.0, 1.0, 0.0)                       # 1 - 0^n
    one_minus_power = np.where(acc == 0.0, zero_case, one_minus_power)
    return np.where(acc < 1.0, one_minus_power / np.where(acc < 1.0, 1.0 - acc, 1.0), n)


def expected_tokens_chain(acceptance_rate, num_draft_tokens, convention: str = "committed"):
    """Expected tokens per round of a chain of k i.i.d. drafts (Lemma 1 proof, App. C.1).

    Args:
        acceptance_rate: Acc in [0, 1], array-like (broadcasts with k).
        num_draft_tokens: k >= 0 (tokens; real values allowed for continuous analysis).
        convention: "committed" (default), "appendix" or "accepted" (module docstring).
    Returns:
        float64 array (0-d for scalar inputs), expected tokens per round.
    Raises:
        ValueError: Acc outside [0, 1] or NaN; k < 0, NaN or inf; unknown convention.
    """
    acc = validate_unit_interval(acceptance_rate, "acceptance_rate")
    k = validate_num_draft_tokens(num_draft_tokens)
    if convention == "committed":
        return _geometric_sum(acc, k + 1.0)
    if convention == "appendix":
        return _geometric_sum(acc, k)
    if convention == "accepted":
        return np.maximum(_geometric_sum(acc, k + 1.0) - 1.0, 0.0)
    raise ValueError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")


def expected_tokens_positional(acceptance_rates) -> np.ndarray:
    """Expected committed tokens for per-position acceptance rates a_1..a_k.

    E[n_t] = 1 + sum_{j=1..k} prod_{i<=j} a_i, where a_i = P(draft i accepted | drafts
    1..i-1 accepted) (e.g. Acc of position i's own p/q pair). With all a_i = Acc it is
    the committed chain formula.

    Args:
        acceptance_rates: (..., k) float array in [0, 1]; k = 0 allowed (gives 1).
    Returns:
        (...) float64 array of expected committed tokens, in [1, k + 1].
    Raises:
        ValueError: 0-d input, NaN or values outside [0, 1].
    """
    rates = validate_unit_interval(acceptance_rates, "acceptance_rates")
    if rates.ndim == 0:
        raise ValueError("acceptance_rates must have a last axis of positions (shape (..., k))")
    return 1.0 + np.cumprod(rates, axis=-1).sum(axis=-1)


def _validate_parents(parents) -> np.ndarray:
    par = np.asarray(parents)
    if par.ndim != 1:
        raise ValueError(f"parents must be 1-D (one parent index per node), got shape {par.shape}")
    if par.size and not np.issubdtype(par.dtype, np.integer):
        if not np.all(np.equal(np.mod(par, 1), 0)):
            raise ValueError("parents must hold integer node indices (-1 for the root)")
    par = par.astype(np.int64)
    bad = (par < -1) | (par >= np.arange(par.size))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"parents[{i}] = {par[i]}: each parent must be -1 (root) or an "
                         f"earlier node index < {i} (nodes in topological order)")
    return par


def expected_tokens_tree(parents, accept_probs, tolerance: float = 1e-9) -> np.ndarray:
    """Expected committed tokens of one tree-verification round.

    The tree: node i (0..N-1, topological order) has parent ``parents[i]`` (-1 = child
    of the last committed token, the root). ``accept_probs[..., i]`` is the probability
    that node i is the accepted child of its parent *given that its parent was
    accepted* (the root counts as accepted). Siblings are mutually exclusive -- at most
    one child of a node is accepted -- so the accepted nodes form one root path and

        E[n_t] = 1 + E[depth of the accepted path] = 1 + sum_i prod_{j in path(root, i)} accept_probs[j]

    (the +1 is the bonus/correction token after the path).

    Semantics of ``accept_probs`` per verification scheme:

    * greedy tree verification (EAGLE / Medusa style with the target's argmax):
      ``accept_probs[i]`` = P(target's argmax at the parent's context = token of node
      i | parent accepted); siblings carry distinct tokens, so they sum to <= 1.
    * multi-draft recursive rejection sampling (SpecInfer's multi-step speculative
      sampling): the children of a node are tried in order, sibling j only if 1..j-1
      were rejected, with the residual updated after each rejection;
      ``accept_probs[i]`` is the *unconditional* (given the parent) probability that
      sibling i is the one accepted, i.e. what `multidraft_sibling_acceptance` returns
      for that node -- not the conditional acceptance of the j-th try.

    Args:
        parents: (N,) integer array, parents[i] in {-1, 0, .., i-1}.
        accept_probs: (..., N) float array in [0, 1], leading batch dims allowed.
        tolerance: slack for the check that each node's children sum to <= 1.
    Returns:
        (...) float64 array of expected committed tokens, in [1, tree depth + 1].
    Raises:
        ValueError: parents not 1-D / not topological / out of range; accept_probs NaN,
            outside [0, 1], last axis != N; children of one node summing to > 1.
    """
    par = _validate_parents(parents)
    probs = validate_unit_interval(accept_probs, "accept_probs")
    if probs.ndim == 0 or probs.shape[-1] != par.size:
        raise ValueError(f"accept_probs must have shape (..., {par.size}) to match parents, "
                         f"got {probs.shape}")
    child_sums = np.zeros(probs.shape[:-1] + (par.size + 1,))
    np.add.at(np.moveaxis(child_sums, -1, 0), par + 1, np.moveaxis(probs, -1, 0))
    if (child_sums > 1.0 + tolerance).any():
        node = int(np.argmax((child_sums > 1.0 + tolerance).reshape(-1, par.size + 1).any(0))) - 1
        raise ValueError(f"accept_probs of the children of node {node} (-1 = root) sum to more "
                         "than 1, but siblings are mutually exclusive")
    reach = np.empty_like(probs)
    for i in range(par.size):
        parent_reach = 1.0 if par[i] < 0 else reach[..., par[i]]
        reach[..., i] = parent_reach * probs[..., i]
    return 1.0 + reach.sum(axis=-1)
