"""Keeping part of a drafted tree: the one "keep these nodes and re-index their parents"
helper that every engine and drafter uses (real proposals through
`specloop.realmodels.drafters.base.DraftProposal.subset`, simulated trees in
`specloop.sim.trees`), and `select_subtree`, the nodes a verification size V keeps of
an EAGLE-2 tree (the decoder's session and LTD's size policy, `specloop.ltd`).

A tree is stored in topological order as ``parents`` (int, (n,), -1 for a child of the
root / pending token, else an index smaller than the node's own). Keeping a set of
nodes that is closed under ancestors gives again a tree in topological order once the
kept nodes are renumbered in their old order.
"""
from __future__ import annotations

import numpy as np

__all__ = ["reindex_parents", "close_under_ancestors", "select_subtree"]


def reindex_parents(parents, keep) -> np.ndarray:
    """The parents of the subtree made of the nodes ``keep``.

    Args:
        parents: int (n,) parent index of every node (-1 = root child), topological.
        keep: int (m,) strictly increasing node indices in [0, n), closed under
            ancestors (every kept node's parent is kept or is the root).

    Returns:
        int64 (m,): kept node i's parent as an index into ``keep`` (-1 = root child).

    Raises:
        ValueError: ``keep`` not strictly increasing, out of range, or not closed under
            ancestors.
    """
    par = np.asarray(parents, dtype=np.int64).reshape(-1)
    idx = np.asarray(keep, dtype=np.int64).reshape(-1)
    if idx.size and (idx[0] < 0 or idx[-1] >= par.size or (np.diff(idx) <= 0).any()):
        raise ValueError(f"keep must be strictly increasing node indices in [0, {par.size}), got {idx.tolist()}")
    new_index = np.full(par.size, -1, dtype=np.int64)
    new_index[idx] = np.arange(idx.size)
    old = par[idx]
    out = np.where(old >= 0, new_index[np.maximum(old, 0)], -1)
    if ((old >= 0) & (out < 0)).any():
        lost = idx[(old >= 0) & (out < 0)].tolist()
        raise ValueError(f"kept nodes {lost} lose their parent: keep must be closed under ancestors")
    return out


def close_under_ancestors(parents, nodes) -> np.ndarray:
    """``nodes`` plus every ancestor, ascending int64 (the smallest kept set that is a tree)."""
    par = np.asarray(parents, dtype=np.int64).reshape(-1)
    chosen = set(int(i) for i in np.asarray(nodes, dtype=np.int64).reshape(-1))
    for i in list(chosen):
        j = int(par[i])
        while j >= 0 and j not in chosen:
            chosen.add(j)
            j = int(par[j])
    return np.asarray(sorted(chosen), dtype=np.int64)


def select_subtree(depths: np.ndarray, parents: np.ndarray, probs: np.ndarray, depth: int,
                   verify_size: int) -> np.ndarray:
    """The nodes a size policy's V selects from an EAGLE-2 tree drafted to ``depth``.

    Args:
        depths: int (n,) node depths (1 = child of the pending token).
        parents: int (n,) parent index, -1 for depth-1 nodes.
        probs: float (n,) cumulative draft probabilities (EAGLE-2's ranking score).
        depth: D, nodes deeper than D are ignored (tokens, >= 1).
        verify_size: V, nodes kept (>= 1; fewer when the tree is smaller).

    Returns:
        int64 indices (ascending) of the best ``verify_size`` nodes of depth <= D by
        cumulative probability (ties: shallower, then earlier), plus any missing
        ancestor, so the set is a tree even under floating-point ties.
    """
    nodes = np.flatnonzero(depths <= depth)
    order = nodes[np.lexsort((nodes, depths[nodes], -probs[nodes]))][: max(1, int(verify_size))]
    chosen = set(int(i) for i in order)
    for i in list(chosen):
        j = int(parents[i])
        while j >= 0 and j not in chosen:
            chosen.add(j)
            j = int(parents[j])
    return np.asarray(sorted(chosen), dtype=np.int64)
