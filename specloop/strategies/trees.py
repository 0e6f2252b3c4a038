"""Tree draft policies: static tree shapes (SpecInfer / Medusa-style fixed branching)
and EAGLE-2's dynamic tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language
Models with Dynamic Draft Trees"): expand the top_k nodes by cumulative draft
probability at each depth, then rerank all drafted nodes by cumulative probability
and send the best ``verify_size`` V to the target.

Both return ``DraftPlan(num_draft_tokens=max_depth, tree=TreePlan(...))`` and offer
the optional size hook ``verify_size(candidates: TreeCandidates) -> int`` the engine
calls after drafting the tree.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from specloop.strategies.base import DraftPlan, PlanState, TreeCandidates, TreePlan
from specloop.strategies.policies import _PolicyBase, check_k

__all__ = ["StaticTree", "DynamicTree", "static_tree_size"]


def static_tree_size(branching: Sequence[int]) -> int:
    """Number of draft nodes of a static tree: sum_d prod_{j<=d} branching[j]."""
    total, width = 0, 1
    for b in branching:
        width *= int(b)
        total += width
    return total


def _check_candidates(candidates: TreeCandidates) -> np.ndarray:
    probs = np.asarray(candidates.node_probs, dtype=np.float64)
    if probs.ndim != 1:
        raise ValueError(f"TreeCandidates.node_probs must be 1-D, got shape {probs.shape}")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(probs > 1 + 1e-9):
        raise ValueError("TreeCandidates.node_probs must be probabilities in [0, 1]")
    return probs


class StaticTree(_PolicyBase):
    """A fixed tree shape: ``branching[d]`` children per node at depth d (e.g. (3, 2, 1)).

    Args:
        branching: children per node per depth (positive ints); depth = len.
        verify_size: V, nodes sent to the target (None = all); the hook returns
            min(V, drafted nodes).
        seed: generator seed (nothing is drawn).
    """

    _fields = ("branching", "verify_budget")

    def __init__(self, branching: Sequence[int] = (3, 2, 1), verify_size: int | None = None,
                 seed: int | None = None):
        super().__init__(seed)
        self.branching = tuple(check_k(b, "branching", 1) for b in branching)
        if not self.branching:
            raise ValueError("branching must have at least one depth")
        self.verify_budget = None if verify_size is None else check_k(verify_size, "verify_size", 1)

    def plan(self, state: PlanState) -> DraftPlan:
        """The static shape, cut to ``remaining_tokens - 1`` levels near max_new_tokens."""
        depth = len(self.branching)
        if state.remaining_tokens is not None:
            depth = min(depth, int(state.remaining_tokens) - 1)
            if depth < 1:
                return DraftPlan(num_draft_tokens=0)
        tree = TreePlan(branching=self.branching[:depth], max_depth=depth,
                        verify_size=self.verify_budget)
        return DraftPlan(num_draft_tokens=depth, tree=tree)

    def verify_size(self, candidates: TreeCandidates) -> int:
        """V for the drafted tree: all nodes, or the budget if smaller."""
        n = _check_candidates(candidates).size
        return n if self.verify_budget is None else min(n, self.verify_budget)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.branching = tuple(int(b) for b in self.branching)


class DynamicTree(_PolicyBase):
    """EAGLE-2 dynamic tree: at each depth expand the ``top_k`` nodes with the highest
    cumulative draft probability (top_k children each) up to ``max_depth``, then
    verify the best ``verify_size`` nodes by cumulative probability (EAGLE-2's
    defaults: top_k = 10, depth 6, 60 verified tokens).

    Args:
        top_k: nodes expanded per depth and children per node (>= 1).
        max_depth: D (>= 1 tokens).
        verify_size: V, verification budget (>= 1 nodes).
        seed: generator seed (nothing is drawn).
    """

    _fields = ("top_k", "max_depth", "verify_budget")

    def __init__(self, top_k: int = 10, max_depth: int = 6, verify_size: int = 60,
                 seed: int | None = None):
        super().__init__(seed)
        self.top_k = check_k(top_k, "top_k", 1)
        self.max_depth = check_k(max_depth, "max_depth", 1)
        self.verify_budget = check_k(verify_size, "verify_size", 1)

    def plan(self, state: PlanState) -> DraftPlan:
        depth = self.max_depth
        if state.remaining_tokens is not None:
            depth = min(depth, int(state.remaining_tokens) - 1)
            if depth < 1:  # one token left: no room to speculate
                return DraftPlan(num_draft_tokens=0)
        tree = TreePlan(top_k=self.top_k, max_depth=depth, verify_size=self.verify_budget)
        return DraftPlan(num_draft_tokens=depth, tree=tree)

    def verify_size(self, candidates: TreeCandidates) -> int:
        """min(V, drafted nodes): EAGLE-2 reranks and keeps the top V nodes."""
        return min(_check_candidates(candidates).size, self.verify_budget)

    @staticmethod
    def select_nodes(candidates: TreeCandidates, verify_size: int) -> np.ndarray:
        """Indices (int64, (V,)) of the ``verify_size`` nodes with the highest
        cumulative probability, best first (stable for ties)."""
        probs = _check_candidates(candidates)
        order = np.argsort(-probs, kind="stable")
        return order[:check_k(verify_size, "verify_size", 1)].astype(np.int64)
