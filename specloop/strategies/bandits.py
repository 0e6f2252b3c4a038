"""Bandit draft-length policies over a set of k arms: UCB1 and EXP3 (BanditSpec,
Hou et al. 2025 -- UCBSpec / EXP3Spec; OnlineSpec App. C.2).

Reward of a round: committed tokens per second of the round,
``record.tokens_per_round / record.round_time`` (not acceptance alone, so that a long
chain that is accepted but slow to draft does not win). Rewards are normalised to
[0, 1] by ``reward_bound`` when given (tokens/s; e.g. (k_max + 1) / verify seconds)
or else by the running maximum reward seen so far.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from specloop.record import RoundRecord
from specloop.strategies.base import DraftPlan, PlanState
from specloop.strategies.policies import _PolicyBase, _check_record, _clip_to_remaining, check_k

__all__ = ["UCBK", "EXP3K", "round_reward"]


def round_reward(record: RoundRecord) -> float:
    """Committed tokens per second of ``record`` (tokens/s).

    Raises:
        ValueError: the record has no positive round time (bandits need timings).
    """
    seconds = record.round_time
    if not seconds > 0:
        raise ValueError("bandit policies reward tokens per second: the record needs a "
                         f"positive draft+verify+update time, got {seconds} s")
    return record.tokens_per_round / seconds


class _BanditBase(_PolicyBase):
    _fields = ("arms", "reward_bound", "max_reward", "pending_arm")

    def __init__(self, arms: Sequence[int], reward_bound: float | None, seed: int | None):
        super().__init__(seed)
        arms = [check_k(k, "arm k") for k in arms]
        if not arms or len(set(arms)) != len(arms):
            raise ValueError(f"arms must be a non-empty list of distinct k, got {arms}")
        if reward_bound is not None and not reward_bound > 0:
            raise ValueError(f"reward_bound must be > 0 tokens/s, got {reward_bound}")
        self.arms = arms
        self.reward_bound = reward_bound
        self.max_reward = 0.0
        self.pending_arm: int | None = None
        self.counts = np.zeros(len(arms))

    def _normalise(self, reward: float) -> float:
        self.max_reward = max(self.max_reward, reward)
        bound = self.reward_bound if self.reward_bound is not None else self.max_reward
        return min(reward / bound, 1.0) if bound > 0 else 0.0

    def _select(self) -> int:
        raise NotImplementedError

    def plan(self, state: PlanState) -> DraftPlan:
        self.pending_arm = self._select()
        return DraftPlan(_clip_to_remaining(self.arms[self.pending_arm], state))

    def _take_pending(self, record: RoundRecord) -> int:
        _check_record(record)
        if self.pending_arm is None:
            raise ValueError("observe() called without a preceding plan()")
        arm, self.pending_arm = self.pending_arm, None
        return arm

    @property
    def best_arm(self) -> int:
        """The k pulled most often so far."""
        return self.arms[int(np.argmax(self.counts))]

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["counts"] = self.counts.copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.arms = [int(k) for k in self.arms]
        self.counts = np.array(state["counts"], dtype=np.float64)


class UCBK(_BanditBase):
    """UCB1 over k arms (Auer et al. 2002; BanditSpec's UCBSpec): pull each arm once,
    then the arm maximising mean_i + c * sqrt(2 ln t / n_i) of normalised rewards
    (ties broken by the policy's generator).

    Args:
        arms: candidate chain lengths k (distinct ints >= 0).
        exploration: c >= 0 (1 = UCB1).
        reward_bound: tokens/s that normalises rewards to [0, 1] (None = running max).
        seed: seeds the tie-breaking generator.
    """

    _fields = _BanditBase._fields + ("exploration",)

    def __init__(self, arms: Sequence[int] = (1, 2, 3, 4, 6, 8), exploration: float = 1.0,
                 reward_bound: float | None = None, seed: int | None = None):
        super().__init__(arms, reward_bound, seed)
        if not exploration >= 0:
            raise ValueError(f"exploration must be >= 0, got {exploration}")
        self.exploration = float(exploration)
        self.sums = np.zeros(len(self.arms))  # raw rewards (tokens/s)

    def _select(self) -> int:
        untried = np.flatnonzero(self.counts == 0)
        if untried.size:
            return int(untried[0])
        scale = self.reward_bound if self.reward_bound is not None else self.max_reward
        means = self.sums / self.counts / (scale if scale > 0 else 1.0)
        bonus = self.exploration * np.sqrt(2.0 * math.log(self.counts.sum()) / self.counts)
        score = means + bonus
        best = np.flatnonzero(score >= score.max() - 1e-12)
        return int(self._rng.choice(best))

    def observe(self, record: RoundRecord) -> None:
        arm = self._take_pending(record)
        reward = round_reward(record)
        self._normalise(reward)
        self.rounds_observed += 1
        self.counts[arm] += 1
        self.sums[arm] += reward

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["sums"] = self.sums.copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.sums = np.array(state["sums"], dtype=np.float64)


class EXP3K(_BanditBase):
    """EXP3 over k arms (Auer et al. 2002; BanditSpec's EXP3Spec) for adversarial /
    non-stationary rewards: p_i = (1 - gamma) w_i / sum w + gamma / K, arm drawn
    from p with the policy's generator, importance-weighted update
    log w_i += gamma * x_i / (p_i K) with x_i the reward normalised to [0, 1].

    Args:
        arms: candidate k.
        gamma: exploration in (0, 1]; default min(1, sqrt(K ln K / ((e - 1) T)))
            with T = ``horizon`` (Auer et al. Cor. 3.2), or 0.1 without a horizon.
        horizon: expected number of rounds T (only for the default gamma).
        reward_bound: tokens/s normalising rewards (None = running max).
        seed: seeds the arm draws.
    """

    _fields = _BanditBase._fields + ("gamma",)

    def __init__(self, arms: Sequence[int] = (1, 2, 3, 4, 6, 8), gamma: float | None = None,
                 horizon: int | None = None, reward_bound: float | None = None,
                 seed: int | None = None):
        super().__init__(arms, reward_bound, seed)
        n = len(self.arms)
        if gamma is None:
            gamma = 0.1 if horizon is None else min(
                1.0, math.sqrt(n * math.log(max(n, 2)) / ((math.e - 1) * max(int(horizon), 1))))
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.gamma = float(gamma)
        self.log_weights = np.zeros(n)

    @property
    def probabilities(self) -> np.ndarray:
        """(K,) float64 arm probabilities of the next draw."""
        w = np.exp(self.log_weights - self.log_weights.max())
        return (1.0 - self.gamma) * w / w.sum() + self.gamma / len(self.arms)

    def _select(self) -> int:
        return int(self._rng.choice(len(self.arms), p=self.probabilities))

    def observe(self, record: RoundRecord) -> None:
        arm = self._take_pending(record)
        prob = self.probabilities[arm]
        x = self._normalise(round_reward(record))
        self.rounds_observed += 1
        self.counts[arm] += 1
        self.log_weights[arm] += self.gamma * x / (prob * len(self.arms))

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["log_weights"] = self.log_weights.copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.log_weights = np.array(state["log_weights"], dtype=np.float64)
