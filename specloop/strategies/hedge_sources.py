"""Hedge over draft sources with delayed, censoring-free feedback.

Several draft sources (context n-gram, suffix tree, ...) propose every round; the
ensemble verifies the proposal of one of them, chosen by exponential weights over the
sources' *cumulative* losses (Hedge, Freund & Schapire 1997; the anytime rate of
Cesa-Bianchi & Lugosi, "Prediction, Learning, and Games", 2006, Thm. 2.3). Selecting
among drafters with Hedge from the verified path, without extra target calls, is
HedgeSpec (arXiv 2510.20064).

Loss (tokens per second, not accepted length). Source i's proposal of n_i nodes, drafted
in d_i seconds, would have committed m_i tokens had it been verified (its accepted
prefix a_i plus the bonus / correction token, m_i = a_i + 1, fewer when the request
ended inside the block); its verification costs c(n_i + 1) seconds (the verify-cost
table, entry n-1 = seconds for n new tokens; sizes past the table are extrapolated
linearly, c(n) = c(M) n / M). Its rate is r_i = m_i / (d_i + c(n_i + 1)) tokens/s and

    loss_i = 1 - r_i / R,     R = max_{1 <= n <= M} n / c(n),

R being the best rate any proposal can reach (every node accepted, no drafting time):
r_i <= (n_i + 1) / c(n_i + 1) <= R, so loss_i lies in [0, 1]. Minimising the summed
loss maximises the summed per-round rate (`ThroughputLoss`, ``loss="rate"``). (With
``max_nodes`` N, R is the maximum over n <= N + 1 only, and a larger proposal's loss is
clipped at 0.)

The stream's throughput is a ratio of sums, sum m / sum (d + c), not the mean of the
per-round rates: a source that verifies more nodes and commits more per round can have
the same mean rate and a higher throughput (on the ShareGPT stream, suffix and n-gram
had mean rates 0.03 % apart and throughputs 5 % apart, so the rate loss could not tell
them apart). `RatioLoss` (``loss="ratio"``, the default of the drafter) is the
Dinkelbach linearisation of the ratio (Dinkelbach 1967): with source i's counterfactual
totals A_i (tokens) and B_i (seconds) and theta* = max_i A_i / B_i,
theta* B_i - A_i >= 0 with equality for the best source, so the summed loss
theta* (d + c) - m ranks the best source first; and if Hedge's summed loss is within
Reg of the best, theta* B_H - A_H <= Reg, i.e. its throughput is within Reg / B_H of
theta*. theta* is not known in advance: each round is scored with the plug-in
estimate theta_t = max_i A_i / B_i over the rounds resolved before it (0 before any,
which scores accepted length), normalised to [0, 1]:

    loss_i = clip((theta_t (d_i + c(n_i + 1)) - m_i + M) / (theta_t C + M), 0, 1),

M = N + 1 the most tokens a round commits (N = ``max_nodes``, or the running maximum
of the proposals' sizes) and C = 1.5 c(N + 1) a cap on a round's
seconds (a round slower than C, drafting more than half a verify, is clipped at 1).
Hedge's regret bound below holds for this loss sequence as played (theta_t depends
only on earlier rounds: an adaptive adversary); the translation to throughput is
exact only for a fixed theta, and theta_t -> theta* as the totals grow.

Feedback. With greedy decoding the target's committed continuation does not depend on
the drafts, so a_i is the longest path of source i's tree that matches the committed
tokens after the round's pending token (`accepted_prefix`). It is *censored* when the
path matches every token committed so far and the tree goes deeper; `DelayedFeedback`
keeps such rounds pending and resolves them with the tokens the next rounds commit (no
extra target calls). Delay bound: a proposal of depth D is decided once D tokens past
its round are known; every round commits >= 1 token, so a round waits at most D <=
``max_delay`` later rounds; at the end of a request every pending round is decided
exactly (a verifier would have stopped there too). A round still pending after
``max_delay`` rounds (only possible when rounds commit nothing) is resolved with its
censored lower bound. With sampling and deterministic drafts the same rule gives each
source's acceptance in distribution (a point mass x is accepted with probability p(x),
the probability that the committed token is x).

Regret. `HedgeOverSources` plays p_t proportional to exp(-eta_t L_{t-1}) over the losses
resolved so far, with eta_t = sqrt(8 ln K / t) (anytime) or sqrt(8 ln K / T) (horizon
T known). Against the best fixed source in hindsight the expected regret
sum_t p_t . l_t - min_i L_T^i is at most (`hedge_regret_bound`)

    no delay, anytime:  2 sqrt(T ln K / 2) + sqrt(ln K / 8)        (CBL Thm. 2.3)
    no delay, fixed:    ln K / eta + eta T / 8 = sqrt(T ln K / 2)   (CBL Thm. 2.2)
    delay <= d rounds:  the above + sum_t min(1, exp(eta_t d) - 1),
    n_t rounds missing: the above + sum_t min(1, eta_t n_t / 4)      (`HedgeOverSources`)

the delayed terms because the played weights p^del_t miss n_t <= d loss vectors in
[0, 1]^K (the rounds played but not yet resolved when round t is played), and the
full-information weights p_t (whose regret is the undelayed bound, for any loss
sequence) differ from them by at most that much on l_t: each weight is within a factor
exp(eta_t d) of the undelayed one; sharper, with m = the missing losses' sum (m_i in
[0, n_t]) and f(s) = p(L + s m) . l_t, f'(s) = -eta_t Cov_p(m, l_t), and Popoviciu's
inequality (Var <= range^2 / 4) gives |Cov| <= (n_t / 2)(1 / 2), so
|p^del_t . l_t - p_t . l_t| <= eta_t n_t / 4 (and <= 1). `HedgeOverSources.regret`
reports the smaller of the two. The bounds hold pathwise for every loss sequence, also
one that reacts to the choices (an adaptive adversary), so they bound the *expected*
regret sum_t p_t . l_t - min_i L_T^i of every run. The comparator is the best source on
the realised rounds (whose boundaries depend on the choices).

This module sees no models and no simulator (strategies layer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specloop.strategies._state import check_state_keys, make_rng, rng_state, set_rng_state
from specloop.strategies.suffix_tree import monotone_cost

__all__ = ["hedge_learning_rate", "hedge_regret_bound", "mixability_gap", "HedgeOverSources", "ThroughputLoss", "RatioLoss",
           "accepted_prefix", "DelayedFeedback", "SourceDraft"]

_CHOICES = ("sample", "argmax")
_RATES = ("anytime", "adahedge")


def hedge_learning_rate(num_sources: int, round_index: int, horizon: int | None = None) -> float:
    """eta_t = sqrt(8 ln K / t) (anytime, ``horizon`` None) or sqrt(8 ln K / T).

    Args:
        num_sources: K >= 1 (K = 1 gives eta 0: one source, nothing to learn).
        round_index: t >= 1, the round being played.
        horizon: T >= 1 or None.

    Raises:
        ValueError: K < 1, t < 1 or T < 1.
    """
    if num_sources < 1 or round_index < 1 or (horizon is not None and horizon < 1):
        raise ValueError(f"hedge_learning_rate needs K >= 1, t >= 1, T >= 1; got "
                         f"{num_sources}, {round_index}, {horizon}")
    return math.sqrt(8.0 * math.log(num_sources) / (round_index if horizon is None else horizon))


def hedge_regret_bound(num_rounds: int, num_sources: int, horizon: int | None = None,
                       delay: int = 0) -> float:
    """Upper bound on Hedge's expected regret after T = ``num_rounds`` rounds with losses
    in [0, 1] (see the module docstring for the three cases).

    Args:
        num_rounds: T >= 0 rounds played.
        num_sources: K >= 1.
        horizon: the horizon the learning rate was tuned for (None = anytime rate).
        delay: d >= 0, the most rounds a loss vector arrived late.

    Raises:
        ValueError: negative T or d, K < 1.
    """
    if num_rounds < 0 or delay < 0 or num_sources < 1:
        raise ValueError(f"hedge_regret_bound needs T >= 0, d >= 0, K >= 1; got {num_rounds}, "
                         f"{delay}, {num_sources}")
    if num_rounds == 0 or num_sources == 1:
        return 0.0
    log_k = math.log(num_sources)
    if horizon is None:
        base = 2.0 * math.sqrt(num_rounds * log_k / 2.0) + math.sqrt(log_k / 8.0)
    else:
        eta = hedge_learning_rate(num_sources, 1, horizon)
        base = log_k / eta + eta * num_rounds / 8.0
    rates = [hedge_learning_rate(num_sources, t, horizon) for t in range(1, num_rounds + 1)]
    return base + sum(min(1.0, math.expm1(eta * delay)) for eta in rates) if delay else base


def mixability_gap(weights: np.ndarray, losses: np.ndarray, eta: float) -> float:
    """delta = p . l + (1 / eta) ln sum_i p_i exp(-eta l_i) >= 0 (de Rooij et al. 2014,
    Sec. 2): Hedge's loss minus the mix loss at rate ``eta``; ``eta`` infinite: p . l
    minus the smallest loss of a source with p_i > 0; ``eta`` 0: 0.

    Args:
        weights: (K,) probabilities p; losses: (K,) finite reals; eta: >= 0 or inf.
    """
    p, loss = np.asarray(weights, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    hedge = float(p @ loss)
    live = p > 0
    low = float(loss[live].min())
    if eta == 0:
        return 0.0
    if math.isinf(eta):
        return max(0.0, hedge - low)
    mix = low - math.log(float(p[live] @ np.exp(-eta * (loss[live] - low)))) / eta
    return max(0.0, hedge - mix)


class HedgeOverSources:
    """Exponential weights over K sources, fed delayed loss vectors in [0, 1]^K.

    Args:
        num_sources: K >= 1.
        horizon: T for the fixed rate sqrt(8 ln K / T), or None for the anytime rate.
        choose: "sample" (draw the source from p_t with the own generator; the regret
            bound is on the expected loss) or "argmax" (the heaviest source; no bound).
        seed: seed of the learner's numpy Generator.
        learning_rate: "anytime" (default; ``horizon`` as above) or "adahedge"
            (de Rooij, van Erven, Grunwald & Koolen, JMLR 2014, "Follow the Leader If You
            Can, Hedge If You Must", Sec. 2): eta_t = ln K / Delta_{t-1}, Delta the
            summed mixability gaps delta_t = p_t . l_t + (1 / eta_t) ln sum_i p_t,i
            exp(-eta_t l_t,i) (eta infinite, i.e. follow the leaders, while Delta = 0).
            Its weights are invariant under rescaling and translating the losses, so
            losses may be any finite reals (no [0, 1] range to guess), and its regret is
            at most Delta_T + ln K / eta_T <= 2 Delta_T for every loss sequence (their
            Lemmas 1 and 3), which `regret` reports as ``bound``. That bound needs each
            round's losses before the next play: AdaHedge refuses a play while a round
            is unresolved.

    Use: ``round_id, source = play()`` each round; ``update(round_id, losses)`` once
    that round's losses are known (any order, at most once per round).
    Attributes: ``cumulative_loss`` (K,) float64 of the resolved rounds,
    ``expected_loss`` sum of p_t . l_t, ``chosen_loss`` sum of l_t[chosen], ``t`` rounds
    played, ``resolved`` rounds updated, ``max_delay`` the largest delay seen (rounds).

    Raises:
        ValueError: bad K / horizon / choose; `update` of an unknown round or a loss
            vector of the wrong shape or outside [0, 1].
    """

    def __init__(self, num_sources: int, horizon: int | None = None, choose: str = "sample",
                 seed: int | None = 0, learning_rate: str = "anytime"):
        if isinstance(num_sources, bool) or not isinstance(num_sources, int) or num_sources < 1:
            raise ValueError(f"num_sources must be an integer >= 1, got {num_sources!r}")
        if horizon is not None and int(horizon) < 1:
            raise ValueError(f"horizon must be >= 1 or None, got {horizon!r}")
        if choose not in _CHOICES:
            raise ValueError(f"choose must be one of {_CHOICES}, got {choose!r}")
        if learning_rate not in _RATES:
            raise ValueError(f"learning_rate must be one of {_RATES}, got {learning_rate!r}")
        if learning_rate == "adahedge" and horizon is not None:
            raise ValueError("AdaHedge tunes its own learning rate: give no horizon")
        self.num_sources, self.horizon, self.choose = num_sources, horizon, choose
        self.learning_rate = learning_rate
        self.mixability_gap = 0.0          # AdaHedge's Delta: summed delta_t of the resolved rounds
        self._rng = make_rng(seed)
        self.cumulative_loss = np.zeros(num_sources)
        self.expected_loss = self.chosen_loss = 0.0
        self.t = self.resolved = self.max_delay = 0
        self.delay_term = 0.0              # sum_t min(1, eta_t n_t / 4), n_t = rounds unresolved at t
        self._played: dict[int, tuple[np.ndarray, int]] = {}     # round -> (p_t, chosen)

    def weights(self, round_index: int | None = None) -> np.ndarray:
        """p_t (K,) float64 proportional to exp(-eta_t L), L = resolved cumulative losses,
        for round t = ``round_index`` (default the next round, t + 1)."""
        t = self.t + 1 if round_index is None else int(round_index)
        eta = self.eta(t)
        gap = self.cumulative_loss - self.cumulative_loss.min()
        if math.isinf(eta):                           # follow the leaders (AdaHedge, Delta = 0)
            w = (gap == 0).astype(np.float64)
        else:
            w = np.exp(-eta * gap)
        return w / w.sum()

    def eta(self, round_index: int) -> float:
        """The learning rate of round ``round_index`` (AdaHedge: of the next play;
        infinite while Delta = 0, 0 for one source)."""
        if self.learning_rate == "anytime":
            return hedge_learning_rate(self.num_sources, round_index, self.horizon)
        if self.num_sources == 1:
            return 0.0
        return math.inf if self.mixability_gap <= 0 else math.log(self.num_sources) / self.mixability_gap

    def play(self) -> tuple[int, int]:
        """Start a round: (round id t, chosen source index)."""
        if self.learning_rate == "adahedge" and self._played:
            raise ValueError("AdaHedge plays only after every earlier round was updated (no delayed feedback)")
        p = self.weights()
        self.t += 1
        if self._played and self.delay_term is not None:   # n_t losses p_t misses (module docstring)
            eta = hedge_learning_rate(self.num_sources, self.t, self.horizon)
            self.delay_term += min(1.0, eta * len(self._played) / 4.0)
        if self.choose == "argmax":
            chosen = int(np.argmax(p))
        else:
            chosen = int(min(np.searchsorted(np.cumsum(p), self._rng.random(), side="right"),
                             self.num_sources - 1))
        self._played[self.t] = (p, chosen)
        return self.t, chosen

    def update(self, round_id: int, losses: Sequence[float]) -> None:
        """Add round ``round_id``'s loss vector (K,) in [0, 1]."""
        if round_id not in self._played:
            raise ValueError(f"round {round_id} was not played or was already updated")
        loss = np.asarray(losses, dtype=np.float64).reshape(-1)
        if self.learning_rate == "adahedge":
            if loss.shape != (self.num_sources,) or not np.all(np.isfinite(loss)):
                raise ValueError(f"losses must be {self.num_sources} finite numbers, got {losses!r}")
        elif loss.shape != (self.num_sources,) or not np.all((loss >= 0) & (loss <= 1)):
            raise ValueError(f"losses must be {self.num_sources} numbers in [0, 1], got {losses!r}")
        p, chosen = self._played.pop(round_id)
        if self.learning_rate == "adahedge":
            self.mixability_gap += mixability_gap(p, loss, self.eta(self.t))
        self.cumulative_loss += loss
        self.expected_loss += float(p @ loss)
        self.chosen_loss += float(loss[chosen])
        self.resolved += 1
        self.max_delay = max(self.max_delay, self.t - round_id)

    def regret(self) -> dict:
        """The regret against the best source in hindsight over the resolved rounds:
        ``expected`` (sum p_t . l_t - min_i L^i), ``realised`` (chosen sources' losses -
        min_i L^i), ``best_source``, ``rounds``, ``max_delay`` and ``bound``
        (the smaller of `hedge_regret_bound` at that delay and the undelayed bound plus
        ``delay_term``, sum_t min(1, eta_t n_t / 4) over the rounds played)."""
        best = float(self.cumulative_loss.min()) if self.resolved else 0.0
        if self.learning_rate == "adahedge":
            return {"expected": self.expected_loss - best, "realised": self.chosen_loss - best,
                    "best_source": int(np.argmin(self.cumulative_loss)), "rounds": self.resolved,
                    "max_delay": self.max_delay, "bound": 2.0 * self.mixability_gap,
                    "mixability_gap": self.mixability_gap}
        bound = hedge_regret_bound(self.resolved, self.num_sources, self.horizon, self.max_delay)
        if self.max_delay and self.delay_term is not None:
            bound = min(bound, hedge_regret_bound(self.resolved, self.num_sources, self.horizon)
                        + self.delay_term)
        return {"expected": self.expected_loss - best, "realised": self.chosen_loss - best,
                "best_source": int(np.argmin(self.cumulative_loss)), "rounds": self.resolved,
                "max_delay": self.max_delay, "bound": bound}

    def state_dict(self) -> dict:
        return {"num_sources": self.num_sources, "horizon": self.horizon, "choose": self.choose,
                "cumulative_loss": self.cumulative_loss.tolist(), "expected_loss": self.expected_loss,
                "chosen_loss": self.chosen_loss, "t": self.t, "resolved": self.resolved,
                "max_delay": self.max_delay, "delay_term": self.delay_term, "rng": rng_state(self._rng),
                "learning_rate": self.learning_rate, "mixability_gap": self.mixability_gap,
                "played": [[k, p.tolist(), c] for k, (p, c) in self._played.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`. Raises ValueError: wrong keys or another K."""
        check_state_keys(state, {"num_sources", "horizon", "choose", "cumulative_loss", "expected_loss",
                                 "chosen_loss", "t", "resolved", "max_delay", "rng", "played"},
                         "HedgeOverSources")
        if int(state["num_sources"]) != self.num_sources:
            raise ValueError(f"state has {state['num_sources']} sources, this Hedge {self.num_sources}")
        if state.get("learning_rate", "anytime") != self.learning_rate:
            raise ValueError(f"state tunes the learning rate {state.get('learning_rate', 'anytime')!r}, "
                             f"this Hedge {self.learning_rate!r}")
        self.horizon, self.choose = state["horizon"], state["choose"]
        self.mixability_gap = float(state.get("mixability_gap", 0.0))
        self.cumulative_loss = np.array(state["cumulative_loss"], dtype=np.float64)
        self.expected_loss, self.chosen_loss = float(state["expected_loss"]), float(state["chosen_loss"])
        self.t, self.resolved, self.max_delay = int(state["t"]), int(state["resolved"]), int(state["max_delay"])
        # a state saved before delay_term existed: None, and `regret` uses the max-delay bound
        self.delay_term = None if state.get("delay_term") is None else float(state["delay_term"])
        set_rng_state(self._rng, state["rng"])
        self._played = {int(k): (np.array(p, dtype=np.float64), int(c)) for k, p, c in state["played"]}


class ThroughputLoss:
    """loss = 1 - r / R with r = committed / (draft_seconds + c(nodes + 1)) (module docstring).

    Args:
        verify_cost: seconds to verify 1..M tokens (entry n-1 = n tokens), finite > 0;
            made non-decreasing (`monotone_cost`).
        max_nodes: optional N >= 0, the most nodes a proposal will have (e.g. the
            plan's k or verify_size): R = max over n <= N + 1 only, which spreads the
            losses of small proposals over [0, 1] (a larger proposal's loss is clipped at 0).

    Raises:
        ValueError: a malformed table (from `monotone_cost`), max_nodes < 0.
    """

    def __init__(self, verify_cost: Sequence[float], max_nodes: int | None = None):
        self.cost = monotone_cost(verify_cost)
        if max_nodes is not None and (isinstance(max_nodes, bool) or int(max_nodes) < 0):
            raise ValueError(f"max_nodes must be an integer >= 0 or None, got {max_nodes!r}")
        top = self.cost.size if max_nodes is None else min(self.cost.size, int(max_nodes) + 1)
        sizes = np.arange(1, top + 1)
        self.rate_scale = float(np.max(sizes / self.cost[:top]))      # R, tokens per second

    def verify_seconds(self, num_tokens: int) -> float:
        """c(n) for n >= 1 new tokens (linear past the table)."""
        size = self.cost.size
        return float(self.cost[num_tokens - 1]) if num_tokens <= size else \
            float(self.cost[-1]) * num_tokens / size

    def __call__(self, committed: int, draft_seconds: float, num_nodes: int) -> float:
        """Loss in [0, 1] of a proposal of ``num_nodes`` nodes that would commit
        ``committed`` (<= num_nodes + 1) tokens, drafted in ``draft_seconds`` (>= 0)."""
        rate = committed / (max(0.0, draft_seconds) + self.verify_seconds(num_nodes + 1))
        return float(min(1.0, max(0.0, 1.0 - rate / self.rate_scale)))

    def round_losses(self, outcomes: Sequence[tuple[int, float, int]]) -> np.ndarray:
        """(K,) float64 losses of one resolved round: ``outcomes`` = per source
        (committed tokens, drafting seconds, nodes). Stateless."""
        return np.array([self(m, d, n) for m, d, n in outcomes], dtype=np.float64)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


class RatioLoss:
    """The Dinkelbach loss of the stream's throughput (module docstring), stateful:
    each resolved round is scored with theta_t from the rounds resolved before it,
    then added to the sources' totals.

    Args:
        verify_cost: seconds to verify 1..M tokens (entry n-1 = n tokens), finite > 0.
        max_nodes: N >= 0, the most nodes a proposal has: M = N + 1 tokens and
            C = 1.5 c(N + 1) seconds normalise the loss. None: N = the largest of the
            table's size - 1 and every proposal resolved so far (a running maximum,
            saved with the state).

    Attributes: ``tokens`` (K,) A_i, ``seconds`` (K,) B_i (None before the first
    round), ``rounds`` resolved; `theta` the current estimate (tokens/s), `rates`
    A_i / B_i (tokens/s).

    Raises:
        ValueError: a malformed table, max_nodes < 0; `round_losses` with another
            number of sources than before or negative seconds / tokens.
    """

    def __init__(self, verify_cost: Sequence[float], max_nodes: int | None = None):
        self._cost = ThroughputLoss(verify_cost, max_nodes)
        self.fixed_nodes = max_nodes is not None
        self._set_nodes(self._cost.cost.size - 1 if max_nodes is None else int(max_nodes))
        self.tokens: np.ndarray | None = None
        self.seconds: np.ndarray | None = None
        self.rounds = 0

    def _set_nodes(self, nodes: int) -> None:
        self.max_tokens = nodes + 1
        self.seconds_cap = 1.5 * self._cost.verify_seconds(nodes + 1)

    def verify_seconds(self, num_tokens: int) -> float:
        return self._cost.verify_seconds(num_tokens)

    @property
    def rates(self) -> np.ndarray:
        if self.tokens is None:
            return np.zeros(0)
        return np.divide(self.tokens, self.seconds, out=np.zeros_like(self.tokens), where=self.seconds > 0)

    @property
    def theta(self) -> float:
        return float(self.rates.max()) if self.rounds else 0.0

    def round_losses(self, outcomes: Sequence[tuple[int, float, int]]) -> np.ndarray:
        """(K,) float64 losses in [0, 1] of one resolved round, ``outcomes`` = per
        source (committed tokens m_i >= 0, drafting seconds d_i >= 0, nodes n_i >= 0);
        then the round joins the totals."""
        m = np.array([o[0] for o in outcomes], dtype=np.float64)
        sec = np.array([max(0.0, float(o[1])) + self.verify_seconds(int(o[2]) + 1) for o in outcomes])
        if self.tokens is not None and m.shape != self.tokens.shape:
            raise ValueError(f"round of {m.size} sources, earlier rounds had {self.tokens.size}")
        if np.any(m < 0) or not np.all(np.isfinite(sec)):
            raise ValueError(f"committed tokens must be >= 0 and seconds finite, got {outcomes!r}")
        largest = max(int(o[2]) for o in outcomes)
        if not self.fixed_nodes and largest + 1 > self.max_tokens:
            self._set_nodes(largest)
        theta, top = self.theta, float(self.max_tokens)
        loss = np.clip((theta * sec - m + top) / (theta * self.seconds_cap + top), 0.0, 1.0)
        if self.tokens is None:
            self.tokens, self.seconds = np.zeros_like(m), np.zeros_like(sec)
        self.tokens += m
        self.seconds += sec
        self.rounds += 1
        return loss

    def state_dict(self) -> dict:
        """The totals (plain lists) and the rounds resolved."""
        return {"tokens": None if self.tokens is None else self.tokens.tolist(),
                "seconds": None if self.seconds is None else self.seconds.tolist(), "rounds": self.rounds,
                "max_tokens": self.max_tokens}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`. Raises ValueError: wrong keys."""
        check_state_keys(state, {"tokens", "seconds", "rounds"}, "RatioLoss")
        self.tokens = None if state["tokens"] is None else np.array(state["tokens"], dtype=np.float64)
        self.seconds = None if state["seconds"] is None else np.array(state["seconds"], dtype=np.float64)
        self.rounds = int(state["rounds"])
        if not self.fixed_nodes and state.get("max_tokens") is not None:
            self._set_nodes(int(state["max_tokens"]) - 1)


def accepted_prefix(tokens: Sequence[int], parents: Sequence[int],
                    continuation: Sequence[int]) -> tuple[int, bool]:
    """The accepted length of a (greedy) tree against the known continuation.

    Args:
        tokens, parents: the proposal (parents before children, -1 = root's child).
        continuation: the committed tokens after the round's pending token, as far as
            they are known.

    Returns:
        (a, decided): a = depth of the longest path matching ``continuation``; decided
        is False when the path matched every known token and has children (a censored
        value: a lower bound).
    """
    children: dict[int, dict[int, int]] = {}
    for node, (tok, par) in enumerate(zip(tokens, parents)):
        children.setdefault(int(par), {}).setdefault(int(tok), node)
    node, depth = -1, 0
    while True:
        below = children.get(node)
        if not below:
            return depth, True
        if depth == len(continuation):
            return depth, False
        nxt = below.get(int(continuation[depth]))
        if nxt is None:
            return depth, True
        node, depth = nxt, depth + 1


@dataclass
class SourceDraft:
    """One source's proposal of one round: tokens / parents (lists), drafting seconds."""

    tokens: list[int]
    parents: list[int]
    draft_seconds: float

    @property
    def depth(self) -> int:
        depth: list[int] = []
        for par in self.parents:
            depth.append(1 if par < 0 else depth[par] + 1)
        return max(depth, default=0)


@dataclass
class _Round:
    round_id: int
    start: int                                   # offset of its continuation in the request
    drafts: list[SourceDraft] = field(default_factory=list)
    age: int = -1                                # later rounds committed since its own


class DelayedFeedback:
    """Pending rounds of one request until their sources' accepted lengths are decided.

    Args:
        loss: the `ThroughputLoss` or `RatioLoss` (its state is saved with this one's).
        max_delay: rounds a round may stay pending (>= 1); see the module docstring.

    ``add(round_id, drafts)`` before a round's tokens are committed, ``commit(tokens)``
    after (returns the rounds decided: list of (round_id, losses (K,))),
    ``end_request()`` decides all (same return). ``pending`` = rounds still waiting.

    Raises:
        ValueError: max_delay < 1.
    """

    def __init__(self, loss: "ThroughputLoss | RatioLoss", max_delay: int = 64):
        if isinstance(max_delay, bool) or not isinstance(max_delay, int) or max_delay < 1:
            raise ValueError(f"max_delay must be an integer >= 1, got {max_delay!r}")
        self.loss, self.max_delay = loss, max_delay
        self._rounds: list[_Round] = []
        self._tokens: list[int] = []             # committed tokens of the request since _offset
        self._offset = 0

    @property
    def pending(self) -> int:
        return len(self._rounds)

    def add(self, round_id: int, drafts: Sequence[SourceDraft]) -> None:
        self._rounds.append(_Round(round_id, self._offset + len(self._tokens), list(drafts)))

    def _outcomes(self, rnd: _Round, ended: bool) -> tuple[list[tuple[int, float, int]], bool]:
        """Per source (committed, drafting seconds, nodes) as far as known; decided?"""
        known = self._tokens[rnd.start - self._offset:]
        out, decided_all = [], True
        for draft in rnd.drafts:
            accepted, decided = accepted_prefix(draft.tokens, draft.parents, known)
            decided_all &= decided
            committed = min(accepted + 1, len(known)) if ended else accepted + 1
            out.append((committed, draft.draft_seconds, len(draft.tokens)))
        return out, decided_all

    def _collect(self, ended: bool) -> list[tuple[int, np.ndarray]]:
        done, keep = [], []
        for rnd in self._rounds:                  # in play order: a stateful loss sees them so
            outcomes, decided = self._outcomes(rnd, ended)
            if decided or ended or rnd.age >= self.max_delay:
                done.append((rnd.round_id, self.loss.round_losses(outcomes)))
            else:
                keep.append(rnd)
        self._rounds = keep
        start = min((r.start for r in keep), default=self._offset + len(self._tokens))
        del self._tokens[: start - self._offset]
        self._offset = start
        return done

    def commit(self, tokens: Sequence[int]) -> list[tuple[int, np.ndarray]]:
        """Append a round's committed tokens; return the rounds now decided."""
        self._tokens.extend(int(t) for t in tokens)
        for rnd in self._rounds:
            rnd.age += 1
        return self._collect(False)

    def end_request(self) -> list[tuple[int, np.ndarray]]:
        """The request ended: decide every pending round exactly; start a new request."""
        done = self._collect(True)
        self._tokens, self._offset = [], 0
        return done

    def state_dict(self) -> dict:
        """The pending rounds (id, start, drafts, age) and the request's tokens kept for
        them, as plain lists (a stream's saved state resumes to the same losses)."""
        return {"max_delay": self.max_delay, "offset": self._offset, "tokens": list(self._tokens),
                "rounds": [[r.round_id, r.start, r.age,
                            [[d.tokens, d.parents, d.draft_seconds] for d in r.drafts]] for r in self._rounds],
                "loss": self.loss.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` (the loss's kind is the constructor's; its totals, where
        saved, are restored). Raises ValueError: wrong keys."""
        check_state_keys(state, {"max_delay", "offset", "tokens", "rounds"}, "DelayedFeedback")
        if state.get("loss"):
            self.loss.load_state_dict(state["loss"])
        self.max_delay, self._offset = int(state["max_delay"]), int(state["offset"])
        self._tokens = [int(t) for t in state["tokens"]]
        self._rounds = [_Round(int(rid), int(start), [SourceDraft([int(t) for t in toks], [int(q) for q in pars],
                                                                  float(sec)) for toks, pars, sec in drafts], int(age))
                        for rid, start, age, drafts in state["rounds"]]
