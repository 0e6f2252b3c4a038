"""The engine step protocol and the one round driver (docs/design.md, section
"Engines and the one round loop"; OnlineSpec Algorithm 1: draft -> verify -> feedback -> update).

An *engine* is anything that can run one draft-and-verify cycle: the simulator's chain
and tree rounds, the online simulator, the LTD environments (simulated, replayed, real),
the real decoder's `DecodeSession`, and replays of recorded rounds. Every engine runs
through `drive_round`, which calls the strategy objects in one order::

    state  = engine.plan_state()                 # PlanState: t, L, remaining tokens
    plan   = policy.plan(state)                  # DraftPlan (k, or a TreePlan)
    hooks  = RoundHooks(policy, plan, cap)       # cap = engine.start_round(plan)
    engine.draft(hooks)       # step by step: after each draft step the engine asks
                              #   hooks.continue_drafting(DraftStep); a tree engine then
                              #   asks hooks.verify_size(TreeCandidates) once
    record = engine.verify(hooks)    # verify + feedback: the complete RoundRecord
                                     # (loss filled, times in seconds)
    policy.observe(record)
    engine.learn(learner)            # learner.step(params, grads, loss), if any

`RoundHooks` is the only place where a policy's optional hooks are interpreted, so a
policy decides the same way in every engine: the hook is never asked at the plan's depth
cap (there is nothing left to decide), its answer is final, ``verify_size`` falls back to
the plan's ``verify_size`` (else every node) and is clipped to the drafted nodes, and the
seconds spent inside the hooks are counted (engines that price time with a cost model add
them to ``draft_time`` when asked to; wall-clock engines already include them).

Engines whose drafting is naturally step-wise (the LTD engines, which gymnasium
environments step one decision at a time) implement `StepwiseEngine`
(``begin_round``/``deepen``/``candidates``/``finish``) and get ``draft``/``verify`` from
`StepwiseRound`, so the gym path and the driver path share one implementation.

This module sees no models and no simulator (strategies layer).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from specloop.record import RoundRecord
from specloop.strategies.base import DraftPlan, DraftStep, PlanState, TreeCandidates

__all__ = ["RoundEngine", "StepwiseEngine", "RoundHooks", "StepwiseRound", "drive_round", "drive_rounds",
           "chain_step", "layer_draft_step", "check_plan"]


@runtime_checkable
class RoundEngine(Protocol):
    """One draft-and-verify cycle in steps a policy can see (see the module docstring).

    * ``plan_state() -> PlanState``: what the policy may know before the round.
    * ``start_round(plan) -> int``: start the round under ``plan`` and return the depth
      cap: the most draft steps the engine will take (0 = a plain target step).
    * ``draft(hooks)``: draft step by step, asking ``hooks.continue_drafting(step)``
      after every step below the cap and, for a tree, ``hooks.verify_size(cands)``.
    * ``verify(hooks) -> RoundRecord``: verify, feed back, and return the complete
      record (``loss`` filled where the engine has one; times in seconds).
    * ``learn(learner) -> None``: optional; one ``learner.step`` with this round's
      gradient (engines whose draft learns inside its own ``observe`` have none).
    """

    def plan_state(self) -> PlanState: ...

    def start_round(self, plan: DraftPlan) -> int: ...

    def draft(self, hooks: "RoundHooks") -> None: ...

    def verify(self, hooks: "RoundHooks") -> RoundRecord: ...


@runtime_checkable
class StepwiseEngine(Protocol):
    """An engine drafted one decision at a time (the LTD engines; gymnasium steps them).

    ``begin_round() -> DraftStep`` drafts depth 1; ``deepen() -> DraftStep`` one more
    level; ``candidates() -> TreeCandidates`` the drafted tree; ``finish(verify_size,
    extra_draft_seconds) -> RoundRecord`` verifies the best ``verify_size`` nodes.
    ``max_depth`` is the deepest level it can draft; ``context_length`` is L.
    """

    max_depth: int
    context_length: int

    def begin_round(self) -> DraftStep: ...

    def deepen(self) -> DraftStep: ...

    def candidates(self) -> TreeCandidates: ...

    def finish(self, verify_size: int, extra_draft_seconds: float = 0.0) -> RoundRecord: ...


def check_plan(plan: Any) -> DraftPlan:
    """The plan, or ValueError when a policy's ``plan`` returned something else."""
    if not isinstance(plan, DraftPlan):
        raise ValueError(f"policy.plan returned {type(plan).__name__}, expected DraftPlan")
    return plan


