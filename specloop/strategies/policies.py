"""Chain draft-length policies: fixed k, theory-optimal k, the +2/-1 heuristic and a
confidence stop (docs/design.md, section "Contracts").

Every policy implements `specloop.strategies.base.DraftPolicy`: ``plan(state) ->
DraftPlan`` before a round and ``observe(record)`` after it, is seeded
(``seed=`` -> its own ``np.random.Generator``), never mutates the records it sees
and round-trips through ``state_dict()`` / ``load_state_dict()``.
"""
from __future__ import annotations

import copy
import math

from specloop.record import RoundRecord
from specloop.strategies._state import check_state_keys, make_rng, rng_state, set_rng_state
from specloop.strategies.base import DraftPlan, DraftStep, PlanState
from specloop.theory.optimal_k import optimal_k_exact

__all__ = ["FixedK", "TheoryOptimalK", "HeuristicK", "ConfidenceStop", "check_k"]


def check_k(k: int, name: str = "num_draft_tokens", minimum: int = 0) -> int:
    """``k`` as an int; ValueError if it is not an integer >= ``minimum``."""
    if isinstance(k, bool) or int(k) != k or int(k) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {k!r}")
    return int(k)


def _clip_to_remaining(k: int, state: PlanState) -> int:
    """Never draft past max_new_tokens: at most remaining - 1 draft tokens (the
    round commits one more token, the bonus or correction)."""
    if state.remaining_tokens is None:
        return k
    return max(0, min(k, int(state.remaining_tokens) - 1))


def _check_record(record: RoundRecord) -> RoundRecord:
    if not isinstance(record, RoundRecord):
        raise ValueError(f"observe() needs a RoundRecord, got {type(record).__name__}")
    return record


class _PolicyBase:
    """Seed, round counter and the state-dict plumbing shared by the policies."""

    _fields: tuple[str, ...] = ()

    def __init__(self, seed: int | None):
        self.seed = seed
        self._rng = make_rng(seed)
        self.rounds_observed = 0

    def observe(self, record: RoundRecord) -> None:
        _check_record(record)
        self.rounds_observed += 1

    def state_dict(self) -> dict:
        state = {name: copy.deepcopy(getattr(self, name)) for name in self._fields}
        state.update({"class": type(self).__name__, "rounds_observed": self.rounds_observed,
                      "rng": rng_state(self._rng)})
        return state

    def load_state_dict(self, state: dict) -> None:
        check_state_keys(state, set(self._fields) | {"rounds_observed", "rng"},
                         type(self).__name__)
        for name in self._fields:
            setattr(self, name, copy.deepcopy(state[name]))
        self.rounds_observed = int(state["rounds_observed"])
        set_rng_state(self._rng, state["rng"])


class FixedK(_PolicyBase):
    """Always draft ``num_draft_tokens`` tokens (k >= 0; 0 = plain decoding)."""

    _fields = ("num_draft_tokens",)

    def __init__(self, num_draft_tokens: int, seed: int | None = None):
        super().__init__(seed)
        self.num_draft_tokens = check_k(num_draft_tokens)

    def plan(self, state: PlanState) -> DraftPlan:
        return DraftPlan(_clip_to_remaining(self.num_draft_tokens, state))


