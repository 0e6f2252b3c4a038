"""The speculative decoder for real models: chain and tree verification, greedy and
sampling, lossless (OnlineSpec Algorithm 1 loop: draft -> verify -> feedback ->
update; verification per Leviathan et al. 2023 / SpecInfer, see `verify`).

One round (state: the target's KV cache holds ``ids[:-1]``; ``ids[-1]`` is the
pending token)::

    plan     = policy.plan(PlanState)                       # k or a TreePlan
    proposal = drafter.propose(DraftRequest)                # tokens, parents, q_draft
    logits   = target([pending] + nodes, tree mask, positions)   # one forward
    outcome  = verify_tree(p_target, proposal, generator)   # accepted path + next token
    cache   <- prefix + pending + accepted nodes            # `kvcache.keep_positions`
    drafter.observe(VerifyFeedback); policy.observe(RoundRecord)

Generation stops at EOS (also inside an accepted block: tokens after it are
dropped), at ``max_new_tokens`` (never exceeded) or at the context window.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from specloop.realmodels.drafters.base import DraftProposal, DraftRequest, Drafter, VerifyFeedback
from specloop.realmodels.kvcache import cache_length, causal_forward, keep_positions, model_forward, new_cache
from specloop.realmodels.padding import calibrate_verify_widths, check_widths, pad_block
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.sampling import SamplingConfig, check_finite, processed_probs
from specloop.realmodels.tree import node_depths, verify_block_inputs
from specloop.realmodels.verify import verify_greedy, verify_tree
from specloop.record import RoundRecord, Trace
from specloop.strategies.base import DraftPlan, DraftPolicy, PlanState

__all__ = ["SpeculativeDecoder", "GenerationResult", "eos_ids_of", "context_window_of",
           "validate_prompt"]


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


def eos_ids_of(model, tokenizer=None) -> set[int]:
    """EOS ids from the generation config, the model config and the tokenizer."""
    ids: set[int] = set()
    sources = [getattr(getattr(model, "generation_config", None), "eos_token_id", None),
               getattr(model.config, "eos_token_id", None),
               getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None]
    for value in sources:
        if value is None:
            continue
        ids.update(int(v) for v in (value if isinstance(value, (list, tuple, set)) else [value]))
    return ids


def context_window_of(model) -> int:
    """The model's maximum sequence length in tokens (``max_position_embeddings``)."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30) or (1 << 30))


def validate_prompt(prompt_ids, vocab_size: int, context_window: int) -> torch.Tensor:
    """Check and normalise a prompt to int64 (L,).

    Raises:
        ValueError: empty prompt, not 1-D, ids outside [0, vocab_size), or a
            prompt of >= context_window tokens (no room to generate).
    """
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1) if not isinstance(prompt_ids, torch.Tensor) \
        else prompt_ids.reshape(-1).long()
    if ids.numel() == 0:
        raise ValueError("empty prompt: at least one token is needed")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}); got min {int(ids.min())}, "
                         f"max {int(ids.max())}")
    if ids.numel() >= context_window:
        raise ValueError(f"prompt of {ids.numel()} tokens does not fit the context window of "
                         f"{context_window} tokens (need at least one free position)")
    return ids


