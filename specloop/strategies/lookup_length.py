"""Cost-aware candidate length for lookup drafts, learned from the verifier.

A prompt-lookup draft has no draft probabilities, so how much of a found
continuation to verify must come from experience: `LookupLength` keeps, per context
key (for n-gram lookup: the length n of the matched suffix), Beta posteriors of the
positional acceptance rates a_d = P(draft d accepted | drafts 1..d-1 accepted), and
picks the candidate length L that maximises the expected committed tokens per
second of verification,

    L* = argmax_{0 <= L <= available}  (1 + sum_{d<=L} prod_{i<=d} a_i) / c(L + 1),

with E[tokens] from `specloop.theory.tokens.expected_tokens_positional` and c(n) the
measured verification time of n tokens (the decoder's cost table). Verifying a long
continuation that is rarely accepted costs more than it returns where c(n) grows
with n (CPUs); where verification is nearly flat in n (GPUs) L* is the whole
continuation. Measured on SmolLM2-135M / CPU (benchmarks/ngram_bound.py): the
verify sizes HF prompt lookup uses (6.3 tokens a round for tau 1.78) are the gap
between it and a perfectly pruned n-gram tree (2.0 tokens a round for tau 2.01).
"""
from __future__ import annotations

import copy
from typing import Hashable, Sequence

import numpy as np

from specloop.theory.tokens import expected_tokens_positional

__all__ = ["LookupLength"]


class LookupLength:
    """Per-key positional acceptance estimates and the cost-optimal candidate length.

    Args:
        verify_cost: seconds (or any unit) to verify 1, 2, .., M tokens: 1-D float
            array, all entries finite and > 0; lengths past M cost c(M).
        max_length: longest candidate considered (tokens, >= 1).
        prior: Beta prior (accepted, rejected) pseudo-counts of every a_d; both > 0.
            The prior mean is the rate assumed before any feedback (default 1:1).

    Raises:
        ValueError: bad cost table, max_length < 1 or a non-positive prior.
    """

    def __init__(self, verify_cost: Sequence[float], max_length: int = 10, prior: tuple[float, float] = (1.0, 1.0)):
        cost = np.asarray(verify_cost, dtype=np.float64)
        if cost.ndim != 1 or cost.size == 0 or not np.all(np.isfinite(cost)) or np.any(cost <= 0):
            raise ValueError("verify_cost must be a non-empty 1-D array of finite seconds > 0 "
                             "(entry n-1 = time to verify n tokens)")
        if isinstance(max_length, bool) or int(max_length) != max_length or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
        if len(prior) != 2 or not all(np.isfinite(prior)) or min(prior) <= 0:
            raise ValueError(f"prior must be two positive pseudo-counts (accepted, rejected), got {prior!r}")
        self.max_length = int(max_length)
        sizes = np.minimum(np.arange(1, self.max_length + 2), cost.size) - 1
        self.cost = cost[sizes]                   # c(L + 1) for L = 0..max_length
        self.prior = (float(prior[0]), float(prior[1]))
        self.accepted: dict[Hashable, np.ndarray] = {}
        self.trials: dict[Hashable, np.ndarray] = {}

    def acceptance_rates(self, key: Hashable) -> np.ndarray:
        """Posterior-mean a_1..a_max_length for ``key``: float64 (max_length,)."""
        acc = self.accepted.get(key, np.zeros(self.max_length))
        trials = self.trials.get(key, np.zeros(self.max_length))
        return (acc + self.prior[0]) / (trials + self.prior[0] + self.prior[1])

    def choose(self, key: Hashable, available: int) -> int:
        """Cost-optimal candidate length L in [0, min(available, max_length)] (tokens).

        Raises:
            ValueError: available < 0.
        """
        if available < 0:
            raise ValueError(f"available must be >= 0 tokens, got {available}")
        top = min(int(available), self.max_length)
        if top == 0:
            return 0
        rates = self.acceptance_rates(key)[:top]
        expected = np.array([expected_tokens_positional(rates[:length]) for length in range(top + 1)])
        return int(np.argmax(expected / self.cost[: top + 1]))

    def update(self, key: Hashable, drafted: int, accepted: int) -> None:
        """Record one verified candidate: ``drafted`` tokens proposed under ``key``,
        the first ``accepted`` of them accepted. Positions after the first rejection
        were not tested and are not counted.

        Raises:
            ValueError: accepted outside [0, drafted] or drafted < 0.
        """
        if drafted < 0 or not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        tested = min(drafted, accepted + 1, self.max_length)
        if tested == 0:
            return
        acc = self.accepted.setdefault(key, np.zeros(self.max_length))
        trials = self.trials.setdefault(key, np.zeros(self.max_length))
        trials[:tested] += 1
        acc[: min(accepted, self.max_length)] += 1

    def state_dict(self) -> dict:
        return {"accepted": copy.deepcopy(self.accepted), "trials": copy.deepcopy(self.trials)}

    def load_state_dict(self, state: dict) -> None:
        self.accepted = copy.deepcopy(state["accepted"])
        self.trials = copy.deepcopy(state["trials"])
