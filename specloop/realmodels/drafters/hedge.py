"""Hedge over draft sources: ``--draft hedge:suffix,ngram`` (issue 21, section 2).

Every round every source proposes (timed); `specloop.strategies.hedge_sources.
HedgeOverSources` picks one by exponential weights over the sources' cumulative
tokens-per-second losses and its proposal is verified (``mode="choose"``), or the
sources' trees are merged into one trie, heaviest source first (``mode="merge"``, tree
plans only; a chain plan falls back to "choose"). Each source's loss is decided from
the committed tokens (`DelayedFeedback`: no extra target calls, censored rounds wait
for the next rounds, at most ``max_delay`` rounds); see `strategies.hedge_sources` for
the loss, its normalisation, the learning rate and the regret bound. HedgeSpec
(arXiv 2510.20064) selects drafters the same way.

Every source observes every round, so its own state (the suffix trie, an n-gram
length model) follows the committed sequence. The source whose proposal was verified
gets the decoder's feedback; the others get the feedback a greedy verifier would have
given *their* proposal, as far as the committed tokens decide it: their accepted path
along the committed tokens (at most ``len(committed) - 1`` nodes, or all of them in a
finished round), the nodes whose outcome is not yet known (the child that matches the
last committed token, and its subtree) removed through `DraftProposal.subset` (which
keeps each node's index in the source's own numbering), ``p_target`` / ``target_logits``
rows of the committed positions, ``child_acceptance_ratios`` empty. SuffixDrafter
calibrates on exactly those nodes; NGramDrafter's length model sees the decided
accepted length (a censored one as ``len(committed) - 1``).

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

import re
import time
from typing import Sequence

import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback
from specloop.realmodels.drafters.ngram import build_trie
from specloop.strategies.hedge_sources import (DelayedFeedback, HedgeOverSources, RatioLoss, SourceDraft,
                                               ThroughputLoss, accepted_prefix)

__all__ = ["HedgeDrafter", "parse_hedge_name", "parse_hedge_sources", "make_hedge_drafter",
           "greedy_feedback", "STREAM_DRAFT_SECONDS", "HEDGE_SOURCES_DRAFTER"]

PREFIX = "hedge:"
_MODES = ("choose", "merge")
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
        loss: "ratio" (default, `RatioLoss`: the Dinkelbach loss of the stream's
            throughput, sum of tokens / sum of seconds) or "rate" (`ThroughputLoss`: the
            mean per-round rate, which a source verifying more nodes per round can tie
            while its throughput is higher; see `strategies.hedge_sources`).
        mode: "choose" (verify the chosen source's proposal) or "merge".
        choose: "sample" (draw from the weights with the own Generator; Hedge's
            regret bound applies) or "argmax".
        horizon: T for the fixed learning rate, None = anytime.
        draft_seconds: None = measured wall clock, or K fixed seconds per proposal.
        max_delay: the most rounds a round's losses may wait (>= 1).
        max_nodes: the loss's normalisation cap in nodes (None = the table).
        seed: seed of the choice generator.

    Raises:
        ValueError: no sources, a source needing hidden states, bad names / options;
            at propose time a source returning ``q_draft``.
    """

    name = "hedge"
    #: the stream runner saves this drafter's ``state_dict`` with the stream's state
    keeps_stream_state = True

    def __init__(self, sources: Sequence, names: Sequence[str] | None = None, *,
                 verify_cost: Sequence[float], mode: str = "choose", choose: str = "sample", loss: str = "ratio",
                 horizon: int | None = None, draft_seconds: Sequence[float] | None = None,
                 max_delay: int = 64, max_nodes: int | None = None, seed: int | None = 0):
        self.sources = list(sources)
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
        if loss not in _LOSSES:
            raise ValueError(f"loss must be one of {tuple(_LOSSES)}, got {loss!r}")
        self.mode, self.loss = mode, loss
        self.draft_seconds = None if draft_seconds is None else [float(s) for s in draft_seconds]
        self.hedge = HedgeOverSources(len(self.sources), horizon, choose, seed)
        self.delayed = DelayedFeedback(_LOSSES[loss](verify_cost, max_nodes), max_delay)
        self.name = PREFIX + ",".join(self.names)
        self.chosen_counts = [0] * len(self.sources)
        self._round: tuple[list[DraftProposal], int | None] | None = None   # proposals, verified source

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        self._apply(self.delayed.end_request())
        self._round = None
        for src in self.sources:
            src.reset(prompt_ids)

    def _apply(self, decided) -> None:
        for round_id, losses in decided:
            self.hedge.update(round_id, losses)

    def propose(self, request: DraftRequest) -> DraftProposal:
        """Every source proposes; returns the chosen one's proposal (or the merge)."""
        proposals, drafts = [], []
        for i, (name, src) in enumerate(zip(self.names, self.sources)):
            start = time.perf_counter()
            prop = src.propose(request)
            seconds = time.perf_counter() - start if self.draft_seconds is None else self.draft_seconds[i]
            if prop.q_draft is not None:
                raise ValueError(f"hedge source {name!r} returned a sampled draft (q_draft); only "
                                 "deterministic sources (q_draft None) can be mixed losslessly")
            proposals.append(prop)
            drafts.append(SourceDraft(prop.tokens.tolist(), prop.parents.tolist(), seconds))
        round_id, chosen = self.hedge.play()
        self.delayed.add(round_id, drafts)
        self.chosen_counts[chosen] += 1
        if self.mode == "merge" and request.plan.tree is not None:
            self._round = (proposals, None)
            return self._merge(proposals, request)
        self._round = (proposals, chosen)
        return proposals[chosen]

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
        """Decide the losses the committed tokens reveal; every source observes."""
        self._apply(self.delayed.commit(feedback.committed_tokens.reshape(-1).tolist()))
        proposals, verified = self._round if self._round is not None else ([], None)
        self._round = None
        for i, src in enumerate(self.sources):      # the verified source: the decoder's own feedback
            mine = proposals[i] if proposals else DraftProposal.empty()
            src.observe(feedback if i == verified else greedy_feedback(mine, feedback))
        if feedback.finished:
            self._apply(self.delayed.end_request())
        return None

    def report(self) -> dict:
        """Per-stream report: weights, cumulative losses, choices, regret (`HedgeOverSources.regret`)."""
        scorer = self.delayed.loss
        rates = scorer.rates.tolist() if isinstance(scorer, RatioLoss) else None
        return {"sources": list(self.names), "loss": self.loss, "source_tokens_per_s": rates,
                "weights": self.hedge.weights().tolist(),
                "cumulative_loss": self.hedge.cumulative_loss.tolist(),
                "chosen_counts": list(self.chosen_counts), "pending_rounds": self.delayed.pending,
                "regret": self.hedge.regret()}

    def state_dict(self) -> dict:
        """The Hedge state, the pending delayed-feedback rounds, the fixed drafting seconds
        (None = wall clock) and each source's ``state_dict`` (None where it has none)."""
        return {"kind": "hedge", "sources": list(self.names), "loss": self.loss, "hedge": self.hedge.state_dict(),
                "delayed": self.delayed.state_dict(), "draft_seconds": self.draft_seconds,
                "chosen_counts": list(self.chosen_counts),
                "source_states": [s.state_dict() if hasattr(s, "state_dict") else None for s in self.sources]}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`. A state without the pending rounds (``delayed``, older
        files) drops them, as before.

        Raises:
            ValueError: not a hedge state, other sources or other fixed drafting seconds."""
        if not isinstance(state, dict) or state.get("kind") != "hedge":
            raise ValueError("not a HedgeDrafter state (expected {'kind': 'hedge', ...})")
        if list(state["sources"]) != self.names:
            raise ValueError(f"saved hedge state has sources {state['sources']}, this drafter {self.names}")
        if state.get("loss", "rate") != self.loss:
            raise ValueError(f"saved hedge state scores sources with the {state.get('loss', 'rate')!r} loss, "
                             f"this drafter with {self.loss!r}")
        if "draft_seconds" in state and state["draft_seconds"] != self.draft_seconds:
            raise ValueError(f"saved hedge state prices drafting at {state['draft_seconds']} s per proposal, "
                             f"this drafter at {self.draft_seconds}")
        self.hedge.load_state_dict(state["hedge"])
        if state.get("delayed") is not None:
            self.delayed.load_state_dict(state["delayed"])
        else:
            self.hedge._played.clear()
            self.delayed.end_request()
        self.chosen_counts = list(state["chosen_counts"])
        for src, sub in zip(self.sources, state["source_states"]):
            if sub is not None and hasattr(src, "load_state_dict"):
                src.load_state_dict(sub)


_OPTIONS = {"hedge_mode": "mode", "hedge_choose": "choose", "hedge_loss": "loss", "hedge_horizon": "horizon",
            "hedge_draft_seconds": "draft_seconds", "hedge_max_delay": "max_delay",
            "hedge_max_nodes": "max_nodes", "hedge_seed": "seed"}


def make_hedge_drafter(target, name: str, build, **options) -> HedgeDrafter:
    """Registry factory for ``hedge:SOURCE,...``: each source is built by
    ``build(source_name, target, **options)`` (the registry passes its `make_drafter`)
    with the same ``options``; the Hedge's own options are
    ``hedge_mode``, ``hedge_choose``, ``hedge_loss``, ``hedge_horizon``, ``hedge_draft_seconds``,
    ``hedge_max_delay``, ``hedge_max_nodes``, ``hedge_seed``; ``verify_cost`` (a table) or ``dtype`` (the
    shipped SmolLM2 / CPU table) prices verification."""
    from specloop.realmodels.drafters.suffix import shipped_verify_cost
    names, fixed = parse_hedge_sources(name)
    sources = [build(n, target, **options) for n in names]
    cost = options.get("verify_cost")
    if cost is None or isinstance(cost, str):
        cost = shipped_verify_cost(str(options.get("dtype") or "float32"))
    kwargs = {key: options[opt] for opt, key in _OPTIONS.items() if options.get(opt) is not None}
    if fixed is not None:
        if kwargs.get("draft_seconds") is not None:
            raise ValueError(f"{name!r} fixes the drafting seconds in the name; do not also pass hedge_draft_seconds")
        kwargs["draft_seconds"] = fixed
    return HedgeDrafter(sources, names, verify_cost=cost, **kwargs)