class _Clock:
    """Wall clock that synchronises CUDA before reading."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class SpeculativeDecoder:
    """Lossless speculative decoding of a target causal LM with any `Drafter`.

    Args:
        target: a `LoadedModel` or a transformers causal LM (``model(input_ids,
            attention_mask=4D float, position_ids, past_key_values)`` interface).
        drafter: a `Drafter` (see `specloop.realmodels.drafters.base`).
        policy: a `DraftPolicy` (``plan`` / ``observe``); default a fixed chain of
            5 tokens.
        sampling: `SamplingConfig` applied identically to p_target and q_draft
            (temperature 0 = greedy).
        seed: seed of the owned CPU ``torch.Generator`` (all uniforms come from it).
        eos_token_id: int or iterable of ints; default from the model / tokenizer.
        verify_widths: verification-width padding (`specloop.realmodels.padding`):
            None (off), a {block size: width} map, or "auto" to time the target's
            verification forward for widths 1..8 once, before the first prompt (48 forwards)
            and pad blocks whose wider forward is at least 10 % faster (float32
            MKL on some CPUs: 2-3 token blocks). The output is unchanged.

    Raises:
        ValueError: an invalid policy or drafter object, or invalid verify_widths.
    """

    def __init__(self, target, drafter: Drafter, *, policy: DraftPolicy | None = None,
                 sampling: SamplingConfig | None = None, seed: int = 0, eos_token_id=None,
                 verify_widths: dict | str | None = None):
        self.model = getattr(target, "model", target)
        self.tokenizer = getattr(target, "tokenizer", None)
        if not isinstance(drafter, Drafter):
            raise ValueError(f"drafter {drafter!r} does not implement the Drafter interface")
        self.drafter = drafter
        self.policy = policy if policy is not None else FixedDraftPolicy(5)
        if not isinstance(self.policy, DraftPolicy):
            raise ValueError(f"policy {policy!r} lacks plan()/observe()")
        self.sampling = sampling or SamplingConfig()
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))
        if eos_token_id is None:
            self.eos_ids = eos_ids_of(self.model, self.tokenizer)
        else:
            self.eos_ids = {int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple, set))
                                             else [eos_token_id])}
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.context_window = context_window_of(self.model)
        self._clock = _Clock(self.device)
        if verify_widths is not None and verify_widths != "auto" and not isinstance(verify_widths, dict):
            raise ValueError(f"verify_widths must be None, 'auto' or a dict, got {verify_widths!r}")
        self.verify_widths = check_widths(verify_widths) if isinstance(verify_widths, dict) else verify_widths

    def calibrate(self) -> dict[int, int]:
        """Run the "auto" verification-width calibration now (otherwise it runs,
        untimed in the round records, at the start of the first `generate`) and
        return the {block size: width} map in use ({} when padding is off)."""
        if self.verify_widths == "auto":
            self.verify_widths = calibrate_verify_widths(self.model)
        return dict(self.verify_widths or {})

    def _verify_width(self, block: int) -> int:
        """Tokens to verify a block of ``block`` tokens as."""
        return block if self.verify_widths is None else self.verify_widths.get(block, block)

    # -- target forward --------------------------------------------------------
    def _forward(self, cache, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
        """One verification forward: (float32 logits (n, V), hidden states or None).

        Raises:
            ValueError: NaN / +inf logits.
        """
        hidden = bool(self.drafter.needs_target_hidden)
        out = model_forward(self.model, cache, input_ids, mask, positions, hidden)
        logits = out.logits[0].float()
        # one cheap reduction instead of two full isnan / isposinf passes: the sum is
        # NaN or +inf iff some logit is NaN or +inf (-inf alone, a masked token, is allowed)
        total = float(logits.sum())
        if total != total or total == float("inf"):
            check_finite(logits, "target model")
        layers = None
        if hidden:
            layers = tuple(out.hidden_states[i][0] for i in self.drafter.needs_target_hidden)
        return logits, layers

    def _prefill(self, cache, prefix: torch.Tensor):
        """Feed ``prefix`` (the prompt without its last token) into the cache."""
        if prefix.numel() == 0:
            return None
        hidden = bool(self.drafter.needs_target_hidden)
        out = causal_forward(self.model, cache, prefix, hidden, logits_to_keep=1)
        check_finite(out.logits, "target model")
        if not hidden:
            return None
        return tuple(out.hidden_states[i][0] for i in self.drafter.needs_target_hidden)

    def _check_sliding_window(self, total: int) -> None:
        """Sliding-window layers (Gemma-3) get the same full tree mask as the others,
        which is exact only while the sequence fits in the window."""
        config = self.model.config
        window = getattr(config, "sliding_window", None)
        sliding = "sliding_attention" in (getattr(config, "layer_types", None) or [])
        if window and sliding and total > int(window):
            raise ValueError(f"prompt + max_new_tokens = {total} tokens exceeds the sliding window of "
                             f"{window} tokens of this model; the decoder's tree mask is exact only "
                             "within the window")

    # -- one round ----------------------------------------------------------------
    def _clip_proposal(self, proposal: DraftProposal, max_depth: int, max_nodes: int) -> DraftProposal:
        """Check a proposal and drop nodes deeper than ``max_depth`` or beyond
        ``max_nodes`` (both keep the tree closed under ancestors)."""
        if proposal.size == 0:
            return proposal
        tokens = proposal.tokens.reshape(-1).long().cpu()
        if int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"drafter proposed token ids outside [0, {self.vocab_size}) "
                             f"(min {int(tokens.min())}, max {int(tokens.max())}): the draft's vocabulary "
                             "is larger than / different from the target's")
        q = proposal.q_draft
        if q is not None and q.shape[-1] > self.vocab_size:
            raise ValueError(f"draft vocabulary ({q.shape[-1]}) is larger than the target's "
                             f"({self.vocab_size}); refusing to verify")
        depths = node_depths(proposal.parents.cpu())
        keep = (depths <= max_depth) & (torch.arange(proposal.size) < max_nodes)
        if bool(keep.all()):
            return DraftProposal(tokens, proposal.parents.cpu(), q, proposal.node_probs)
        idx = torch.nonzero(keep).reshape(-1)
        remap = torch.full((proposal.size,), -1, dtype=torch.long)
        remap[idx] = torch.arange(idx.numel())
        parents = proposal.parents.cpu()[idx]
        parents = torch.where(parents >= 0, remap[parents.clamp(min=0)], parents)
        return DraftProposal(tokens[idx], parents, None if q is None else q[idx],
                             None if proposal.node_probs is None else proposal.node_probs[idx])

    def _round_plan(self, state: PlanState) -> DraftPlan:
        plan = self.policy.plan(state)
        if not isinstance(plan, DraftPlan):
            raise ValueError(f"policy.plan returned {type(plan).__name__}, expected DraftPlan")
        return plan

    def generate(self, prompt_ids, max_new_tokens: int = 64, *, stream_index: int = 0,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Args:
            prompt_ids: int sequence / tensor (L,) of target token ids, L >= 1.
            max_new_tokens: cap on generated tokens (>= 0).
            stream_index: written into each `RoundRecord`.
            on_tokens: called with the committed token ids after each round
                (streaming).

        Returns:
            `GenerationResult`.

        Raises:
            ValueError: empty prompt, ids outside the vocabulary, prompt not fitting
                the context, max_new_tokens < 0, NaN logits, an invalid proposal.
        """
        if int(max_new_tokens) < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        ids = validate_prompt(prompt_ids, self.vocab_size, self.context_window)
        self._check_sliding_window(int(ids.numel()) + int(max_new_tokens))
        self.calibrate()                          # "auto" padding: once, before the first prefill
        cache = new_cache()
        t0 = self._clock()
        hidden = self._prefill(cache, ids[:-1])
        self.drafter.reset(ids.clone(), target_hidden=hidden)
        prefill_time = self._clock() - t0
        trace = Trace([], {"prefill_time": prefill_time, "drafter": getattr(self.drafter, "name", "?")})
        new_tokens: list[int] = []
        stop = "length"
        seq = ids.tolist()
        while len(new_tokens) < max_new_tokens:
            room = self.context_window - len(seq)
            if room <= 0:
                stop = "context"
                break
            record, committed, finished = self._round(cache, seq, max_new_tokens - len(new_tokens),
                                                      room, len(trace), stream_index)
            trace.append(record)
            seq.extend(committed)
            new_tokens.extend(committed)
            if on_tokens is not None:
                on_tokens(committed)
            if finished:
                stop = "eos"
                break
        return GenerationResult(ids, new_tokens, trace, stop, prefill_time)

    def _round(self, cache, seq: list[int], remaining: int, room: int, round_index: int,
               stream_index: int) -> tuple[RoundRecord, list[int], bool]:
        """Draft, verify, prune the cache, feed back. Returns (record, committed, eos)."""
        t0 = self._clock()
        plan = self._round_plan(PlanState(round_index, len(seq), remaining))
        max_depth = min(int(plan.num_draft_tokens), remaining - 1, room - 1)
        ids_t = torch.tensor(seq, dtype=torch.long, device=self.device)
        if max_depth > 0:
            request = DraftRequest(ids_t, plan, room - 1, self.sampling, self.generator, round_index, self.policy)
            proposal = self._clip_proposal(self.drafter.propose(request), max_depth, room - 1)
        else:
            proposal = DraftProposal.empty()
        t1 = self._clock()
        cache_len = cache_length(cache)
        size = proposal.size + 1
        tokens, parents = pad_block(proposal.tokens, proposal.parents, self._verify_width(size), seq[-1])
        mask, positions = verify_block_inputs(parents, cache_len, self.dtype, self.device)
        block = torch.cat([torch.tensor(seq[-1:], dtype=torch.long), tokens])
        logits, hidden = self._forward(cache, block, mask, positions)
        logits = logits[:size]                 # padding rows (if any) are dropped here and
                                               # from the cache by keep_positions below
        if self.sampling.greedy and proposal.q_draft is None:
            # deterministic draft, greedy target: only argmaxes matter (`verify_greedy`).
            # max(-1).indices is the first maximal index, as argmax, at a third of its cost
            argmax = logits.max(-1).indices
            outcome = verify_greedy(argmax.tolist(), proposal.tokens.tolist(), proposal.parents.tolist(),
                                    self.generator)
            p_target = None
        else:
            p_target = processed_probs(logits, self.sampling)
            outcome = verify_tree(p_target, proposal.tokens, proposal.parents, proposal.q_draft, self.generator)
        accepted = list(outcome.accepted_nodes)
        keep = torch.cat([torch.arange(cache_len + 1), cache_len + 1 + torch.tensor(accepted, dtype=torch.long)])
        keep_positions(cache, keep)
        committed = [int(proposal.tokens[j]) for j in accepted] + [outcome.next_token]
        committed, eos = self._truncate(committed, remaining)
        t2 = self._clock()
        rows = [0] + [1 + j for j in accepted]
        row_logits = logits[rows]
        if p_target is None:  # greedy fast path: the one-hot rows of the accepted path only
            row_probs = torch.zeros_like(row_logits).scatter_(-1, argmax[rows].reshape(-1, 1), 1.0)
        else:
            row_probs = p_target[rows]
        feedback = VerifyFeedback(
            proposal=proposal, accepted_nodes=tuple(accepted),
            committed_tokens=torch.tensor(committed, dtype=torch.long),
            p_target=row_probs, target_logits=row_logits,
            target_hidden=None if hidden is None else tuple(h[rows] for h in hidden),
            acceptance_probs=outcome.acceptance_probs,
            finished=eos or len(committed) >= remaining)
        self.drafter.observe(feedback)
        t3 = self._clock()
        depth = proposal.depth
        record = RoundRecord(
            round_index=round_index, stream_index=stream_index, num_draft_tokens=proposal.size,
            tree_depth=depth, verified_tokens=proposal.size + 1,
            accepted_tokens=min(len(accepted), depth), tokens_per_round=len(committed),
            draft_time=t1 - t0, verify_time=t2 - t1, update_time=t3 - t2,
            acceptance_probs=outcome.acceptance_probs)
        self.policy.observe(record)
        return record, committed, eos

    def _truncate(self, committed: list[int], remaining: int) -> tuple[list[int], bool]:
        """Cut at the first EOS (kept) and at ``remaining`` tokens."""
        for i, tok in enumerate(committed):
            if tok in self.eos_ids:
                return committed[: min(i + 1, remaining)], i + 1 <= remaining
        return committed[:remaining], False
