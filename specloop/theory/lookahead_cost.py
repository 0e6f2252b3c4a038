"""When does Lookahead Reasoning beat the target alone? A cost model of one LR round.

Lookahead Reasoning (Fu et al. 2025; the LR rows of OnlineSpec Table 2) drafts gamma
steps with a small model, lets the target expand every drafted prefix by one step in
one batched pass, and has a judge compare each draft step with the target's step in
order up to the first mismatch. With each judgement accepting independently with
probability p (the judge's acceptance rate), a round:

* accepts the leading draft steps: E[accepted] = p + p^2 + ... + p^gamma;
* appends the target's own step after the first mismatch, unless all gamma matched:
  P = 1 - p^gamma, so it commits

      E[steps] = sum_{i=1..gamma} p^i + 1 - p^gamma    steps per round;

* judges pairs until the first rejection: E[judged] = 1 + p + ... + p^(gamma-1),
  which equals E[steps] (a round commits one step per pair judged: each accepted
  pair's draft step, or the target's step at the rejected one), both
  (1 - p^gamma) / (1 - p) for p < 1;
* costs  gamma * t_draft  (the draft's steps, one after the other)
       + beta(gamma) * L * t_decode  (the batched expansion of gamma prefixes by one
         step of L tokens: beta(gamma) is the cost of a batch-gamma decode forward
         over a batch-1 one, 1 where decoding is memory-bound, as on a GPU at small
         batch, and larger on a CPU)
       + E[judged] * t_judge
       + t_commit  (prefilling the committed steps into both models' caches).

The target alone spends L * t_decode per step, so the speedup of LR over the target
(tokens/s ratio; steps of L tokens on both sides) is

    S = E[steps] * L * t_decode / round seconds,

and LR pays iff S > 1. Writing C = gamma t_draft + beta(gamma) L t_decode + t_commit
and A = E[steps] = E[judged], S = A L t_decode / (C + A t_judge), which increases with A
and so with p. Two consequences: S is at most gamma L t_decode / (C + gamma t_judge) <=
gamma / beta(gamma) even when every step is accepted (p = 1), so with beta(gamma) >=
gamma LR cannot pay whatever the judge accepts (`max_speedup`); and
`break_even_acceptance` solves S(p) = 1 for p by bisection.

Inputs and units: seconds (per step, per pair, per round), tokens, probabilities;
every function is pure and takes floats. Assumptions: independent judgements with one
acceptance rate, one mean step length for draft and target steps, constant costs over
the generation; checked against measured LR rows (`benchmarks/reasoning.py`). Source:
Fu et al. 2025 (step-level speculation with a semantic verifier), OnlineSpec Sec. 3.1.
"""
from __future__ import annotations

from dataclasses import dataclass

from specloop.theory._validation import validate_unit_interval

__all__ = ["LookaheadCosts", "expected_steps_per_round", "expected_judged_pairs", "round_seconds",
           "lookahead_speedup", "max_speedup", "break_even_acceptance"]


def _check_p(p: float) -> float:
    return float(validate_unit_interval(p, "acceptance rate"))


def _check_gamma(gamma: int) -> int:
    if int(gamma) != gamma or int(gamma) < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma}")
    return int(gamma)


@dataclass(frozen=True)
class LookaheadCosts:
    """Measured costs of one LR setting (all >= 0; step_tokens and t_decode > 0).

    Attributes:
        step_tokens: L, mean tokens of a step (target tokens).
        t_decode: seconds of one batch-1 target decode forward (one token).
        batch_ratio: beta(gamma), a batch-gamma decode forward over a batch-1 one (>= 1
            on any hardware where a larger batch is not faster).
        t_draft: seconds the draft takes for one step.
        t_judge: seconds of one judgement (one pair).
        t_commit: seconds per round of committing the round's steps (both models).

    Raises:
        ValueError: a negative cost, step_tokens or t_decode <= 0, batch_ratio < 1.
    """

    step_tokens: float
    t_decode: float
    batch_ratio: float
    t_draft: float
    t_judge: float
    t_commit: float = 0.0

    def __post_init__(self) -> None:
        if not (self.step_tokens > 0 and self.t_decode > 0):
            raise ValueError(f"step_tokens and t_decode must be > 0, got {self.step_tokens}, {self.t_decode}")
        if not self.batch_ratio >= 1.0:
            raise ValueError(f"batch_ratio must be >= 1, got {self.batch_ratio}")
        if min(self.t_draft, self.t_judge, self.t_commit) < 0:
            raise ValueError("t_draft, t_judge and t_commit must be >= 0")


def expected_steps_per_round(p: float, gamma: int) -> float:
    """E[steps committed per round] = sum_{i=1..gamma} p^i + 1 - p^gamma (in [1, gamma])."""
    p, gamma = _check_p(p), _check_gamma(gamma)
    return sum(p ** i for i in range(1, gamma + 1)) + 1.0 - p ** gamma


def expected_judged_pairs(p: float, gamma: int) -> float:
    """E[pairs judged per round] = 1 + p + ... + p^(gamma - 1) (judging stops at the
    first rejection)."""
    p, gamma = _check_p(p), _check_gamma(gamma)
    return sum(p ** i for i in range(gamma))


def round_seconds(p: float, gamma: int, costs: LookaheadCosts) -> float:
    """Seconds of one LR round (module docstring)."""
    return (gamma * costs.t_draft + costs.batch_ratio * costs.step_tokens * costs.t_decode
            + expected_judged_pairs(p, gamma) * costs.t_judge + costs.t_commit)


def lookahead_speedup(p: float, gamma: int, costs: LookaheadCosts) -> float:
    """S = E[steps] L t_decode / round seconds: LR's tokens/s over the target alone's."""
    return expected_steps_per_round(p, gamma) * costs.step_tokens * costs.t_decode / round_seconds(p, gamma, costs)


def max_speedup(gamma: int, costs: LookaheadCosts) -> float:
    """S at p = 1 (every draft step accepted): the most LR can give with these costs."""
    return lookahead_speedup(1.0, gamma, costs)


def break_even_acceptance(gamma: int, costs: LookaheadCosts, tol: float = 1e-9) -> float | None:
    """The acceptance rate p at which S(p) = 1, or None when even p = 1 gives S <= 1
    (and 0.0 when LR pays at p = 0, which needs round costs below one target step).

    Raises:
        ValueError: as `LookaheadCosts`, gamma < 1, tol <= 0.
    """
    if tol <= 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if max_speedup(gamma, costs) <= 1.0:
        return None
    if lookahead_speedup(0.0, gamma, costs) >= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if lookahead_speedup(mid, gamma, costs) < 1.0:
            lo = mid
        else:
            hi = mid
    return hi
