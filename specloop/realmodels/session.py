"""One prompt of real speculative decoding as an engine of the one round loop.

A `DecodeSession` holds the target's KV cache, the drafter and the committed sequence of
one prompt; `SpeculativeDecoder.generate` is a loop of `drive_round` over it, and the LTD
recorder and the real LTD environment step the same session. One round (state: the
target's cache holds ``seq[:-1]``; ``seq[-1]`` is the pending token)::

    start_round(plan)      -> depth cap (max_new_tokens, context window)
    draft(hooks)           proposal = drafter.propose(DraftRequest(.., policy=hooks))
                           (drafters that draft step by step ask the hooks themselves;
                           for the others the session reveals the proposal to the hooks
                           step by step and keeps what they choose)
    verify(hooks)          logits = target([pending] + nodes, tree mask, positions)
                           outcome = verify_tree / verify_greedy
                           cache <- prefix + pending + accepted nodes
                           observation = drafter.observe(VerifyFeedback)  (e.g. its loss)
                           -> the complete RoundRecord (loss folded in, seconds)

Generation stops at EOS (also inside an accepted block: tokens after it are dropped), at
``max_new_tokens`` (never exceeded) or at the context window. Sources: Leviathan et al.
2023 / Chen et al. 2023 (chain), SpecInfer (tree), OnlineSpec Algorithm 1 (feedback).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import torch

from specloop.realmodels.drafters.base import DraftProposal, DraftRequest, VerifyFeedback
from specloop.realmodels.kvcache import cache_length, causal_forward, compact, keep_positions, new_cache
from specloop.realmodels.padding import pad_block
from specloop.realmodels.sampling import check_finite, check_logits_sum, processed_probs
from specloop.realmodels.tree import block_inputs, node_depths
from specloop.realmodels.verify import VerifyOutcome, children_lists, verify_greedy, verify_tree
from specloop.record import RoundRecord, Trace
from specloop.strategies.base import DraftPlan, PlanState, TreeCandidates
from specloop.strategies.engine import RoundHooks, chain_step, layer_draft_step
from specloop.strategies.subtree import select_subtree

__all__ = ["DecodeSession", "GenerationResult", "LiveTargetSide", "TargetPass", "TargetSide"]


@runtime_checkable
class TargetSide(Protocol):
    """What a session needs from the target's side of decoding (`SpeculativeDecoder`,
    or `ReplayDecoder` over a recording): public members only, so a session never
    reaches into another class's privates.

    Attributes:
        drafter: the `Drafter` the session asks for proposals.
        model: the target causal LM (its weights; a replay never runs its forward).
        device, dtype: where and in what dtype the target's tensors live.
        vocab_size: rows of the target's LM head (tokens).
        context_window: the most positions a sequence may hold (tokens).
        eos_ids: token ids that end generation.
        sampling: the round's `SamplingConfig`.
        generator: the torch.Generator every random draw of a round uses.
    """

    drafter: object
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    context_window: int
    eos_ids: set
    sampling: object
    generator: torch.Generator

    def clock(self) -> float:
        """Seconds now, the device synchronised first (monotonic)."""

    def verify_width(self, block: int) -> int:
        """Tokens a verification block of ``block`` tokens is verified as (>= block;
        padded when the target's forward is faster at the wider width)."""


@runtime_checkable
class LiveTargetSide(TargetSide, Protocol):
    """A `TargetSide` that runs the target's forward (`DecodeSession`'s)."""

    def verify_forward(self, cache, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                       check: bool = True) -> tuple[torch.Tensor, tuple | None]:
        """One verification forward over the cache: float32 logits (n, V) and the
        hidden states the drafter reads (or None); ValueError on NaN / +inf logits
        when ``check``."""


@dataclass(frozen=True)
class GenerationResult:
    """Output of `SpeculativeDecoder.generate`.

    Attributes:
        prompt_ids: int64 (L,) the prompt.
        new_tokens: generated token ids (<= max_new_tokens, EOS included if hit).
        trace: one `RoundRecord` per round (``trace.meta`` has prefill_time).
        stop_reason: "eos", "length" or "context".
        prefill_time: seconds of the target's prefill (device synchronised).
    """

    prompt_ids: torch.Tensor
    new_tokens: list[int]
    trace: Trace
    stop_reason: str
    prefill_time: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def decode_time(self) -> float:
        """Seconds of all rounds (draft + verify + update), prefill excluded."""
        return self.trace.total_time if len(self.trace) else 0.0


#: the phases `DecodeSession` times when profiling (in round order; they partition the round)
PHASES = ("draft", "tree_selection", "mask_positions", "target_forward", "acceptance", "cache_surgery",
          "feedback", "record")


class _Phases:
    """Seconds per phase of the current round: ``mark(name)`` charges the time since the
    previous mark to ``name`` (a no-op object when profiling is off)."""

    def __init__(self, clock):
        self.clock, self.seconds, self._last = clock, {}, None

    def start(self, t0: float) -> None:
        self.seconds = {name: 0.0 for name in PHASES}
        self._last = t0

    def mark(self, name: str) -> float:
        """Charge the time since the last mark to ``name``; returns the time now."""
        now = self.clock()
        self.seconds[name] += now - self._last
        self._last = now
        return now


class _NoPhases:
    seconds: dict = {}

    def start(self, t0: float) -> None:
        pass

    def mark(self, name: str) -> None:
        return None


class TargetPass:
    """The target's verification forward over one proposal (`DecodeSession.target_pass`).

    Attributes:
        proposal: the verified `DraftProposal` (n nodes; tokens / parents on the host).
        logits: float32 (n + 1, V) on the target's device: row 0 after the pending
            token, row i + 1 after node i (None in a replay).
        hidden: tuple of (n + 1, H) hidden states (the drafter's ``needs_target_hidden``
            layers) or None.
        cache_length: the cache length before the forward (positions of the block
            start there).
        parent_rows: int64 (n,) on the logits' device, ``parents + 1`` (the row each
            node's token is judged against), or None (then made from the proposal).
        checked: False when the forward left the NaN / +inf check of the logits to
            `host_values` (greedy rounds: it joins the round's one device read).
    """

    def __init__(self, proposal: DraftProposal, logits: torch.Tensor, hidden, cache_len: int,
                 parent_rows: torch.Tensor | None = None, checked: bool = True):
        self.proposal, self.logits, self.hidden, self.cache_length = proposal, logits, hidden, cache_len
        self.parent_rows, self._checked = parent_rows, checked
        self._argmax = None
        self._host = None

    @property
    def argmax(self) -> torch.Tensor:
        """int64 (n + 1,): the target's greedy token after the pending token and each node
        (``max(-1).indices``: the first maximal index, as argmax)."""
        if self._argmax is None:
            self._argmax = self.logits.max(-1).indices
        return self._argmax

    def host_values(self) -> tuple[list[int], list[float] | None]:
        """What greedy acceptance and the record need from the device, in one
        device-to-host copy (made once): the argmax row as n + 1 ints, and with a
        q_draft each node's q at its parent row's argmax (0 outside the draft
        vocabulary or off a replay's recorded path; else None). The logits' sum rides
        along when the forward left the NaN / +inf check out.

        Raises:
            ValueError: NaN / +inf logits.
        """
        if self._host is not None:
            return self._host
        argmax = self.argmax
        parts = [argmax.double()]
        check = self.logits is not None and not self._checked
        if check:
            parts.append(self.logits.sum().double().reshape(1))
        q, n = self.proposal.q_draft, self.proposal.size
        if q is not None and n:
            rows = self.parent_rows if self.parent_rows is not None else self.proposal.parents + 1
            at = argmax.to(q.device)[rows.to(q.device)]
            inside = (at >= 0) & (at < q.shape[-1])
            q_at = q.gather(1, at.clamp(0, q.shape[-1] - 1).reshape(-1, 1)).reshape(-1).double()
            parts.append((q_at * inside).to(argmax.device))
        values = torch.cat(parts).tolist()
        width = int(argmax.shape[0])
        if check:
            check_logits_sum(values[width], self.logits)
            self._checked = True
        self._host = ([int(v) for v in values[:width]], values[width + int(check):] if q is not None and n else None)
        return self._host


class DecodeSession:
    """One prompt's decoding state, stepped one round at a time (`RoundEngine`).

    Args:
        decoder: the `SpeculativeDecoder` (target, drafter, sampling, generator, EOS,
            verification widths).
        prompt_ids: int64 (L,) validated prompt.
        max_new_tokens: cap on generated tokens (int >= 0).
        stream_index: written into each record.
        on_tokens: called with the committed token ids after each round.
        profile: time the round's phases (`PHASES`, seconds, device synchronised):
            ``phase_log`` gets one dict per round. All but "record" partition the
            record's draft + verify + update seconds; "record" (building the record)
            comes after them, outside the round's time.

    Use: ``session.prefill()`` once, then `drive_round(policy, session)` until
    ``session.done``; ``session.result()`` gives the `GenerationResult`.
    """

    def __init__(self, decoder: LiveTargetSide, prompt_ids: torch.Tensor, max_new_tokens: int, stream_index: int = 0,
                 on_tokens: Callable[[list[int]], None] | None = None, profile: bool = False):
        self.decoder, self.drafter = decoder, decoder.drafter
        self.ids, self.max_new_tokens = prompt_ids, int(max_new_tokens)
        self.stream_index, self.on_tokens = int(stream_index), on_tokens
        self.cache = new_cache()
        self.seq: list[int] = prompt_ids.tolist()
        self.new_tokens: list[int] = []
        self.trace = Trace([], {"drafter": getattr(self.drafter, "name", "?")})
        self.stop_reason = "length"
        self.prefill_time = 0.0
        self._finished = False
        self._phases = _Phases(decoder.clock) if profile else _NoPhases()
        self.phase_log: list[dict[str, float]] = []

    # -- prefill ---------------------------------------------------------------------
    def prefill(self) -> float:
        """Feed the prompt without its last token into the cache and reset the drafter
        (with the target's hidden states where it needs them). Returns the seconds."""
        clock, hidden = self.decoder.clock, None
        t0 = clock()
        prefix = self.ids[:-1]
        layers = tuple(self.drafter.needs_target_hidden)
        if prefix.numel():
            out = causal_forward(self.decoder.model, self.cache, prefix, bool(layers), logits_to_keep=1)
            check_finite(out.logits, "target model")
            if layers:
                hidden = tuple(out.hidden_states[i][0] for i in layers)
        self.drafter.reset(self.ids.clone(), target_hidden=hidden)
        self.prefill_time = clock() - t0
        self.trace.meta["prefill_time"] = self.prefill_time
        return self.prefill_time

    @property
    def remaining(self) -> int:
        """Tokens still allowed before ``max_new_tokens``."""
        return self.max_new_tokens - len(self.new_tokens)

    @property
    def room(self) -> int:
        """Free positions of the context window."""
        return self.decoder.context_window - len(self.seq)

    @property
    def done(self) -> bool:
        """True once EOS, ``max_new_tokens`` or the context window stopped generation."""
        if self._finished or self.remaining <= 0:
            return True
        if self.room <= 0:
            self.stop_reason = "context"
            return True
        return False

    # -- the RoundEngine protocol ------------------------------------------------------------
    def plan_state(self) -> PlanState:
        return PlanState(len(self.trace), len(self.seq), self.remaining)

    def start_round(self, plan: DraftPlan) -> int:
        """Start the clock; the depth cap: the plan's k, at most remaining - 1 and
        room - 1 (the bonus token always fits)."""
        if self.done:
            raise ValueError("the session is finished (EOS, max_new_tokens or the context window)")
        self._t0 = self.decoder.clock()
        self._phases.start(self._t0)
        self._plan = plan
        self._cap = max(0, min(int(plan.num_draft_tokens), self.remaining - 1, self.room - 1))
        return self._cap

    def draft(self, hooks: RoundHooks) -> None:
        """Propose (the drafter may ask ``hooks``), clip to the cap, and apply the
        policy's hooks to drafters that do not ask them."""
        self._proposal = self.propose(self._plan, hooks)
        self.mark_drafted()

    def mark_drafted(self) -> None:
        """End the round's draft time now (engines that draft through `propose` and
        decide outside the session, e.g. the LTD engine, call it themselves)."""
        self._t1 = self._phases.mark("tree_selection") or self.decoder.clock()

    def verify(self, hooks: RoundHooks) -> RoundRecord:
        """Verify this round's proposal, commit, feed back; the complete record."""
        return self.commit(self.target_pass(self._proposal))

    # -- the round's parts (also used by the LTD recorder / environment) ------------------
    def propose(self, plan: DraftPlan, hooks: RoundHooks | None = None, cap: int | None = None) -> DraftProposal:
        """The drafter's proposal for ``plan`` within the round's cap (or ``cap``
        levels, for engines that draft deeper and choose the verified part later);
        ValueError for token ids outside the target's vocabulary or a larger draft
        vocabulary."""
        cap = self._cap if cap is None else int(cap)
        if cap <= 0:
            return DraftProposal.empty()
        d = self.decoder
        ids = torch.tensor(self.seq, dtype=torch.long, device="cpu")      # host: drafters read it as a list
        request = DraftRequest(ids, plan, self.room - 1, d.sampling, d.generator, len(self.trace), hooks)
        proposal = self.drafter.propose(request)
        self._phases.mark("draft")
        proposal = self._clip(proposal, cap, self.room - 1)
        if hooks is not None and not hooks.asked and _has_hooks(hooks.policy):
            proposal = _apply_hooks(proposal, hooks, len(self.seq))
        self._phases.mark("tree_selection")
        return proposal

    def _clip(self, proposal: DraftProposal, max_depth: int, max_nodes: int) -> DraftProposal:
        """Check a proposal and drop nodes deeper than ``max_depth`` or beyond
        ``max_nodes`` (both keep the tree closed under ancestors). Tokens and parents
        come to the host first (one copy when a drafter left them on its device)."""
        if proposal.size == 0:
            return proposal
        proposal = _on_host(proposal)
        vocab = self.decoder.vocab_size
        tokens = proposal.tokens.reshape(-1)
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"drafter proposed token ids outside [0, {vocab}) (min {low}, max {high}): the "
                             "draft's vocabulary is larger than / different from the target's")
        q = proposal.q_draft
        if q is not None and q.shape[-1] > vocab:
            raise ValueError(f"draft vocabulary ({q.shape[-1]}) is larger than the target's ({vocab}); "
                             "refusing to verify")
        depths = node_depths(proposal.parents)
        keep = (depths <= max_depth) & (torch.arange(proposal.size, device="cpu") < max_nodes)
        if bool(keep.all()):
            return proposal
        return proposal.subset(torch.nonzero(keep).reshape(-1))

    def target_pass(self, proposal: DraftProposal) -> TargetPass:
        """The target's one verification forward over [pending] + the proposal's nodes
        (tree mask, padded to the calibrated width; padding rows dropped). The block's
        tokens, positions and mask travel to the device in one copy
        (`tree.block_inputs`); under greedy decoding the NaN check of the logits
        joins the round's one read back (`TargetPass.host_values`)."""
        d = self.decoder
        cache_len = cache_length(self.cache)
        size = proposal.size + 1
        tokens, parents = pad_block(proposal.tokens.cpu(), proposal.parents.cpu(), d.verify_width(size),
                                    self.seq[-1])
        block = block_inputs(self.seq[-1], tokens, parents, cache_len, d.dtype, d.device)
        self._phases.mark("mask_positions")
        greedy = d.sampling.greedy
        logits, hidden = d.verify_forward(self.cache, block.input_ids, block.mask, block.positions, check=not greedy)
        self._phases.mark("target_forward")
        return TargetPass(proposal, logits[:size], hidden, cache_len, block.parent_rows[:size - 1],
                          checked=not greedy)

    def accept(self, passed: TargetPass) -> tuple[VerifyOutcome, torch.Tensor | None]:
        """The accepted path and next token, and the target's processed probabilities
        (None under greedy decoding). Greedy rounds always take `verify_greedy` on the
        target's argmax, for every drafter: with one-hot p rows `verify_tree` accepts a
        drafted token iff it is the argmax and a rejection leaves p one-hot at it,
        whatever q_draft is, so the result (uniform drawn included) is the same and no
        (V,) row leaves the device."""
        d, proposal = self.decoder, passed.proposal
        if d.sampling.greedy:
            outcome = verify_greedy(passed.host_values()[0], proposal.tokens.tolist(), proposal.parents.tolist(),
                                    d.generator)
            return outcome, None
        p_target = processed_probs(passed.logits, d.sampling)
        return verify_tree(p_target, proposal.tokens.cpu(), proposal.parents.cpu(), proposal.q_draft,
                           d.generator), p_target

    def commit(self, passed: TargetPass, root_only: bool = False) -> RoundRecord:
        """Accept, prune the cache to the accepted path, feed the drafter back and
        return the round's complete record.

        Args:
            passed: this round's `TargetPass`.
            root_only: commit only the target's greedy token at the pending token (the
                LTD recorder: the output is then plain greedy decoding).
        """
        proposal = passed.proposal
        if root_only:
            outcome, p_target = VerifyOutcome((), passed.host_values()[0][0], ()), None
        else:
            outcome, p_target = self.accept(passed)
        self._phases.mark("acceptance")
        accepted = list(outcome.accepted_nodes)
        self._keep_accepted(passed, accepted)
        committed, eos = self._truncate([int(proposal.tokens[j]) for j in accepted] + [outcome.next_token])
        t2 = self._phases.mark("cache_surgery") or self.decoder.clock()
        observation = self.drafter.observe(self._feedback(passed, outcome, p_target, committed, eos))
        t3 = self._phases.mark("feedback") or self.decoder.clock()
        record = RoundRecord(
            round_index=len(self.trace), stream_index=self.stream_index, num_draft_tokens=proposal.size,
            tree_depth=proposal.depth, verified_tokens=proposal.size + 1,
            accepted_tokens=min(len(accepted), len(committed)), tokens_per_round=len(committed),
            draft_time=self._t1 - self._t0, verify_time=self._verify_seconds(passed, t2 - self._t1),
            update_time=t3 - t2,
            acceptance_probs=self._acceptance_probs(passed, p_target, accepted),
            child_acceptance_ratios=outcome.child_acceptance_ratios, loss=_observed_loss(observation))
        self.trace.append(record)
        self._phases.mark("record")
        if self._phases.seconds:
            self.phase_log.append(dict(self._phases.seconds))
        self.seq.extend(committed)
        self.new_tokens.extend(committed)
        if eos:
            self._finished, self.stop_reason = True, "eos"
        if self.on_tokens is not None:
            self.on_tokens(committed)
        return record

    def _keep_accepted(self, passed: TargetPass, accepted: list[int]) -> None:
        """Prune the target's cache to the prefix, the pending token and the accepted nodes."""
        keep = torch.cat([torch.arange(passed.cache_length + 1, device="cpu"),
                          passed.cache_length + 1 + torch.tensor(accepted, dtype=torch.long, device="cpu")])
        keep_positions(self.cache, keep)
        if getattr(self.decoder, "compiled", False):
            compact(self.cache)

    def _acceptance_probs(self, passed: TargetPass, p_target, accepted: list[int]) -> tuple:
        """The record's per-position Acc_j (`_position_acceptance`)."""
        return _position_acceptance(passed, p_target, passed.proposal, accepted)

    def _verify_seconds(self, passed: TargetPass, measured: float) -> float:
        """The round's verify seconds: the measured ones (a replay prices the forward
        instead, `specloop.realmodels.streams.replay`)."""
        return measured

    def _feedback(self, passed: TargetPass, outcome: VerifyOutcome, p_target, committed: list[int],
                  eos: bool) -> VerifyFeedback:
        accepted = list(outcome.accepted_nodes)
        rows = [0] + [1 + j for j in accepted]
        # the accepted rows: a slice when they are the block's first (every chain), else
        # one index copied to the device once for the logits, argmax and hidden states
        pick = _rows_index(rows, passed.logits.device)
        row_logits = passed.logits[pick]
        if p_target is None:  # greedy fast path: the one-hot rows of the accepted path only
            row_probs = torch.zeros_like(row_logits).scatter_(-1, passed.argmax[pick].reshape(-1, 1), 1.0)
        else:
            row_probs = p_target[pick.to(p_target.device) if torch.is_tensor(pick) else pick]
        hidden = passed.hidden
        return VerifyFeedback(
            proposal=passed.proposal, accepted_nodes=tuple(accepted),
            committed_tokens=torch.tensor(committed, dtype=torch.long, device="cpu"), p_target=row_probs,
            target_logits=row_logits, target_hidden=None if hidden is None else tuple(h[pick] for h in hidden),
            child_acceptance_ratios=outcome.child_acceptance_ratios,
            finished=eos or len(committed) >= self.remaining)

    def _truncate(self, committed: list[int]) -> tuple[list[int], bool]:
        """Cut at the first EOS (kept) and at the remaining tokens."""
        remaining = self.remaining
        for i, tok in enumerate(committed):
            if tok in self.decoder.eos_ids:
                return committed[: min(i + 1, remaining)], i + 1 <= remaining
        return committed[:remaining], False

    def result(self):
        """The `GenerationResult` of the prompt so far."""
        return GenerationResult(self.ids, list(self.new_tokens), self.trace, self.stop_reason, self.prefill_time)


