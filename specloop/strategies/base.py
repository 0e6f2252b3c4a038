"""The strategy contracts shared by the simulator and the real decoder (docs/design.md,
section "Contracts").

Call order in every engine, per round t (OnlineSpec Algorithm 1)::

    plan = policy.plan(state)            # how much to draft
    ...draft; during tree/chain drafting the engine may ask
       policy.continue_drafting(step) and, after drafting, policy.verify_size(tree)
    ...verify -> RoundRecord
    policy.observe(record)
    params = learner.step(params, grads, loss)   # if the draft learns

Strategies never see models or the simulator: they see `PlanState`, `DraftStep`,
`TreeCandidates` and `RoundRecord`, all plain data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from specloop.record import RoundRecord

__all__ = [
    "PlanState", "DraftPlan", "TreePlan", "DraftStep", "TreeCandidates",
    "DraftPolicy", "OnlineLearner",
]


@dataclass(frozen=True)
class PlanState:
    """What a policy may know before a round.

    Attributes:
        round_index: round t within the stream (0-based).
        context_length: tokens in the context L (prompt + generated so far).
        remaining_tokens: tokens still allowed before max_new_tokens (None = unbounded).
    """

    round_index: int = 0
    context_length: int = 0
    remaining_tokens: int | None = None


@dataclass(frozen=True)
class TreePlan:
    """A tree drafting plan.

    Attributes:
        branching: static tree: number of children per node at each depth
            (len = max depth), e.g. (3, 2, 1). Mutually exclusive with ``top_k``.
        top_k: EAGLE-2 dynamic tree: expand the top_k nodes by cumulative draft
            probability at each depth, each with top_k children.
        max_depth: depth limit D in tokens (defaults to len(branching)).
        verify_size: verification budget V: number of tree nodes sent to the
            target (the best V by cumulative draft probability); None = all.
    """

    branching: tuple[int, ...] | None = None
    top_k: int | None = None
    max_depth: int | None = None
    verify_size: int | None = None

    def __post_init__(self) -> None:
        if (self.branching is None) == (self.top_k is None):
            raise ValueError("TreePlan needs exactly one of branching= or top_k=")
        if self.branching is not None:
            if len(self.branching) == 0 or any(int(b) < 1 for b in self.branching):
                raise ValueError(f"TreePlan.branching must be positive ints, got {self.branching}")
            if self.max_depth is None:
                object.__setattr__(self, "max_depth", len(self.branching))
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"TreePlan.top_k must be >= 1, got {self.top_k}")
        if self.max_depth is None or self.max_depth < 1:
            raise ValueError(f"TreePlan.max_depth must be >= 1, got {self.max_depth}")
        if self.verify_size is not None and self.verify_size < 1:
            raise ValueError(f"TreePlan.verify_size must be >= 1, got {self.verify_size}")


@dataclass(frozen=True)
class DraftPlan:
    """A policy's decision for one round.

    Attributes:
        num_draft_tokens: chain length k >= 0 (0 = do not speculate: one plain
            target step). For a tree plan, the depth cap the engine may not exceed.
        tree: a `TreePlan` to draft a tree instead of a chain (None = chain).
    """

    num_draft_tokens: int
    tree: TreePlan | None = None

    def __post_init__(self) -> None:
        if int(self.num_draft_tokens) < 0:
            raise ValueError(f"num_draft_tokens (k) must be >= 0, got {self.num_draft_tokens}")


@dataclass(frozen=True)
class DraftStep:
    """State after one draft step, for policies that decide to continue or stop.

    Attributes:
        depth: tokens drafted so far along the chain / tree depth D.
        context_length: L.
        candidate_probs: float64 array (n,), the draft probabilities of the
            candidates at the last drafted layer (chain: shape (1,), the drafted
            token's q; tree: the last layer's nodes).
        path_prob: cumulative draft probability of the best path so far.
        max_prob: the draft's max probability at the last step.
    """

    depth: int
    context_length: int
    candidate_probs: np.ndarray
    path_prob: float
    max_prob: float


@dataclass(frozen=True)
class TreeCandidates:
    """The drafted tree, for policies that choose a verification size.

    Attributes:
        depth: drafted depth D.
        context_length: L.
        node_probs: float64 array (n,), cumulative draft probability of every
            drafted node (not sorted).
    """

    depth: int
    context_length: int
    node_probs: np.ndarray


@runtime_checkable
class DraftPolicy(Protocol):
    """Decides how much to draft. Must be deterministic given its seed.

    Optional hooks (engines call them when present, ``hasattr`` checks):

    * ``continue_drafting(step: DraftStep) -> bool``: asked after every draft step
      of a chain or tree; False stops drafting before the plan's depth cap
      (e.g. `specloop.strategies.policies.ConfidenceStop`).
    * ``verify_size(candidates: TreeCandidates) -> int``: after a tree is drafted,
      the number V >= 1 of nodes (best by cumulative draft probability) to send to
      the target (e.g. `specloop.strategies.trees.DynamicTree`, LTD's size policy).
    * ``state_dict() -> dict`` / ``load_state_dict(state)``: every policy in
      `specloop.strategies` has them.
    """

    def plan(self, state: PlanState) -> DraftPlan: ...

    def observe(self, record: RoundRecord) -> None: ...


@runtime_checkable
class OnlineLearner(Protocol):
    """Updates draft parameters from verification feedback, optax-style but on a
    list of arrays (NumPy or torch, through the array API).

    ``step(params, grads, loss) -> params`` returns new arrays and never mutates
    its inputs. ``grads`` is the gradient of f_t at the parameters that were
    *played* this round (the ones last returned, or the initial ones).

    Every learner in `specloop.strategies` also accepts an optional keyword
    ``oracle: Callable[[list], tuple[float, list]]`` -- f_t and grad f_t at any
    parameter list -- which ensembles use to evaluate their base learners and
    OSD-style distillation buffers for later updates; learners that do not need it
    ignore it.

    Optional attribute ``feedback`` ("played" when absent): "played" learners learn
    from ``grads`` every round; "rejections" learners (OSD) ignore ``grads``/``loss``
    and learn only from rounds with a rejected draft token, handed over once each
    through ``add_feedback`` (`specloop.strategies.registry.learns_from_round`).
    """

    def step(self, params: Sequence[Any], grads: Sequence[Any], loss: float) -> list[Any]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
