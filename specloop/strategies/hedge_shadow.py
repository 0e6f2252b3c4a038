"""Each draft source's own trajectory over the committed stream: unbiased feedback for
Hedge over draft sources.

Why not score every source on the rounds that were played (`hedge_sources.DelayedFeedback`,
``feedback="round"``)? A round starts right after the played source's rejection, and
rejections cluster: the positions after one are where that source is weak and the
others are not. Scored on the played rounds, the played source looks worse than it is
alone and the others better. On 150 ShareGPT prompts (every 8th of the held-out
recording, bfloat16 verify table), with Hedge forced to play the suffix source, the
round feedback gave the context n-gram 44.5 priced tokens/s and the suffix source 41.2,
while alone they reach 37.8 and 40.6. Over the whole 1200-prompt stream, Hedge on round
feedback kept mixing and reached 0.947 (choose) / 0.959 (merge) of the best source
alone; on shadow feedback, choosing per request, 0.990 / 0.989
(`benchmarks/results/stream_sources_full1200_bf16.json`).

Shadow feedback. With greedy decoding the committed continuation does not depend on
the drafts, so each source's *standalone* run is determined by it: source i's round at
offset c (its proposal drafted from the context up to c) accepts the longest path
matching the committed tokens after c (`hedge_sources.accepted_prefix`), commits
m = a + 1 tokens and its next round starts at c + m. `ShadowFeedback` follows every
source's own run ("shadow") alongside the played one, from the tokens the verifier
commits: no extra target calls, and each source proposes once per round of its own run
(as it would alone), drafting from the context up to its cursor with the state its own
rounds gave it. Played proposals are taken from the shadows: a source whose cursor is at
the played round's offset P proposes there; one whose shadow round began at c < P and
still matches every token up to P offers the subtree under its matched node (what it
would be verifying alone). So when Hedge settles on one source the played run *is* that
source's standalone run, round for round.

Loss. Every shadow covers the same committed tokens, so standalone throughputs differ
only in seconds: source i's shadow round of m tokens, n nodes, drafted in d seconds
costs s = (d + c(n + 1)) / m seconds per committed token (c the verify-cost table).
A played round committing tokens [P, P + m_r) is scored, per source, by the seconds its
shadow spends on exactly those tokens, normalised into [0, 1]:

    loss_i = min(1, sum_{t in round} min(s_i(t), S) / (M S)),   S = 1.5 c(N + 1), M = N + 1,

N the most nodes of a proposal (``max_nodes``, or the running maximum). The summed loss
of source i is its standalone seconds on the stream / (M S) (exactly, while no
per-token cost exceeds S), so the best source in hindsight for Hedge's regret is the
source with the highest standalone throughput: the comparator Hedge is measured against. Hedge's regret
bound (`hedge_sources.hedge_regret_bound`) holds for these losses as played; the played
run's own throughput approaches the best source's as the weights concentrate, less the
cost of drafting and updating the other shadows.

Delay. A played round's losses are known once every shadow has decided its tokens. A
shadow round of depth D is decided once D tokens past its start are known, so a played
round waits at most D later played rounds (each commits >= 1 token); a shadow still
undecided after ``max_delay`` played rounds (only possible if rounds commit nothing) is
closed at the known end (its censored lower bound). At the end of a request every
shadow is decided exactly: its tree clipped to depth (tokens left - 1), as the decoder
clips a round, so it commits a + 1 <= the tokens left. (A shadow round decided *before*
the end, within its depth of it, is priced with its unclipped node count: the drafter is
not told how many tokens a request has left, so the verify seconds of such a round can
exceed the standalone run's by the nodes the decoder would have clipped; its tokens are
exact.)

Sampling (deterministic sources): the committed stream is distributed as the target's
samples whatever the drafts, and a point mass x is accepted exactly when the committed
token is x, so each shadow is a sample of the source's standalone run.

This module sees no models and no simulator (strategies layer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from specloop.strategies._state import check_state_keys
from specloop.strategies.hedge_sources import SourceDraft, accepted_prefix

__all__ = ["ShadowFeedback", "ShadowDecision", "accepted_path", "subtree_below"]


@dataclass
class ShadowDecision:
    """One decided shadow round: source index, its start offset in the request's
    committed tokens, the accepted path (node indices, root side first), the tokens it
    commits, the draft it verified, and whether it reaches the request's end."""

    source: int
    start: int
    accepted: list[int]
    committed: list[int]
    draft: SourceDraft
    finished: bool