def _on_host(proposal: DraftProposal) -> DraftProposal:
    """The proposal with its tokens and parents on the host (one device read when both
    were left on a device; q_draft and node_probs stay where they are)."""
    tokens, parents = proposal.tokens.reshape(-1), proposal.parents
    on_dev = tokens.device.type != "cpu", parents.device.type != "cpu"
    if not any(on_dev):
        return proposal
    if all(on_dev) and tokens.device == parents.device:
        both = torch.stack([tokens.long(), parents.long()]).cpu()
        tokens, parents = both[0], both[1]
    else:
        tokens, parents = tokens.cpu(), parents.cpu()
    return dataclasses.replace(proposal, tokens=tokens, parents=parents)


def _rows_index(rows: list[int], device: torch.device):
    """``rows`` as an index: a slice when they are 0..m-1, else an int64 tensor on ``device``."""
    if rows == list(range(len(rows))):
        return slice(0, len(rows))
    return torch.tensor(rows, dtype=torch.long, device="cpu").to(device)


def _has_hooks(policy) -> bool:
    return hasattr(policy, "continue_drafting") or hasattr(policy, "verify_size")


def _apply_hooks(proposal: DraftProposal, hooks: RoundHooks, context_length: int) -> DraftProposal:
    """Reveal a drafter's whole proposal to the policy's hooks one level at a time (for
    drafters that do not ask them while drafting: a level depends only on the levels
    above it, so the depth-<=D part of the proposal is what the drafter would have
    drafted to D) and keep the levels and the V nodes they choose. Node probabilities:
    the proposal's ``node_probs``, else the path product of its q_draft rows, else 1
    (a deterministic draft is certain of its tokens)."""
    if proposal.size == 0:
        return proposal
    depths = proposal.depths().numpy()
    parents = proposal.parents.cpu().numpy()
    probs = _node_probs(proposal, parents)
    depth, parent_best = 1, 1.0
    while True:
        layer = probs[depths == depth]
        if proposal.is_chain:
            step = chain_step(depth, context_length, float(probs[depth - 1] / parent_best), float(layer[0]))
        else:
            step = layer_draft_step(depth, context_length, layer, parent_best)
        if depth >= int(depths.max()) or not hooks.continue_drafting(step):
            break
        parent_best, depth = float(layer.max()), depth + 1
    size = int((depths <= depth).sum())
    if not proposal.is_chain:
        size = hooks.verify_size(TreeCandidates(depth, context_length, probs[depths <= depth].copy()))
    if proposal.q_draft is not None:
        # sampled nodes: keeping the likeliest would verify a biased subset of the draws;
        # the first V in drafting (topological) order are closed under ancestors and
        # unbiased (see `drafters.small_lm.sample_siblings`)
        return proposal.subset(np.flatnonzero(depths <= depth)[:size])
    return proposal.subset(select_subtree(depths, parents, probs, depth, size))