class TheoryOptimalK(_PolicyBase):
    """k from the running acceptance-rate estimate through the closed form:
    ``k = optimal_k_exact(acceptance_rate_hat, cost_ratio)`` (OnlineSpec App. C.1,
    Corollary 4; maximises E[n_t] / (cost_ratio k + 1)).

    The estimate is the geometric-model MLE with a Beta-like prior (warm start)::

        acc_hat = (A + prior_acceptance * prior_strength) / (A + R + prior_strength)

    where A counts accepted draft tokens and R rejections (rounds whose accepted
    tokens fell short of the drafted depth), optionally discounted by ``decay`` per
    round (1 = no forgetting) to follow non-stationary streams.

    Args:
        cost_ratio: a / A, seconds per draft step over seconds per target forward (> 0).
        prior_acceptance: prior mean of Acc in (0, 1).
        prior_strength: pseudo-observations of the prior (>= 0 tokens).
        decay: per-round discount of the counts, in (0, 1].
        k_max: largest k considered (>= 1).
        convention: passed to `optimal_k_exact` ("committed" counts the bonus token).
        seed: generator seed (nothing is drawn).
    """

    _fields = ("cost_ratio", "prior_acceptance", "prior_strength", "decay", "k_max",
               "convention", "accepted", "rejections")

    def __init__(self, cost_ratio: float, prior_acceptance: float = 0.5,
                 prior_strength: float = 10.0, decay: float = 1.0, k_max: int = 16,
                 convention: str = "committed", seed: int | None = None):
        super().__init__(seed)
        if not (math.isfinite(cost_ratio) and cost_ratio > 0):
            raise ValueError(f"cost_ratio must be positive and finite, got {cost_ratio}")
        if not 0.0 < prior_acceptance < 1.0:
            raise ValueError(f"prior_acceptance must be in (0, 1), got {prior_acceptance}")
        if not prior_strength >= 0:
            raise ValueError(f"prior_strength must be >= 0, got {prior_strength}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.cost_ratio, self.prior_acceptance = float(cost_ratio), float(prior_acceptance)
        self.prior_strength, self.decay = float(prior_strength), float(decay)
        self.k_max = check_k(k_max, "k_max", 1)
        self.convention = convention
        self.accepted = 0.0
        self.rejections = 0.0

    @property
    def acceptance_estimate(self) -> float:
        """Current estimate of the per-token acceptance rate, in (0, 1)."""
        num = self.accepted + self.prior_acceptance * self.prior_strength
        den = self.accepted + self.rejections + self.prior_strength
        est = num / den if den > 0 else self.prior_acceptance
        return min(max(est, 1e-9), 1.0 - 1e-9)

    def plan(self, state: PlanState) -> DraftPlan:
        k = optimal_k_exact(self.acceptance_estimate, self.cost_ratio,
                            convention=self.convention, k_max=self.k_max)
        return DraftPlan(_clip_to_remaining(int(k), state))

    def observe(self, record: RoundRecord) -> None:
        super().observe(record)
        self.accepted = self.decay * self.accepted + record.accepted_tokens
        rejected = 1.0 if record.accepted_tokens < record.tree_depth else 0.0
        self.rejections = self.decay * self.rejections + rejected


class HeuristicK(_PolicyBase):
    """The "heuristic" schedule of Hugging Face assisted generation
    (``num_assistant_tokens_schedule="heuristic"``): if every drafted token was
    accepted, k <- k + 2, otherwise k <- k - 1, clipped to [k_min, k_max].

    Args:
        initial_k: first k (HF's default ``num_assistant_tokens`` is 20; we default
            to 5, the usual chain length of the papers).
        k_min, k_max: bounds (0 <= k_min <= k_max).
        increase, decrease: the +2 / -1 steps.
    """

    _fields = ("num_draft_tokens", "k_min", "k_max", "increase", "decrease")

    def __init__(self, initial_k: int = 5, k_min: int = 1, k_max: int = 32,
                 increase: int = 2, decrease: int = 1, seed: int | None = None):
        super().__init__(seed)
        self.k_min, self.k_max = check_k(k_min, "k_min"), check_k(k_max, "k_max")
        if self.k_min > self.k_max:
            raise ValueError(f"k_min={k_min} exceeds k_max={k_max}")
        self.increase, self.decrease = check_k(increase, "increase"), check_k(decrease, "decrease")
        self.num_draft_tokens = min(max(check_k(initial_k, "initial_k"), self.k_min), self.k_max)

    def plan(self, state: PlanState) -> DraftPlan:
        return DraftPlan(_clip_to_remaining(self.num_draft_tokens, state))

    def observe(self, record: RoundRecord) -> None:
        super().observe(record)
        if record.tree_depth == 0:
            return
        if record.accepted_tokens >= record.tree_depth:
            k = self.num_draft_tokens + self.increase
        else:
            k = self.num_draft_tokens - self.decrease
        self.num_draft_tokens = min(max(k, self.k_min), self.k_max)


class ConfidenceStop(_PolicyBase):
    """Draft while the draft is confident: after each draft step the engine asks
    ``continue_drafting(step)``, which is True while the confidence is at least
    ``threshold`` and fewer than ``max_draft_tokens`` tokens are drafted.

    Confidence (``criterion``): "max_prob" = the draft's max probability at the last
    step (``step.max_prob``, as in dynamic draft-length stopping); "path_prob" = the
    cumulative draft probability of the drafted path (``step.path_prob``).

    ``plan`` returns ``DraftPlan(max_draft_tokens)`` as the cap.
    """

    _fields = ("threshold", "criterion", "max_draft_tokens")

    def __init__(self, threshold: float = 0.5, criterion: str = "max_prob",
                 max_draft_tokens: int = 16, seed: int | None = None):
        super().__init__(seed)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be a probability in [0, 1], got {threshold}")
        if criterion not in ("max_prob", "path_prob"):
            raise ValueError(f"criterion must be 'max_prob' or 'path_prob', got {criterion!r}")
        self.threshold, self.criterion = float(threshold), criterion
        self.max_draft_tokens = check_k(max_draft_tokens, "max_draft_tokens", 1)

    def plan(self, state: PlanState) -> DraftPlan:
        return DraftPlan(_clip_to_remaining(self.max_draft_tokens, state))

    def continue_drafting(self, step: DraftStep) -> bool:
        """True to draft one more token after ``step``. Raises ValueError if the
        step's probability is not in [0, 1]."""
        value = float(step.max_prob if self.criterion == "max_prob" else step.path_prob)
        if not 0.0 <= value <= 1.0 + 1e-12:
            raise ValueError(f"DraftStep.{self.criterion} must be a probability, got {value}")
        return value >= self.threshold and int(step.depth) < self.max_draft_tokens