class RoundHooks:
    """A policy's optional hooks for one round, interpreted once for every engine.

    Args:
        policy: the `DraftPolicy` (its ``continue_drafting`` / ``verify_size`` are used
            when present).
        plan: this round's `DraftPlan`.
        cap: the engine's depth cap for the round (draft steps, >= 0).
        clock: seconds counter used to time the hooks (default `time.perf_counter`).

    Attributes:
        seconds: wall-clock seconds spent inside the policy's hooks this round.
        asked: True once either hook was asked (by the engine or by a drafter that
            drafts step by step).
        stopped_at: depth at which ``continue_drafting`` answered False (None = never).
        verify_sizes: the V answered (after clipping), in order.
    """

    def __init__(self, policy: Any, plan: DraftPlan, cap: int, clock: Callable[[], float] = time.perf_counter):
        self.policy, self.plan, self.cap = policy, plan, max(0, int(cap))
        self._clock = clock
        self.seconds = 0.0
        self.asked = False
        self.stopped_at: int | None = None
        self.verify_sizes: list[int] = []

    def continue_drafting(self, step: DraftStep) -> bool:
        """True to draft another step after ``step``: False at the cap (the hook is not
        asked there), else the policy's answer (True without a hook)."""
        self.asked = True
        if self.stopped_at is not None:
            return False
        if int(step.depth) >= self.cap:
            return False
        hook = getattr(self.policy, "continue_drafting", None)
        if hook is None:
            return True
        t0 = self._clock()
        go = bool(hook(step))
        self.seconds += self._clock() - t0
        if not go:
            self.stopped_at = int(step.depth)
        return go

    def verify_size(self, candidates: TreeCandidates) -> int:
        """V in [1, n] for a drafted tree of n >= 1 nodes (0 when n == 0): the policy's
        ``verify_size`` when it has one, else the plan's ``verify_size``, else n.

        Raises:
            ValueError: the hook returned V < 1.
        """
        self.asked = True
        n = int(np.asarray(candidates.node_probs).size)
        if n == 0:
            return 0
        hook = getattr(self.policy, "verify_size", None)
        if hook is not None:
            t0 = self._clock()
            size = int(hook(candidates))
            self.seconds += self._clock() - t0
            if size < 1:
                raise ValueError(f"policy.verify_size returned {size}; it must be >= 1")
        else:
            tree = self.plan.tree
            size = int(tree.verify_size) if tree is not None and tree.verify_size else n
        size = min(size, n)
        self.verify_sizes.append(size)
        return size


def chain_step(depth: int, context_length: int, token_prob: float, path_prob: float) -> DraftStep:
    """The `DraftStep` after chain step ``depth``: the drafted token's draft probability
    ``token_prob`` = q(x_depth | ...) and the chain's cumulative ``path_prob``."""
    return DraftStep(int(depth), int(context_length), np.array([float(path_prob)]), float(path_prob),
                     float(token_prob))


def layer_draft_step(depth: int, context_length: int, layer_probs, parent_best: float) -> DraftStep:
    """The `DraftStep` after tree level ``depth``.

    Args:
        layer_probs: float64 (n,), cumulative draft probabilities of the nodes drafted
            at this depth (any order; sorted descending in the step).
        parent_best: cumulative draft probability of the best node one level up (1.0
            at depth 1), so ``max_prob`` is the best node's conditional probability.
    """
    layer = np.sort(np.asarray(layer_probs, dtype=np.float64))[::-1].copy()
    best = float(layer[0]) if layer.size else 0.0
    cond = min(1.0, best / max(float(parent_best), 1e-300))
    return DraftStep(int(depth), int(context_length), layer, best, cond)


class StepwiseRound:
    """``draft`` / ``verify`` of the `RoundEngine` protocol for a `StepwiseEngine`
    (mixin: the engine class inherits it and implements the step-wise methods).

    ``charge_policy_time``: add the hooks' seconds to the record's ``draft_time``
    (cost-model engines; default False).
    """

    charge_policy_time: bool = False
    #: seconds the policy's hooks took in the last round `verify` finished
    policy_seconds: float = 0.0

    def plan_state(self) -> PlanState:
        """PlanState(rounds done this episode, L, remaining tokens unknown)."""
        return PlanState(int(self.rounds_done), int(self.context_length), None)

    def start_round(self, plan: DraftPlan) -> int:
        """The depth cap of ``plan`` for this engine (>= 1: LTD engines always draft)."""
        tree = plan.tree
        cap = int(plan.num_draft_tokens) if tree is None else min(int(plan.num_draft_tokens), int(tree.max_depth))
        return max(1, min(cap, int(self.max_depth)))

    def draft(self, hooks: RoundHooks) -> None:
        step = self.begin_round()
        # an engine that drafted less than the cap this round (``drafted_depth``) stops there
        hooks.cap = min(hooks.cap, int(getattr(self, "drafted_depth", hooks.cap)))
        while hooks.continue_drafting(step):
            step = self.deepen()
        self._round_candidates = self.candidates()
        self._round_size = hooks.verify_size(self._round_candidates)

    def verify(self, hooks: RoundHooks) -> RoundRecord:
        self.policy_seconds = hooks.seconds
        extra = hooks.seconds if self.charge_policy_time else 0.0
        return self.finish(max(1, self._round_size), extra)


def drive_round(policy: Any, engine: Any, learner: Any = None) -> RoundRecord:
    """Run one round of ``engine`` under ``policy`` (and ``learner``): the one driver.

    Args:
        policy: a `DraftPolicy` (``plan``, ``observe``; optional hooks).
        engine: a `RoundEngine`.
        learner: optional `OnlineLearner`, stepped through ``engine.learn(learner)``
            after ``policy.observe``.

    Returns:
        The round's complete `RoundRecord` (the one ``policy.observe`` saw).

    Raises:
        ValueError: the policy's plan is not a DraftPlan, the engine's record is not a
            RoundRecord, or a learner for an engine that cannot learn.
    """
    plan = check_plan(policy.plan(engine.plan_state()))
    hooks = RoundHooks(policy, plan, engine.start_round(plan))
    engine.draft(hooks)
    record = engine.verify(hooks)
    if not isinstance(record, RoundRecord):
        raise ValueError(f"engine.verify returned {type(record).__name__}, expected RoundRecord")
    policy.observe(record)
    if learner is not None:
        learn = getattr(engine, "learn", None)
        if learn is None:
            raise ValueError(f"{type(engine).__name__} has no learn(); it cannot apply a learner")
        learn(learner)
    return record


def drive_rounds(policy: Any, engine: Any, rounds: int, learner: Any = None,
                 on_record: Callable[[RoundRecord], None] | None = None) -> list[RoundRecord]:
    """``rounds`` calls of `drive_round` (``on_record`` after each), the records in order."""
    out = []
    for _ in range(int(rounds)):
        record = drive_round(policy, engine, learner)
        out.append(record)
        if on_record is not None:
            on_record(record)
    return out