def _node_probs(proposal: DraftProposal, parents: np.ndarray) -> np.ndarray:
    if proposal.node_probs is not None:
        return proposal.node_probs.double().cpu().numpy()
    probs = np.ones(proposal.size)
    if proposal.q_draft is not None:
        tokens = proposal.tokens.cpu()
        own = proposal.q_draft.double().cpu().gather(1, tokens.reshape(-1, 1)).reshape(-1).numpy()
        for i, par in enumerate(parents):
            probs[i] = own[i] * (probs[par] if par >= 0 else 1.0)
    return probs


def _position_acceptance(passed: TargetPass, p_target, proposal: DraftProposal, accepted: list[int]) -> tuple:
    """Acc_j = sum_x min(p_j(x), q_j(x)) at each verified position j along the accepted
    path and the first position past it that had a drafted child (the first child tried
    there): the draft's per-position acceptance probability (a point-mass q gives
    p_j(x_j); greedy p is one-hot). ``p_target`` None: greedy, read from the pass's
    host argmax and q at it (`TargetPass.host_values`; the replay's greedy rows of a
    draft with q_draft give q_j(argmax))."""
    if proposal.size == 0:
        return ()
    kids = children_lists(proposal.parents.cpu())
    tokens = proposal.tokens.tolist()
    out, parent = [], -1
    for j in range(len(accepted) + 1):
        node = accepted[j] if j < len(accepted) else (kids.get(parent) or [None])[0]
        if node is None:
            break
        token = tokens[node]
        if p_target is None and proposal.q_draft is None:   # greedy, point-mass draft
            out.append(float(passed.host_values()[0][parent + 1] == token))
        elif p_target is None:        # greedy p (one-hot at the argmax) against q: q(argmax), as the dense path
            out.append(float(passed.host_values()[1][node]))
        else:
            p = p_target[parent + 1].double().cpu()
            if proposal.q_draft is None:
                out.append(float(p[token]))
            else:
                q = proposal.q_draft[node].double().cpu()
                out.append(float(torch.minimum(p[: q.shape[0]], q).sum()))
        parent = node
    return tuple(out)


def _observed_loss(observation) -> float:
    """The loss a drafter's ``observe`` reported (a float, a mapping with "loss", or None)."""
    if observation is None:
        return math.nan
    if isinstance(observation, dict):
        return float(observation.get("loss", math.nan))
    return float(observation)
