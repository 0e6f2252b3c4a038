"""Hedge over draft sources with delayed, censoring-free feedback (issue 21, section 2).

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
loss maximises the summed per-round rate. (With ``max_nodes`` N, R is the maximum over
n <= N + 1 only, and a larger proposal's loss is clipped at 0.)

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

__all__ = ["hedge_learning_rate", "hedge_regret_bound", "HedgeOverSources", "ThroughputLoss",
           "accepted_prefix", "DelayedFeedback", "SourceDraft"]

_CHOICES = ("sample", "argmax")


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


class HedgeOverSources:
    """Exponential weights over K sources, fed delayed loss vectors in [0, 1]^K.

    Args:
        num_sources: K >= 1.
        horizon: T for the fixed rate sqrt(8 ln K / T), or None for the anytime rate.
        choose: "sample" (draw the source from p_t with the own generator; the regret
            bound is on the expected loss) or "argmax" (the heaviest source; no bound).
        seed: seed of the learner's numpy Generator.

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
                 seed: int | None = 0):
        if isinstance(num_sources, bool) or not isinstance(num_sources, int) or num_sources < 1:
            raise ValueError(f"num_sources must be an integer >= 1, got {num_sources!r}")
        if horizon is not None and int(horizon) < 1:
            raise ValueError(f"horizon must be >= 1 or None, got {horizon!r}")
        if choose not in _CHOICES:
            raise ValueError(f"choose must be one of {_CHOICES}, got {choose!r}")
        self.num_sources, self.horizon, self.choose = num_sources, horizon, choose
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
        eta = hedge_learning_rate(self.num_sources, t, self.horizon)
        z = -eta * (self.cumulative_loss - self.cumulative_loss.min())
        w = np.exp(z)
        return w / w.sum()

    def play(self) -> tuple[int, int]:
        """Start a round: (round id t, chosen source index)."""
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
        if loss.shape != (self.num_sources,) or not np.all((loss >= 0) & (loss <= 1)):
            raise ValueError(f"losses must be {self.num_sources} numbers in [0, 1], got {losses!r}")
        p, chosen = self._played.pop(round_id)
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
                "played": [[k, p.tolist(), c] for k, (p, c) in self._played.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`. Raises ValueError: wrong keys or another K."""
        check_state_keys(state, {"num_sources", "horizon", "choose", "cumulative_loss", "expected_loss",
                                 "chosen_loss", "t", "resolved", "max_delay", "rng", "played"},
                         "HedgeOverSources")
        if int(state["num_sources"]) != self.num_sources:
            raise ValueError(f"state has {state['num_sources']} sources, this Hedge {self.num_sources}")
        self.horizon, self.choose = state["horizon"], state["choose"]
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
        loss: the `ThroughputLoss`.
        max_delay: rounds a round may stay pending (>= 1); see the module docstring.

    ``add(round_id, drafts)`` before a round's tokens are committed, ``commit(tokens)``
    after (returns the rounds decided: list of (round_id, losses (K,))),
    ``end_request()`` decides all (same return). ``pending`` = rounds still waiting.

    Raises:
        ValueError: max_delay < 1.
    """

    def __init__(self, loss: ThroughputLoss, max_delay: int = 64):
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

    def _losses(self, rnd: _Round, ended: bool) -> tuple[np.ndarray, bool]:
        known = self._tokens[rnd.start - self._offset:]
        out, decided_all = [], True
        for draft in rnd.drafts:
            accepted, decided = accepted_prefix(draft.tokens, draft.parents, known)
            decided_all &= decided
            committed = min(accepted + 1, len(known)) if ended else accepted + 1
            out.append(self.loss(committed, draft.draft_seconds, len(draft.tokens)))
        return np.array(out), decided_all

    def _collect(self, ended: bool) -> list[tuple[int, np.ndarray]]:
        done, keep = [], []
        for rnd in self._rounds:
            losses, decided = self._losses(rnd, ended)
            if decided or ended or rnd.age >= self.max_delay:
                done.append((rnd.round_id, losses))
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
                            [[d.tokens, d.parents, d.draft_seconds] for d in r.drafts]] for r in self._rounds]}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` (the loss is the constructor's). Raises ValueError: wrong keys."""
        check_state_keys(state, {"max_delay", "offset", "tokens", "rounds"}, "DelayedFeedback")
        self.max_delay, self._offset = int(state["max_delay"]), int(state["offset"])
        self._tokens = [int(t) for t in state["tokens"]]
        self._rounds = [_Round(int(rid), int(start), [SourceDraft([int(t) for t in toks], [int(q) for q in pars],
                                                                  float(sec)) for toks, pars, sec in drafts], int(age))
                        for rid, start, age, drafts in state["rounds"]]
