"""Hedge over draft sources: ``--draft hedge:suffix,ngram``.

`specloop.strategies.hedge_sources.HedgeOverSources` keeps exponential weights over the
sources' cumulative losses; its choice is verified (``mode="choose"``), or the sources'
trees are merged into one trie, heaviest source first (``mode="merge"``, tree plans
only; a chain plan falls back to "choose"). No extra target calls: every loss is decided
from the committed tokens. HedgeSpec (arXiv 2510.20064) selects drafters the same way.

Two kinds of feedback:

* ``feedback="shadow"`` (default; `strategies.hedge_shadow`): every source follows its own
  standalone run over the committed tokens, drafting from the context up to its cursor
  and observing only its own rounds (a greedy verifier's feedback of its proposal), so
  its state is what it would be alone. The played proposal is the chosen source's shadow
  draft at this offset, or the subtree of its pending one under the node the committed
  tokens matched. With ``per="request"`` (default) Hedge chooses once per request with
  AdaHedge over the sources' standalone seconds, and the request's rounds are exactly the
  chosen source's rounds alone; with probability ``explore`` a request runs every
  shadow and its seconds, over that probability, are the loss; otherwise only the chosen
  source drafts, and the others read the request's committed tokens at its end (one
  feedback with an empty proposal: the suffix tries still grow). ``per="round"``: a
  choice per round, every shadow always, losses per played round (delayed, at most the
  proposals' depth).
* ``feedback="round"``: every source proposes every round and is scored on the played
  round (`DelayedFeedback`: censored rounds wait for the next rounds, at most
  ``max_delay``; the Dinkelbach loss of the throughput or the mean per-round rate). The
  source whose proposal was verified gets the decoder's feedback; the others get the
  feedback a greedy verifier would have given *their* proposal, as far as the committed
  tokens decide it: their accepted path along the committed tokens (at most
  ``len(committed) - 1`` nodes, or all of them in a finished round), the nodes whose
  outcome is not yet known (the child that matches the last committed token, and its
  subtree) removed through `DraftProposal.subset` (which keeps each node's index in the
  source's own numbering), ``p_target`` / ``target_logits`` rows of the committed
  positions, ``child_acceptance_ratios`` empty. SuffixDrafter calibrates on exactly those
  nodes; NGramDrafter's length model sees the decided accepted length (a censored one as
  ``len(committed) - 1``). Kept for comparison: rounds start after the played source's
  rejection, which favours the others (`strategies.hedge_shadow` has the numbers).

Lossless: sources must be deterministic (``q_draft`` None, verified as point masses,
lossless for greedy and sampling) and the choice uses the drafter's own numpy
Generator, never the target's random numbers. A source that returns ``q_draft`` or
needs the target's hidden states (EAGLE-style heads keep a cache of their own drafted
nodes, which a round they did not propose would corrupt) is refused with ValueError.
Drafting seconds are measured on the wall clock (so the choice, and a sampled run's
tokens, vary with the machine's load), or fixed per source with ``draft_seconds`` or in
the name, ``hedge:suffix@160us,ngram@70us`` (``SOURCE@NUMBER`` with unit ``s``, ``ms`` or
``us``, none = seconds; every source or none).

In a stream (``specloop stream --method hedge-sources``, `HEDGE_SOURCES_DRAFTER`) the
drafter declares ``keeps_stream_state``: its `state_dict` (Hedge weights and generator,
the pending delayed-feedback rounds, every source's own state, e.g. the suffix tries) is
saved with the stream's state after each prompt. That method prices drafting with the
fixed per-source-kind constants `STREAM_DRAFT_SECONDS`, not the wall clock: a measured
term makes the Hedge choices, hence the records, depend on the machine's load, so a
killed and resumed run (or a rerun) would not reproduce the uninterrupted records; a
table measured once and stored in the state would fix resumes but not reruns or other
machines. The constants are this machine's measured means per proposal
(`benchmarks/suffix_cost.py`: suffix 163 us chain / 251 us tree; a loop over
``NGramDrafter.propose`` on 100-400-token contexts: 70 us); both are well under 1 % of a
SmolLM2 verify forward (about 60 ms), so a constant's error against the load of the
moment is far below what the loss resolves.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Sequence

import numpy as np
import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback
from specloop.realmodels.drafters.ngram import build_trie
from specloop.realmodels.padding import device_sync
from specloop.realmodels.drafters.options import ContextOptions, check_options, field_names, option_table
from specloop.strategies._state import make_rng, rng_state, set_rng_state
from specloop.strategies.hedge_shadow import ShadowFeedback, accepted_path, subtree_below
from specloop.strategies.hedge_sources import (DelayedFeedback, HedgeOverSources, RatioLoss, SourceDraft,
                                               ThroughputLoss, accepted_prefix)

__all__ = ["HedgeDrafter", "parse_hedge_name", "parse_hedge_sources", "make_hedge_drafter",
           "greedy_feedback", "STREAM_DRAFT_SECONDS", "HEDGE_SOURCES_DRAFTER", "HedgeOptions"]

PREFIX = "hedge:"
_MODES = ("choose", "merge")
_FEEDBACKS = ("shadow", "round")
_PERS = ("request", "round")
_LOSSES = {"ratio": RatioLoss, "rate": ThroughputLoss}
_COST = re.compile(r"^(?P<source>.+)@(?P<value>[0-9.]+(?:[eE][-+]?[0-9]+)?)(?P<unit>us|ms|s)?$")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}

#: Fixed seconds per proposal of the stream method's sources (module docstring: why fixed).
STREAM_DRAFT_SECONDS = {"suffix": 160e-6, "ngram": 70e-6}

#: The drafter of ``specloop stream --method hedge-sources``: Hedge over suffix + n-gram
#: (the learned-length n-gram is not a registered drafter, so it is not a source here).
HEDGE_SOURCES_DRAFTER = PREFIX + ",".join(f"{k}@{round(v * 1e6)}us" for k, v in STREAM_DRAFT_SECONDS.items())


def parse_hedge_sources(name: str) -> tuple[list[str], list[float] | None]:
    """``"hedge:suffix@160us,ngram@70us"`` -> (``["suffix", "ngram"]``, [1.6e-4, 7e-5]);
    without ``@`` costs the seconds are None (measured on the wall clock).

    Raises:
        ValueError: no ``hedge:`` prefix, an empty source, a nested ``hedge:``, costs
            for some sources only.
    """
    if not name.startswith(PREFIX):
        raise ValueError(f"not a hedge drafter name (expected 'hedge:SOURCE,SOURCE,...'): {name!r}")
    parts = [s.strip() for s in name[len(PREFIX):].split(",")]
    if not parts or any(not s for s in parts):
        raise ValueError(f"{name!r}: give the sources as 'hedge:SOURCE,SOURCE,...' (none empty)")
    if any(s.startswith(PREFIX) for s in parts):
        raise ValueError(f"{name!r}: a hedge source cannot itself be a hedge ensemble")
    found = [_COST.match(p) for p in parts]
    if any(found) and not all(found):
        raise ValueError(f"{name!r}: give a fixed cost (SOURCE@SECONDS[s|ms|us]) for every source or for none")
    if not all(found):
        return parts, None
    return [m["source"].strip() for m in found], [float(m["value"]) * _UNITS[m["unit"]] for m in found]


def parse_hedge_name(name: str) -> list[str]:
    """``"hedge:suffix,ngram"`` (or with ``@`` costs) -> ``["suffix", "ngram"]``.

    Raises:
        ValueError: as `parse_hedge_sources`.
    """
    return parse_hedge_sources(name)[0]


def greedy_feedback(proposal: DraftProposal, feedback: VerifyFeedback) -> VerifyFeedback:
    """The feedback a greedy verifier would have given ``proposal`` in ``feedback``'s
    round, restricted to the nodes the committed tokens decide (module docstring)."""
    committed = [int(t) for t in feedback.committed_tokens.reshape(-1).tolist()]
    tokens, parents = proposal.tokens.tolist(), proposal.parents.tolist()
    length, _ = accepted_prefix(tokens, parents, committed)
    cap = len(committed) if feedback.finished else len(committed) - 1
    accepted, node = [], -1
    for depth in range(min(length, cap)):
        node = next(i for i in range(len(tokens)) if parents[i] == node and tokens[i] == committed[depth])
        accepted.append(node)
    if length > cap:                                  # the next node matched: its outcome is unknown
        drop = next(i for i in range(len(tokens)) if parents[i] == node and tokens[i] == committed[cap])
        gone = {drop}
        for i in range(drop + 1, len(tokens)):
            if parents[i] in gone:
                gone.add(i)
        keep = [i for i in range(len(tokens)) if i not in gone]
        renumber = {old: new for new, old in enumerate(keep)}
        proposal, accepted = proposal.subset(keep), [renumber[i] for i in accepted]
    rows = len(accepted) + 1
    return VerifyFeedback(proposal, tuple(accepted), feedback.committed_tokens,
                          feedback.p_target[:rows], feedback.target_logits[:rows], None, (), feedback.finished)


class HedgeDrafter(BaseDrafter):
    """Exponential weights over deterministic draft sources (module docstring).

    Args:
        sources: the K >= 1 source drafters (not needing target hidden states).
        names: their names for reports (default the drafters' ``name``).
        verify_cost: seconds to verify 1..M tokens for the loss.
        feedback: "shadow" (default, `strategies.hedge_shadow.ShadowFeedback`): every
            source is scored on its own standalone run over the committed tokens, and
            the played proposals come from those runs; "round": every source is scored
            on the played rounds (`strategies.hedge_sources.DelayedFeedback`), which
            favours the sources not played (see `strategies.hedge_shadow`).
        per: what Hedge chooses for. "request" (default with shadow feedback): one source
            per request, drawn from AdaHedge's weights (`HedgeOverSources` with
            ``learning_rate="adahedge"``) over the sources' summed shadow seconds, so the
            played run of a request is the chosen source's standalone run and every
            request's losses are known before the next choice (no delay). "round"
            (the only choice with round feedback): a source per round, anytime rate,
            delayed losses normalised into [0, 1].
        explore: per="request", mode "choose": the probability that a request runs every
            source's shadow (its losses, divided by this probability, update Hedge: an
            unbiased estimate, label-efficient prediction, Cesa-Bianchi, Lugosi & Stoltz
            2005); otherwise only the chosen source drafts and the others only read the
            committed tokens at the end. 1 = every request (full information). "merge"
            needs every source: always 1.
        loss: round feedback only: "ratio" (default, `RatioLoss`: the Dinkelbach loss
            of the stream's throughput, sum of tokens / sum of seconds) or "rate"
            (`ThroughputLoss`: the mean per-round rate). Shadow feedback has its own
            loss (seconds per committed token) and takes None.
        mode: "choose" (verify the chosen source's proposal) or "merge".
        choose: "sample" (draw from the weights with the own Generator; Hedge's
            regret bound applies) or "argmax".
        horizon: T for the fixed learning rate, None = anytime.
        draft_seconds: None = measured wall clock, or K fixed seconds per proposal.
        max_delay: the most rounds a round's losses may wait (>= 1).
        max_nodes: the loss's normalisation cap in nodes (None = the table).
        seed: seed of the choice generator.
        sync: None, or a callable that waits for the target's device; called before
            and after each measured proposal (`padding.device_sync`), so a source's seconds are
            its own work, not kernels still queued.

    Raises:
        ValueError: no sources, a source needing hidden states, bad names / options;
            at propose time a source returning ``q_draft``, or (shadow feedback) a
            context that did not follow the committed tokens reported to ``observe``.
    """

    name = "hedge"
    #: the stream runner saves this drafter's ``state_dict`` with the stream's state
    keeps_stream_state = True

    def __init__(self, sources: Sequence, names: Sequence[str] | None = None, *,
                 verify_cost: Sequence[float], mode: str = "choose", choose: str = "sample",
                 feedback: str = "shadow", per: str | None = None, explore: float = 0.25,
                 loss: str | None = None, horizon: int | None = None,
                 draft_seconds: Sequence[float] | None = None, max_delay: int = 64,
                 max_nodes: int | None = None, seed: int | None = 0, sync=None):
        self.sources = list(sources)
        self._sync = sync
        if not self.sources:
            raise ValueError("a hedge drafter needs at least one source")
        self.names = [getattr(s, "name", type(s).__name__) for s in self.sources] if names is None else list(names)
        if len(self.names) != len(self.sources):
            raise ValueError(f"{len(self.names)} names for {len(self.sources)} sources")
        for name, src in zip(self.names, self.sources):
            if tuple(getattr(src, "needs_target_hidden", ())):
                raise ValueError(f"hedge source {name!r} needs the target's hidden states (a head with "
                                 "its own draft cache); only context / suffix sources can be mixed")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if draft_seconds is not None and (len(draft_seconds) != len(self.sources)
                                          or any(not float(s) >= 0 for s in draft_seconds)):
            raise ValueError(f"draft_seconds must give {len(self.sources)} seconds >= 0")
        if feedback not in _FEEDBACKS:
            raise ValueError(f"feedback must be one of {_FEEDBACKS}, got {feedback!r}")
        if feedback == "shadow" and loss not in (None, "time"):
            raise ValueError(f"shadow feedback scores seconds per committed token; loss={loss!r} is for "
                             "feedback='round'")
        loss = ("time" if feedback == "shadow" else "ratio") if loss is None else loss
        if feedback == "round" and loss not in _LOSSES:
            raise ValueError(f"loss must be one of {tuple(_LOSSES)}, got {loss!r}")
        per = ("request" if feedback == "shadow" else "round") if per is None else per
        if per not in _PERS or (per == "request" and feedback != "shadow"):
            raise ValueError(f"per must be one of {_PERS} ('request' with shadow feedback only), got {per!r}")
        if not 0.0 < float(explore) <= 1.0:
            raise ValueError(f"explore must be a probability in (0, 1], got {explore!r}")
        self.mode, self.loss, self.feedback, self.per = mode, loss, feedback, per
        self.explore = 1.0 if mode == "merge" or per == "round" else float(explore)
        self.draft_seconds = None if draft_seconds is None else [float(s) for s in draft_seconds]
        self.hedge = HedgeOverSources(len(self.sources), None if per == "request" else horizon, choose, seed,
                                      learning_rate="adahedge" if per == "request" else "anytime")
        self._explore_rng = make_rng(None if seed is None else seed + 1)
        self._request: tuple[int, int, bool] | None = None       # per request: round id, chosen, explored
        self._seconds0 = None
        self._last_row: tuple | None = None            # a (1, V) p_target / logits row for catch-up feedback
        self._ids: torch.Tensor | None = None          # the open request's context (`_context`)
        self.requests = self.explored_requests = 0
        if feedback == "round":
            self.delayed, self.shadow = DelayedFeedback(_LOSSES[loss](verify_cost, max_nodes), max_delay), None
        else:
            table = ThroughputLoss(verify_cost)
            self.delayed = None
            self.shadow = ShadowFeedback(len(self.sources), table.verify_seconds, max_nodes,
                                         default_nodes=table.cost.size - 1, max_delay=max_delay)
        self.name = PREFIX + ",".join(self.names)
        self.chosen_counts = [0] * len(self.sources)
        self._round: tuple[list[DraftProposal], int | None] | None = None   # proposals, verified source
        self._prompt: list[int] | None = None          # shadow feedback: the open request's prompt
        self._props: list[DraftProposal | None] = [None] * len(self.sources)   # pending shadow proposals
        self._rows: dict[int, tuple] = {}              # offset -> (p_target row, logits row)
        self._template: tuple[DraftRequest, int] | None = None                 # last request, its offset

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        if self.shadow is not None:
            self._finish_request()
        else:
            self._apply(self.delayed.end_request())
        self._round = None
        for src in self.sources:
            src.reset(prompt_ids)
        self._prompt = [int(t) for t in torch.as_tensor(prompt_ids).reshape(-1).tolist()]
        if self.shadow is not None:
            self._start_request()

    def _start_request(self) -> None:
        """Shadow feedback: the request's shadows (per request: Hedge's choice, explored?)."""
        if self.per == "round":
            self.shadow.start_request()
            return
        round_id, chosen = self.hedge.play()
        explored = self.explore >= 1.0 or bool(self._explore_rng.random() < self.explore)
        self._request = (round_id, chosen, explored)
        self.requests += 1
        self.explored_requests += explored
        self.shadow.start_request(None if explored else [chosen])
        self._seconds0 = self.shadow.seconds_decided.copy()

    def _apply(self, decided) -> None:
        for round_id, losses in decided:
            self.hedge.update(round_id, losses)

    def _timed(self, i: int, request: DraftRequest) -> tuple[DraftProposal, SourceDraft]:
        if self._sync is not None and self.draft_seconds is None:
            self._sync()                               # time this source's work, not queued work
        start = time.perf_counter()
        prop = self.sources[i].propose(request)
        if self._sync is not None and self.draft_seconds is None:
            self._sync()
        seconds = time.perf_counter() - start if self.draft_seconds is None else self.draft_seconds[i]
        if prop.q_draft is not None:
            raise ValueError(f"hedge source {self.names[i]!r} returned a sampled draft (q_draft); only "
                             "deterministic sources (q_draft None) can be mixed losslessly")
        return prop, SourceDraft(prop.tokens.tolist(), prop.parents.tolist(), seconds)

    def propose(self, request: DraftRequest) -> DraftProposal:
        """Returns the chosen source's proposal (or the merge). Round feedback: every
        source proposes; shadow feedback: the shadows that reached this offset propose."""
        if self.shadow is not None:
            proposals = self._shadow_proposals(request)
            if self.per == "request":
                chosen = self._request[1]
            else:
                round_id, chosen = self.hedge.play()
                self.shadow.add_round(round_id)
        else:
            proposals, drafts = [], []
            for i in range(len(self.sources)):
                prop, draft = self._timed(i, request)
                proposals.append(prop)
                drafts.append(draft)
            round_id, chosen = self.hedge.play()
            self.delayed.add(round_id, drafts)
        self.chosen_counts[chosen] += 1
        if self.mode == "merge" and request.plan.tree is not None:
            self._round = (proposals, None)
            return self._merge(proposals, request)
        self._round = (proposals, chosen)
        return proposals[chosen]

    # -- shadow feedback --------------------------------------------------------------
    def _shadow_proposals(self, request: DraftRequest) -> list[DraftProposal]:
        """Bring every shadow to this offset, then each source's proposal here."""
        if self._prompt is None:                       # driven without reset: the context is the prompt
            self._prompt = [int(t) for t in request.ids.reshape(-1).tolist()]
            self._start_request()
        offset = int(request.ids.shape[0]) - len(self._prompt)
        if offset != self.shadow.known:
            raise ValueError(f"hedge drafter: the context is {offset} tokens past the prompt, but "
                             f"{self.shadow.known} were committed through observe (call reset per request)")
        self._template = (request, offset)
        self._draft_shadows()
        return [self._live(i, request) if i in self.shadow.active else DraftProposal.empty(device=request.ids.device)
                for i in range(len(self.sources))]

    def _draft_shadows(self, behind_only: bool = False) -> None:
        """Every shadow that wants a draft proposes at its cursor (from the context up to
        it) until none does (``behind_only``: none behind the committed tokens); decided
        rounds go to their sources at once."""
        request, offset = self._template if self._template is not None else (None, 0)
        while wanted := [i for i in self.shadow.wants() if not behind_only or self.shadow.cursor(i) < self.shadow.known]:
            for i in wanted:
                cursor = self.shadow.cursor(i)
                last = self.shadow.ended and self.shadow.known - cursor <= 1
                if request is None or last:   # no round asked for a draft (e.g. one token), or the
                    self._props[i] = DraftProposal.empty()   # request's last token: alone, the
                    self._feed(self.shadow.offer(i, SourceDraft([], [], 0.0)))   # decoder asks nothing
                    continue
                ids = self._context(request.ids.device)[:len(self._prompt) + cursor]
                sub = dataclasses.replace(request, ids=ids, policy=None,
                                          max_tokens=max(0, request.max_tokens + offset - cursor))
                prop, draft = self._timed(i, sub)
                self._props[i] = prop
                self._feed(self.shadow.offer(i, draft))

    def _context(self, device) -> torch.Tensor:
        """int64 (prompt + committed,) of the open request, rebuilt only when it grew."""
        size = len(self._prompt) + self.shadow.known
        if self._ids is None or int(self._ids.shape[0]) != size:
            self._ids = torch.tensor(self._prompt + self.shadow.tokens(self.shadow.known), dtype=torch.long,
                                     device=device)
        return self._ids

    def _live(self, i: int, request: DraftRequest) -> DraftProposal:
        """Source i's proposal at this offset: its fresh shadow draft, or the subtree of
        its pending one under the node matched by the tokens committed since."""
        prop, cursor = self._props[i], self.shadow.cursor(i)
        if cursor == self.shadow.known:
            return prop
        toks, pars = prop.tokens.tolist(), prop.parents.tolist()
        path = accepted_path(toks, pars, self.shadow.tokens(self.shadow.known)[cursor:])
        keep = subtree_below(pars, path[-1], request.max_tokens)
        if not keep:
            return DraftProposal.empty(device=request.ids.device)
        where = {old: new for new, old in enumerate(keep)}
        at = torch.tensor(keep, dtype=torch.long)
        source = tuple(prop.draft_node(j) for j in keep)
        return DraftProposal(prop.tokens[at.to(prop.tokens.device)],
                             torch.tensor([where.get(pars[j], -1) for j in keep], dtype=torch.long,
                                          device=prop.parents.device),
                             None, None if prop.node_probs is None else prop.node_probs[at], source)

    def _feed(self, decisions) -> None:
        """Each decided shadow round to its source, as a greedy verifier's feedback."""
        for d in decisions:
            prop = self._props[d.source]
            if prop is None:                           # restored mid-request from a saved state
                prop = DraftProposal(torch.tensor(d.draft.tokens, dtype=torch.long),
                                     torch.tensor(d.draft.parents, dtype=torch.long))
            self._props[d.source] = None
            p_target, logits = self._target_rows(d.start, d.start + len(d.accepted) + 1)
            self.sources[d.source].observe(VerifyFeedback(prop, tuple(d.accepted), torch.tensor(d.committed),
                                                          p_target, logits, None, (), d.finished))

    def _target_rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's (p_target, logits) rows of offsets [start, end): a view of one played
        round's feedback when they all come from it (the common case), else stacked."""
        rows = [self._rows[j] for j in range(start, end) if j in self._rows]
        if not rows:
            return torch.zeros(0), torch.zeros(0)
        first = rows[0]
        if all(r[0] is first[0] and r[2] == first[2] + n for n, r in enumerate(rows)):
            return first[0][first[2]:first[2] + len(rows)], first[1][first[2]:first[2] + len(rows)]
        return (torch.stack([r[0][r[2]] for r in rows]), torch.stack([r[1][r[2]] for r in rows]))

    def _finish_request(self) -> None:
        """End the open request: every shadow to its end, then the played rounds' losses."""
        if self._prompt is None:
            return
        self._feed(self.shadow.end_request())
        self._draft_shadows()
        tokens, active = self.shadow.tokens(self.shadow.known), list(self.shadow.active)
        self._apply(self.shadow.close_request())
        if self.per == "request":
            self._close_request(tokens, active)
        self._prompt, self._template, self._rows, self._ids = None, None, {}, None
        self._props = [None] * len(self.sources)

    def _close_request(self, tokens: list[int], active: list[int]) -> None:
        """Per request: the sources that did not draft read the request's tokens; Hedge
        learns the explored request's seconds (over the exploring probability)."""
        if tokens and self._last_row is not None:
            row = self._last_row
            for i, src in enumerate(self.sources):
                if i not in active:
                    src.observe(VerifyFeedback(DraftProposal.empty(), (), torch.tensor(tokens), row[0], row[1],
                                               None, (), True))
        round_id, _, explored = self._request
        seconds = self.shadow.seconds_decided - self._seconds0
        self.hedge.update(round_id, seconds / self.explore if explored else np.zeros(len(self.sources)))
        self._request = None

    # -- both --------------------------------------------------------------------------
    def _merge(self, proposals: list[DraftProposal], request: DraftRequest) -> DraftProposal:
        """One trie of every source's root-to-node paths, heaviest source first."""
        weights = self.hedge.weights(self.hedge.t)          # p_t of this round (played already)
        order = sorted(range(len(proposals)), key=lambda i: -weights[i])
        paths = []
        for i in order:
            toks, pars = proposals[i].tokens.tolist(), proposals[i].parents.tolist()
            children = {p for p in pars}
            for node in range(len(toks)):
                if node in children:
                    continue                         # a leaf gives its whole path
                path, cur = [], node
                while cur >= 0:
                    path.append(toks[cur])
                    cur = pars[cur]
                paths.append(path[::-1])
        tree = request.plan.tree
        cap = min(request.max_tokens, tree.verify_size or sum(p.size for p in proposals))
        tokens, parents = build_trie(paths, cap)
        if not tokens:
            return DraftProposal.empty(device=request.ids.device)
        return DraftProposal(torch.tensor(tokens, dtype=torch.long, device=request.ids.device),
                             torch.tensor(parents, dtype=torch.long, device=request.ids.device))

    def observe(self, feedback: VerifyFeedback) -> None:
        """Decide the losses the committed tokens reveal; the sources observe (round
        feedback: every played round; shadow feedback: their own decided rounds)."""
        committed = feedback.committed_tokens.reshape(-1).tolist()
        if self.shadow is not None:
            self._round = None
            base = self.shadow.known
            self._last_row = (feedback.p_target[:1], feedback.target_logits[:1])
            for j in range(min(len(committed), int(feedback.p_target.shape[0]))):
                self._rows[base + j] = (feedback.p_target, feedback.target_logits, j)
            self._feed(self.shadow.commit(committed))
            if feedback.finished:
                self._finish_request()
                return None
            self._draft_shadows(behind_only=True)          # resolve what the new tokens decide now
            if self.per == "round":
                self._apply(self.shadow.resolved())
            low = min(self.shadow.cursor(i) for i in self.shadow.active)
            self._rows = {j: r for j, r in self._rows.items() if j >= low}
            return None
        self._apply(self.delayed.commit(committed))
        proposals, verified = self._round if self._round is not None else ([], None)
        self._round = None
        for i, src in enumerate(self.sources):      # the verified source: the decoder's own feedback
            mine = proposals[i] if proposals else DraftProposal.empty()
            src.observe(feedback if i == verified else greedy_feedback(mine, feedback))
        if feedback.finished:
            self._apply(self.delayed.end_request())
        return None

    @property
    def pending_rounds(self) -> int:
        return self.delayed.pending if self.shadow is None else len(self.shadow._rounds)

    def report(self) -> dict:
        """Per-stream report: weights, cumulative losses, choices, regret
        (`HedgeOverSources.regret`); ``source_tokens_per_s``: each source's standalone
        throughput (shadow: drafting + verify seconds of its own run; round, ratio loss:
        on the played rounds). Per request the losses are seconds (explored requests'
        shadow seconds over ``explore``), so ``regret`` and its ``bound`` (2 Delta) are
        in seconds; per round they are in the normalised [0, 1] units."""
        if self.shadow is not None:
            rates = self.shadow.rates.tolist()
        else:
            scorer = self.delayed.loss
            rates = scorer.rates.tolist() if isinstance(scorer, RatioLoss) else None
        return {"sources": list(self.names), "feedback": self.feedback, "per": self.per, "explore": self.explore,
                "requests": self.requests, "explored_requests": self.explored_requests,
                "loss": self.loss, "source_tokens_per_s": rates, "weights": self.hedge.weights().tolist(),
                "cumulative_loss": self.hedge.cumulative_loss.tolist(),
                "chosen_counts": list(self.chosen_counts), "pending_rounds": self.pending_rounds,
                "regret": self.hedge.regret()}

    def state_dict(self) -> dict:
        """The Hedge state, the pending feedback (rounds or shadows, with the open
        request's prompt), the fixed drafting seconds (None = wall clock) and each
        source's ``state_dict`` (None where it has none)."""
        return {"kind": "hedge", "sources": list(self.names), "feedback": self.feedback, "loss": self.loss,
                "hedge": self.hedge.state_dict(),
                "delayed": None if self.delayed is None else self.delayed.state_dict(),
                "shadow": None if self.shadow is None else self.shadow.state_dict(), "prompt": self._prompt,
                "draft_seconds": self.draft_seconds, "chosen_counts": list(self.chosen_counts),
                "per": self.per, "explore": self.explore, "explore_rng": rng_state(self._explore_rng),
                "request": None if self._request is None else list(self._request),
                "seconds0": None if self._seconds0 is None else self._seconds0.tolist(),
                "requests": [self.requests, self.explored_requests],
                "source_states": [s.state_dict() if hasattr(s, "state_dict") else None for s in self.sources]}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`. A state without the pending rounds (``delayed``, older
        files) drops them, as before; one without ``feedback`` was round feedback.

        Raises:
            ValueError: not a hedge state, other sources, another feedback or loss, other
                fixed drafting seconds."""
        if not isinstance(state, dict) or state.get("kind") != "hedge":
            raise ValueError("not a HedgeDrafter state (expected {'kind': 'hedge', ...})")
        if list(state["sources"]) != self.names:
            raise ValueError(f"saved hedge state has sources {state['sources']}, this drafter {self.names}")
        if state.get("feedback", "round") != self.feedback:
            raise ValueError(f"saved hedge state has {state.get('feedback', 'round')!r} feedback, this drafter "
                             f"{self.feedback!r}")
        if state.get("loss", "rate") != self.loss:
            raise ValueError(f"saved hedge state scores sources with the {state.get('loss', 'rate')!r} loss, "
                             f"this drafter with {self.loss!r}")
        if "draft_seconds" in state and state["draft_seconds"] != self.draft_seconds:
            raise ValueError(f"saved hedge state prices drafting at {state['draft_seconds']} s per proposal, "
                             f"this drafter at {self.draft_seconds}")
        self.hedge.load_state_dict(state["hedge"])
        if (state.get("per", "round"), float(state.get("explore", 1.0))) != (self.per, self.explore):
            raise ValueError(f"saved hedge state chooses per {state.get('per', 'round')!r} exploring "
                             f"{state.get('explore', 1.0)}, this drafter per {self.per!r} exploring {self.explore}")
        if self.shadow is not None:
            self.shadow.load_state_dict(state["shadow"])
            self._prompt = None if state.get("prompt") is None else [int(t) for t in state["prompt"]]
            self._props, self._rows, self._template = [None] * len(self.sources), {}, None
            set_rng_state(self._explore_rng, state["explore_rng"])
            req = state.get("request")
            self._request = None if req is None else (int(req[0]), int(req[1]), bool(req[2]))
            self._seconds0 = None if state.get("seconds0") is None else np.array(state["seconds0"], dtype=np.float64)
            self.requests, self.explored_requests = (int(x) for x in state["requests"])
        elif state.get("delayed") is not None:
            self.delayed.load_state_dict(state["delayed"])
        else:
            self.hedge._played.clear()
            self.delayed.end_request()
        self.chosen_counts = list(state["chosen_counts"])
        for src, sub in zip(self.sources, state["source_states"]):
            if sub is not None and hasattr(src, "load_state_dict"):
                src.load_state_dict(sub)


@dataclasses.dataclass(frozen=True)
class HedgeOptions(ContextOptions):
    """The Hedge's own options of ``--draft hedge:SOURCE,...`` (`make_hedge_drafter`;
    the registry also accepts every option of the sources, and passes each source the
    ones it declares). ``hedge_X`` is `HedgeDrafter`'s argument ``X``, with its default.

    Attributes:
        dtype (str | torch.dtype | None, "float32"): the shipped verify-cost column on
            the CPU (also passed to the sources).
        verify_cost (sequence of float | str | None, None): the verification table;
            None (or a string) = `suffix.verify_cost_for` the target; None also gives
            the sources that table.
        hedge_mode (str, "choose"), hedge_choose (str, "sample"), hedge_feedback
        (str, "shadow"), hedge_per (str | None, None), hedge_explore (float, 0.25),
        hedge_loss (str | None, None), hedge_horizon (int | None, None),
        hedge_draft_seconds (sequence of float | None, None: the wall clock, or the
        name's ``@`` costs), hedge_max_delay (int, 64), hedge_max_nodes (int | None,
        None), hedge_seed (int | None, 0).
    """
    kind = "hedge"

    dtype: str | torch.dtype | None = "float32"
    verify_cost: Sequence[float] | str | None = None
    hedge_mode: str = "choose"
    hedge_choose: str = "sample"
    hedge_feedback: str = "shadow"
    hedge_per: str | None = None
    hedge_explore: float = 0.25
    hedge_loss: str | None = None
    hedge_horizon: int | None = None
    hedge_draft_seconds: Sequence[float] | None = None
    hedge_max_delay: int = 64
    hedge_max_nodes: int | None = None
    hedge_seed: int | None = 0


#: The prefix of the Hedge's own options (every other option is a source's).
OPTION_PREFIX = "hedge_"


def make_hedge_drafter(target, name: str, build, **options) -> HedgeDrafter:
    """Registry factory for ``hedge:SOURCE,...``.

    Args:
        target: the target's `LoadedModel` (or None: the shipped CPU table).
        name: ``hedge:SOURCE,...`` (`parse_hedge_sources`).
        build: ``build(source_name, target, **options) -> Drafter``; it gets every
            option but the ``hedge_*`` ones (the registry passes a builder that gives
            each source only the options it declares).
        **options: the fields of `HedgeOptions` and the sources' options. Without
            ``verify_cost`` the sources get the table the Hedge prices verification
            with; the sources' drafting seconds are timed with the target's device
            synchronised before and after (unless fixed).

    Raises:
        ValueError: an unknown ``hedge_*`` option or a wrong type (`HedgeOptions`),
            a bad name (`parse_hedge_sources`), fixed seconds both in the name and in
            ``hedge_draft_seconds``, bad Hedge settings (`HedgeDrafter`); the sources'
            errors from ``build``.
    """
    from specloop.realmodels.drafters.suffix import verify_cost_for
    names, fixed = parse_hedge_sources(name)
    own_names = set(field_names(HedgeOptions))
    table = option_table(HedgeOptions)
    check_options(name, {k: v for k, v in options.items() if k.startswith(OPTION_PREFIX) or k in own_names},
                  [table])
    opts = HedgeOptions.from_options({k: v for k, v in options.items() if k in own_names}, drafter=name)
    source_options = {k: v for k, v in options.items() if not k.startswith(OPTION_PREFIX)}
    cost = opts.verify_cost
    if cost is None or isinstance(cost, str):
        computed = verify_cost_for(target, str(opts.dtype))
        if cost is None:                                # the sources prune by the same table
            source_options["verify_cost"] = computed
        cost = computed
    sources = [build(n, target, **source_options) for n in names]
    kwargs = {key[len(OPTION_PREFIX):]: getattr(opts, key) for key in own_names if key.startswith(OPTION_PREFIX)}
    if fixed is not None:
        if kwargs["draft_seconds"] is not None:
            raise ValueError(f"{name!r} fixes the drafting seconds in the name; do not also pass hedge_draft_seconds")
        kwargs["draft_seconds"] = fixed
    return HedgeDrafter(sources, names, verify_cost=cost, sync=device_sync(target), **kwargs)