@dataclass
class _Shadow:
    cursor: int = 0                               # offset of its next (or pending) round
    draft: SourceDraft | None = None              # the pending round's proposal, at ``cursor``
    age: int = 0                                  # played rounds committed since it was drafted
    segments: list = field(default_factory=list)  # decided rounds: [start, end, seconds]


def accepted_path(tokens: Sequence[int], parents: Sequence[int], continuation: Sequence[int],
                  limit: int | None = None) -> list[int]:
    """Node indices of the path of ``(tokens, parents)`` matching ``continuation``
    (greedy acceptance; parents before children), at most ``limit`` deep."""
    path, node = [], -1
    cap = len(continuation) if limit is None else min(limit, len(continuation))
    for depth in range(cap):
        nxt = next((i for i in range(len(tokens)) if parents[i] == node and tokens[i] == continuation[depth]), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path


def subtree_below(parents: Sequence[int], node: int, max_nodes: int | None = None) -> list[int]:
    """Indices (increasing) of the strict descendants of ``node`` (-1 = the whole tree),
    the first ``max_nodes`` in topological order (closed under ancestors below ``node``)."""
    inside = {node}
    keep = []
    for i, par in enumerate(parents):
        if par in inside:
            inside.add(i)
            keep.append(i)
    return keep if max_nodes is None else keep[:max(0, int(max_nodes))]


class ShadowFeedback:
    """Every source's standalone run over one request's committed tokens (module docstring).

    Args:
        num_sources: K >= 1.
        verify_seconds: c(n), seconds to verify n >= 1 new tokens.
        max_nodes: N >= 0, the most nodes of a proposal, or None (the running maximum,
            starting at ``default_nodes``).
        default_nodes: N before any proposal when ``max_nodes`` is None.
        max_delay: played rounds a shadow round may stay undecided (>= 1).

    Use per request: `start_request` (optionally with the ``active`` sources only: the
    others neither draft nor count toward `resolved`); each played round: `wants` -> for each index
    there, draft at `cursor` and `offer` (repeat until `wants` is empty), then
    `add_round` and `commit` its tokens; at the end `end_request`, the same `wants` /
    `offer` loop (decided at once), then `close_request`. `offer` / `commit` /
    `end_request` return the `ShadowDecision` s for the sources' ``observe``;
    `resolved` returns the played rounds whose loss vectors are now known.

    Attributes: ``tokens_decided`` (K,) and ``seconds_decided`` (K,): each shadow's
    committed tokens and seconds over the stream (``rates`` = their ratio, tokens/s).

    Raises:
        ValueError: K < 1, max_delay < 1, max_nodes < 0; `offer` to a source that does
            not want a draft.
    """

    def __init__(self, num_sources: int, verify_seconds: Callable[[int], float], max_nodes: int | None = None,
                 default_nodes: int = 8, max_delay: int = 64):
        if isinstance(num_sources, bool) or not isinstance(num_sources, int) or num_sources < 1:
            raise ValueError(f"num_sources must be an integer >= 1, got {num_sources!r}")
        if isinstance(max_delay, bool) or not isinstance(max_delay, int) or max_delay < 1:
            raise ValueError(f"max_delay must be an integer >= 1, got {max_delay!r}")
        if max_nodes is not None and (isinstance(max_nodes, bool) or int(max_nodes) < 0):
            raise ValueError(f"max_nodes must be an integer >= 0 or None, got {max_nodes!r}")
        self.num_sources, self.verify_seconds, self.max_delay = num_sources, verify_seconds, max_delay
        self.fixed_nodes = max_nodes is not None
        self._set_nodes(int(max_nodes) if max_nodes is not None else int(default_nodes))
        self.tokens_decided = np.zeros(num_sources)
        self.seconds_decided = np.zeros(num_sources)
        self.start_request()

    def _set_nodes(self, nodes: int) -> None:
        self.max_nodes = nodes
        self.max_tokens = nodes + 1
        self.seconds_cap = 1.5 * float(self.verify_seconds(nodes + 1))

    @property
    def rates(self) -> np.ndarray:
        """(K,) each shadow's standalone tokens / seconds so far (0 before any)."""
        return np.divide(self.tokens_decided, self.seconds_decided, out=np.zeros(self.num_sources),
                         where=self.seconds_decided > 0)

    # -- the request's life --------------------------------------------------------------
    def start_request(self, active: Sequence[int] | None = None) -> None:
        """A new request; only the ``active`` sources' shadows run in it (default all)."""
        self._tokens: list[int] = []
        self._ended = False
        self._shadows = [_Shadow() for _ in range(self.num_sources)]
        self._rounds: list[list[int]] = []           # played rounds: [round_id, start, end (-1 = open)]
        self.active = list(range(self.num_sources)) if active is None else sorted({int(i) for i in active})
        if not self.active or not all(0 <= i < self.num_sources for i in self.active):
            raise ValueError(f"active sources must be a non-empty subset of 0..{self.num_sources - 1}, got {active!r}")

    @property
    def ended(self) -> bool:
        """`end_request` was called for the open request."""
        return self._ended

    @property
    def known(self) -> int:
        """Tokens committed in this request so far."""
        return len(self._tokens)

    def tokens(self, end: int) -> list[int]:
        """The request's committed tokens before offset ``end``."""
        return self._tokens[:end]

    def cursor(self, source: int) -> int:
        return self._shadows[source].cursor

    def pending_draft(self, source: int) -> SourceDraft | None:
        return self._shadows[source].draft

    def wants(self) -> list[int]:
        """Sources whose shadow needs a draft at its cursor now."""
        return [i for i in self.active for sh in [self._shadows[i]]
                if sh.draft is None and (sh.cursor < self.known or (sh.cursor == self.known and not self._ended))]

    def offer(self, source: int, draft: SourceDraft) -> list[ShadowDecision]:
        """Source ``source``'s draft at its cursor; decided at once when the known
        tokens (or the request's end) decide it."""
        if source not in self.wants():
            raise ValueError(f"source {source} has a pending shadow round or nothing left to draft")
        sh = self._shadows[source]
        sh.draft, sh.age = draft, 0
        if not self.fixed_nodes and len(draft.tokens) > self.max_nodes:
            self._set_nodes(len(draft.tokens))
        decided = self._decide(source)
        return [decided] if decided is not None else []

    def _decide(self, source: int) -> ShadowDecision | None:
        sh = self._shadows[source]
        known = self._tokens[sh.cursor:]
        accepted, decided = accepted_prefix(sh.draft.tokens, sh.draft.parents, known)
        decided = decided and accepted < len(known)       # the bonus / correction token is known too
        if not (decided or self._ended or sh.age >= self.max_delay):
            return None
        nodes = len(sh.draft.tokens)
        if decided and not self._ended:
            committed = accepted + 1
        elif self._ended and known:        # exact: the decoder clips a round to depth (tokens left - 1)
            depth: list[int] = []
            for par in sh.draft.parents:
                depth.append(1 if par < 0 else depth[par] + 1)
            nodes = sum(d <= len(known) - 1 for d in depth)
            accepted = min(accepted, len(known) - 1)
            committed = accepted + 1
        else:                              # an over-age round: its censored lower bound
            committed = min(accepted + 1, len(known))
        if committed == 0:                 # drafted at the very end: never verified, costs nothing
            sh.draft = None
            return None
        path = accepted_path(sh.draft.tokens, sh.draft.parents, known, min(accepted, committed))
        start, draft = sh.cursor, sh.draft
        seconds = max(0.0, float(draft.draft_seconds)) + float(self.verify_seconds(nodes + 1))
        sh.segments.append([start, start + committed, seconds])
        sh.cursor, sh.draft = start + committed, None
        self.tokens_decided[source] += committed
        self.seconds_decided[source] += seconds
        return ShadowDecision(source, start, path, known[:committed], draft,
                              self._ended and sh.cursor == self.known)

    def add_round(self, round_id: int) -> None:
        """A played round starts at the current offset."""
        self._rounds.append([int(round_id), self.known, -1])

    def commit(self, tokens: Sequence[int]) -> list[ShadowDecision]:
        """The played round's committed tokens; returns the shadow rounds now decided."""
        self._tokens.extend(int(t) for t in tokens)
        if self._rounds and self._rounds[-1][2] < 0:
            self._rounds[-1][2] = self.known
        out = []
        for i, sh in enumerate(self._shadows):
            if sh.draft is not None:
                sh.age += 1
                decided = self._decide(i)
                if decided is not None:
                    out.append(decided)
        return out

    def end_request(self) -> list[ShadowDecision]:
        """The request ended: decide every pending shadow round exactly (the sources
        still behind the end then draft through `wants` / `offer`)."""
        self._ended = True
        if self._rounds and self._rounds[-1][2] < 0:
            self._rounds[-1][2] = self.known
        return [d for i, sh in enumerate(self._shadows) if sh.draft is not None
                for d in [self._decide(i)] if d is not None]

    def close_request(self) -> list[tuple[int, np.ndarray]]:
        """After `end_request` and its drafts: every played round's losses; a new request."""
        if not self._ended or self.wants() or any(self._shadows[i].draft is not None for i in self.active):
            raise ValueError("close_request before every shadow reached the request's end")
        done = self.resolved()
        self.start_request()
        return done

    # -- losses ------------------------------------------------------------------------
    def resolved(self) -> list[tuple[int, np.ndarray]]:
        """(round_id, losses (K,) in [0, 1]) of the played rounds every shadow has decided,
        in play order (module docstring: the loss)."""
        reach = min(self._shadows[i].cursor for i in self.active)
        done = []
        while self._rounds and 0 <= self._rounds[0][2] <= reach:
            round_id, start, end = self._rounds.pop(0)
            done.append((round_id, self._round_loss(start, end)))
        first = self._rounds[0][1] if self._rounds else reach
        for sh in self._shadows:                   # segments wholly before every open round: gone
            while sh.segments and sh.segments[0][1] <= first:
                sh.segments.pop(0)
        return done

    def _round_loss(self, start: int, end: int) -> np.ndarray:
        cap, scale = self.seconds_cap, self.max_tokens * self.seconds_cap
        out = np.zeros(self.num_sources)
        for i in self.active:
            sh, total = self._shadows[i], 0.0
            for s, e, sec in sh.segments:
                overlap = min(e, end) - max(s, start)
                if overlap > 0:
                    total += overlap * min(sec / (e - s), cap)
            out[i] = min(1.0, total / scale)
        return out

    # -- state --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain lists: the request's tokens, shadows, played rounds and the totals."""
        return {"class": "ShadowFeedback", "max_delay": self.max_delay, "max_nodes": self.max_nodes,
                "tokens": list(self._tokens), "ended": self._ended, "rounds": [list(r) for r in self._rounds],
                "active": list(self.active),
                "shadows": [[sh.cursor, sh.age, [list(s) for s in sh.segments],
                             None if sh.draft is None else [sh.draft.tokens, sh.draft.parents, sh.draft.draft_seconds]]
                            for sh in self._shadows],
                "tokens_decided": self.tokens_decided.tolist(), "seconds_decided": self.seconds_decided.tolist()}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`. Raises ValueError: wrong keys or another K."""
        check_state_keys(state, {"max_delay", "max_nodes", "tokens", "ended", "rounds", "shadows",
                                 "tokens_decided", "seconds_decided"}, "ShadowFeedback")
        if len(state["shadows"]) != self.num_sources:
            raise ValueError(f"state has {len(state['shadows'])} shadows, this feedback {self.num_sources}")
        self.max_delay = int(state["max_delay"])
        self._set_nodes(int(state["max_nodes"]))
        self._tokens, self._ended = [int(t) for t in state["tokens"]], bool(state["ended"])
        self._rounds = [[int(a), int(b), int(c)] for a, b, c in state["rounds"]]
        self.active = [int(i) for i in state.get("active", range(self.num_sources))]
        self._shadows = [_Shadow(int(cur), None if d is None else
                                 SourceDraft([int(t) for t in d[0]], [int(p) for p in d[1]], float(d[2])),
                                 int(age), [[int(s), int(e), float(sec)] for s, e, sec in segs])
                         for cur, age, segs, d in state["shadows"]]
        self.tokens_decided = np.array(state["tokens_decided"], dtype=np.float64)
        self.seconds_decided = np.array(state["seconds_decided"], dtype=np.float64)
