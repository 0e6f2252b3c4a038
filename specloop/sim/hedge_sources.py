"""Hedge over draft sources in the simulator: sources with known acceptance processes
driven by the same `specloop.strategies.hedge_sources` objects as
the real ``hedge:`` drafter (`HedgeOverSources`, `DelayedFeedback`, `ThroughputLoss`),
through the one round driver (`specloop.strategies.engine.drive_round`).

Model. A stream of requests, each of one *domain* and a known greedy continuation of
``num_tokens`` target tokens (drawn uniformly from a vocabulary; the target's output does
not depend on the draft, so the continuation is fixed before any round). Source i
proposes a chain of min(k, k_i, tokens left - 1) tokens each round in ``draft_seconds_i``
seconds: its first j tokens are the continuation's, where j counts the leading
successes of i.i.d. Bernoulli(acc_i[domain]) trials (the draft's per-position
acceptance rate in that domain), then one wrong token and filler. The Hedge run draws
one source per round from `HedgeOverSources` (as `HedgeDrafter.propose` does), every
source proposes (so the round's drafting time is the sum of the sources' seconds, as
in the real drafter), the chosen chain is verified against the continuation (greedy:
accepted = longest matching prefix, committed = accepted + 1 capped at the request's
end) and priced with the verify-cost table c. Each source's loss,
1 - r_i / R with r_i = m_i / (d_i + c(n_i + 1)) (`ThroughputLoss`), is decided by
`DelayedFeedback` from the committed tokens only: a source whose chain matched
everything committed in its round (censored) waits for the next rounds' tokens, at
most its depth in rounds, and is decided exactly at the request's end.

Regret (`SourcesRun.report`): Hedge's expected regret against the best source in
hindsight on the realised rounds, sum_t p_t . l_t - min_i sum_t l_t,i, in loss units
and times R in tokens per second summed over rounds, against the bound its learning
rate gives (`HedgeOverSources.regret`, from Cesa-Bianchi & Lugosi 2006 Thm. 2.2 / 2.3
plus the delay term derived in `specloop.strategies.hedge_sources`). It holds on every
run (the inequality is pathwise, also against losses that depend on past choices), so
checking it over many seeds is a check of the implementation, not a statistical test;
the *realised* regret (the sampled choices' losses) exceeds the expected one by a
martingale with increments in an interval of length 1, so it is within
sqrt(T ln(1/delta) / 2) of it with probability 1 - delta (Azuma-Hoeffding).

Why the stream can beat every source run alone although the regret is >= about 0 on
Hedge's own rounds: per-round regret compares sources on Hedge's round boundaries; a
source run alone through a domain where it is weak commits few tokens per round and so
spends many rounds there. When the best source changes between domains, Hedge switches
after the cumulative losses cross and serves each domain mostly with its better source:
fewer rounds, hence more tokens per second, than any single source on the whole stream.

This module imports strategies and `specloop.record` only (sim layer; no realmodels).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specloop.record import RoundRecord, Trace
from specloop.strategies.base import PlanState
from specloop.strategies.engine import chain_step, drive_round
from specloop.strategies.hedge_sources import (DelayedFeedback, HedgeOverSources, SourceDraft,
                                               ThroughputLoss, accepted_prefix)
from specloop.strategies.policies import FixedK

__all__ = ["AcceptanceSource", "SourceRequest", "domain_shift_requests", "SimSourcesEngine",
           "SourcesRun", "run_sources"]


@dataclass(frozen=True)
class AcceptanceSource:
    """A draft source with a known acceptance process.

    Attributes:
        name: for reports.
        acceptance_rates: per domain, the probability (in [0, 1]) that each drafted
            position is accepted given the previous ones were (i.i.d. per position).
        draft_seconds: seconds per proposal (>= 0), whatever its length.
        max_draft_tokens: k_i >= 1, the longest chain it proposes.
    """

    name: str
    acceptance_rates: tuple[float, ...]
    draft_seconds: float = 0.0
    max_draft_tokens: int = 8

    def __post_init__(self) -> None:
        rates = tuple(float(a) for a in self.acceptance_rates)
        if not rates or any(not 0.0 <= a <= 1.0 for a in rates):
            raise ValueError(f"source {self.name!r}: acceptance_rates must be numbers in [0, 1], got {rates}")
        if not (math.isfinite(float(self.draft_seconds)) and float(self.draft_seconds) >= 0):
            raise ValueError(f"source {self.name!r}: draft_seconds must be finite >= 0, got {self.draft_seconds}")
        if int(self.max_draft_tokens) < 1:
            raise ValueError(f"source {self.name!r}: max_draft_tokens must be >= 1, got {self.max_draft_tokens}")
        object.__setattr__(self, "acceptance_rates", rates)


@dataclass(frozen=True)
class SourceRequest:
    """One request of the stream: its domain index and how many tokens it generates (>= 1)."""

    domain: int
    num_tokens: int


def domain_shift_requests(domains: Sequence[int], requests_per_domain: int,
                          tokens_per_request: int) -> list[SourceRequest]:
    """``requests_per_domain`` requests of each domain in ``domains``, in that order
    (a piecewise stream whose domain, hence best source, changes at the boundaries).

    Raises:
        ValueError: no domains, a negative domain, sizes < 1.
    """
    if not domains or any(int(d) < 0 for d in domains):
        raise ValueError(f"domains must be non-negative indices, got {list(domains)}")
    if int(requests_per_domain) < 1 or int(tokens_per_request) < 1:
        raise ValueError("requests_per_domain and tokens_per_request must be >= 1")
    return [SourceRequest(int(d), int(tokens_per_request)) for d in domains for _ in range(int(requests_per_domain))]


def _chain(n: int) -> list[int]:
    return list(range(-1, n - 1))


class SimSourcesEngine:
    """The sources model as a `specloop.strategies.engine.RoundEngine` (module docstring).

    Args:
        sources: the K `AcceptanceSource` s.
        requests: the stream (`SourceRequest` s; every domain < each source's rate count).
        verify_cost: seconds to verify 1..M tokens (entry n-1 = n tokens), > 0.
        fixed_source: None = Hedge over all sources; an index = that source alone (only
            it drafts; no Hedge).
        horizon, choose, hedge_seed: `HedgeOverSources` options.
        max_delay: `DelayedFeedback`'s bound (rounds, >= 1).
        max_nodes: `ThroughputLoss`'s normalisation cap (None = the whole table).
        seed: seed of the continuations (per request, the same for every run of one
            seed) and of the sources' acceptance draws (one generator per source).

    Chain plans only (ValueError for a tree plan). Attributes after a run: ``trace``
    records, ``played`` (round id -> p_t (K,)), ``resolved`` (list of (round id,
    losses (K,), rounds played when resolved)), ``truth`` (round id -> losses (K,)
    computed from the whole continuation, the uncensored reference), ``done``.

    Raises:
        ValueError: empty sources / requests, a domain without a rate, bad index.
    """

    def __init__(self, sources: Sequence[AcceptanceSource], requests: Sequence[SourceRequest],
                 verify_cost: Sequence[float], *, fixed_source: int | None = None,
                 horizon: int | None = None, choose: str = "sample", hedge_seed: int = 0,
                 max_delay: int = 64, max_nodes: int | None = None, seed: int = 0, vocab_size: int = 1000):
        self.sources, self.requests = list(sources), list(requests)
        if not self.sources or not self.requests:
            raise ValueError("need at least one source and one request")
        for req in self.requests:
            if int(req.num_tokens) < 1 or any(not 0 <= req.domain < len(s.acceptance_rates) for s in self.sources):
                raise ValueError(f"request {req}: domain without an acceptance rate in some source, or no tokens")
        if fixed_source is not None and not 0 <= int(fixed_source) < len(self.sources):
            raise ValueError(f"fixed_source must index one of {len(self.sources)} sources, got {fixed_source}")
        self.fixed_source = None if fixed_source is None else int(fixed_source)
        self.loss = ThroughputLoss(verify_cost, max_nodes)
        self.hedge = None if self.fixed_source is not None else \
            HedgeOverSources(len(self.sources), horizon, choose, hedge_seed)
        self.delayed = DelayedFeedback(self.loss, max_delay)
        self.seed, self.vocab_size = int(seed), int(vocab_size)
        self._draws = [np.random.default_rng([self.seed, 1, i]) for i in range(len(self.sources))]
        self.trace = Trace([], {"model": "hedge-sources", "sources": [s.name for s in self.sources],
                                "fixed_source": self.fixed_source})
        self.played: dict[int, np.ndarray] = {}
        self.resolved: list[tuple[int, np.ndarray, int]] = []
        self.truth: dict[int, np.ndarray] = {}
        self.chosen: list[int] = []
        self.round_index, self._request = 0, -1
        self._next_request()

    @property
    def done(self) -> bool:
        return self._request >= len(self.requests)

    def _next_request(self) -> None:
        self._request += 1
        self._pos = 0
        if not self.done:
            rng = np.random.default_rng([self.seed, 0, self._request])
            self._cont = rng.integers(0, self.vocab_size, size=self.requests[self._request].num_tokens).tolist()

    def plan_state(self) -> PlanState:
        return PlanState(self.round_index, self._pos, len(self._cont) - self._pos)

    def start_round(self, plan) -> int:
        if self.done:
            raise ValueError("the stream is finished")
        if plan.tree is not None:
            raise ValueError("SimSourcesEngine drafts chains only (a tree plan was given)")
        self._k = min(int(plan.num_draft_tokens), len(self._cont) - self._pos - 1)
        return max(0, self._k)

    def _propose(self, i: int) -> list[int]:
        src, rng = self.sources[i], self._draws[i]
        n = max(0, min(self._k, src.max_draft_tokens))
        rate, matched = src.acceptance_rates[self.requests[self._request].domain], 0
        while matched < n and rng.random() < rate:
            matched += 1
        right = self._cont[self._pos:self._pos + matched]
        wrong = [(t + 1) % self.vocab_size for t in self._cont[self._pos + matched:self._pos + n]]
        return right + wrong

    def draft(self, hooks) -> None:
        active = range(len(self.sources)) if self.fixed_source is None else [self.fixed_source]
        if self.hedge is not None:
            self.played[self.hedge.t + 1] = self.hedge.weights()
            self._round_id, self._chosen = self.hedge.play()
        else:
            self._round_id, self._chosen = self.round_index + 1, self.fixed_source
        drafts = {i: self._propose(i) for i in active}
        chosen = drafts[self._chosen]
        for depth in range(1, len(chosen) + 1):      # the policy may stop the verified chain early
            if not hooks.continue_drafting(chain_step(depth, self._pos, 1.0, 1.0)):
                drafts[self._chosen] = chosen[:depth]
                break
        self._drafts = [SourceDraft(drafts[i], _chain(len(drafts[i])), self.sources[i].draft_seconds)
                        for i in active]
        if self.hedge is not None:
            self.delayed.add(self._round_id, self._drafts)
            self.truth[self._round_id] = self._true_losses()

    def _true_losses(self) -> np.ndarray:
        rest = self._cont[self._pos:]
        out = []
        for draft in self._drafts:
            accepted, _ = accepted_prefix(draft.tokens, draft.parents, rest)
            out.append(self.loss(min(accepted + 1, len(rest)), draft.draft_seconds, len(draft.tokens)))
        return np.array(out)

    def verify(self, hooks) -> RoundRecord:
        mine = self._drafts[0 if self.fixed_source is not None else self._chosen]
        rest = self._cont[self._pos:]
        accepted, _ = accepted_prefix(mine.tokens, mine.parents, rest)
        committed = rest[:accepted + 1]
        n = len(mine.tokens)
        record = RoundRecord(round_index=self.round_index, stream_index=self._request, num_draft_tokens=n,
                             tree_depth=n, verified_tokens=n + 1, accepted_tokens=accepted,
                             tokens_per_round=len(committed),
                             draft_time=float(sum(d.draft_seconds for d in self._drafts)),
                             verify_time=self.loss.verify_seconds(n + 1), target_time=self.loss.verify_seconds(1))
        self.chosen.append(self._chosen)
        self.round_index += 1
        self._pos += len(committed)
        if self.hedge is not None:
            self._apply(self.delayed.commit(committed))
            if self._pos >= len(self._cont):
                self._apply(self.delayed.end_request())
        if self._pos >= len(self._cont):
            self._next_request()
        self.trace.append(record)
        return record

    def _apply(self, decided) -> None:
        for round_id, losses in decided:
            self.hedge.update(round_id, losses)
            self.resolved.append((round_id, losses, self.hedge.t))


@dataclass
class SourcesRun:
    """A finished run: the engine's ``trace`` and, for a Hedge run, its ``report``."""

    trace: Trace
    engine: SimSourcesEngine
    report: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.trace.tokens_per_second(include_update=False)


def _report(engine: SimSourcesEngine) -> dict:
    """Hedge's regret report (`HedgeOverSources.regret`) plus the same in tokens/s
    (times R: loss = 1 - r / R), the uniform chooser's regret on the same loss vectors
    (a baseline the bound must separate), per-source cumulative losses, choices."""
    hedge = engine.hedge
    out = dict(hedge.regret())
    scale = engine.loss.rate_scale
    losses = np.array([losses for _, losses, _ in engine.resolved]).reshape(-1, len(engine.sources))
    best = float(losses.sum(axis=0).min()) if losses.size else 0.0
    out.update({"rate_scale_tokens_per_s": scale, "expected_tokens_per_s": out["expected"] * scale,
                "bound_tokens_per_s": out["bound"] * scale,
                "uniform_regret": float(losses.mean(axis=1).sum() - best) if losses.size else 0.0,
                "cumulative_loss": hedge.cumulative_loss.tolist(),
                "chosen_counts": np.bincount(engine.chosen, minlength=len(engine.sources)).tolist(),
                "sources": [s.name for s in engine.sources]})
    return out


def run_sources(sources: Sequence[AcceptanceSource], requests: Sequence[SourceRequest],
                verify_cost: Sequence[float], num_draft_tokens: int = 8, policy=None, **options) -> SourcesRun:
    """Serve the whole stream (`SimSourcesEngine` options in ``options``) under
    ``policy`` (default `FixedK(num_draft_tokens)`), one `drive_round` per round.

    Returns:
        `SourcesRun` (``report`` filled for a Hedge run, i.e. ``fixed_source`` None).

    Raises:
        ValueError: as `SimSourcesEngine`; a policy whose plan is not a chain.
    """
    engine = SimSourcesEngine(sources, requests, verify_cost, **options)
    policy = FixedK(num_draft_tokens) if policy is None else policy
    while not engine.done:
        drive_round(policy, engine)
    return SourcesRun(engine.trace, engine, _report(engine) if engine.hedge is not None else {})
