"""The speculative decoder for real models: chain and tree verification, greedy and
sampling, lossless (OnlineSpec Algorithm 1 loop: draft -> verify -> feedback ->
update; verification per Leviathan et al. 2023 / SpecInfer, see `verify`).

`SpeculativeDecoder.generate` prefills a `specloop.realmodels.session.DecodeSession`
(the target's KV cache, the drafter and the sequence of one prompt) and runs
`specloop.strategies.engine.drive_round` over it until it stops -- the same round
driver as every other engine::

    plan     = policy.plan(PlanState)                       # k or a TreePlan
    proposal = drafter.propose(DraftRequest)                # tokens, parents, q_draft
    logits   = target([pending] + nodes, tree mask, positions)   # one forward
    outcome  = verify_tree(p_target, proposal, generator)   # accepted path + next token
    cache   <- prefix + pending + accepted nodes            # `kvcache.keep_positions`
    drafter.observe(VerifyFeedback) -> record; policy.observe(RoundRecord)

Generation stops at EOS (also inside an accepted block: tokens after it are
dropped), at ``max_new_tokens`` (never exceeded) or at the context window.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from specloop.realmodels.drafters.base import Drafter
from specloop.realmodels.kvcache import check_tree_attention, model_forward
from specloop.realmodels.padding import calibrate_verify_widths, check_widths, sync_for_device
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.sampling import SamplingConfig, check_logits_sum
from specloop.realmodels.session import DecodeSession, GenerationResult
from specloop.strategies.base import DraftPolicy
from specloop.strategies.engine import drive_round

__all__ = ["SpeculativeDecoder", "GenerationResult", "eos_ids_of", "context_window_of",
           "validate_prompt", "check_max_new_tokens", "compile_verify_forward"]


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

    Accepts a 1-D sequence / tensor of ids, or a (1, L) batch of one (as tokenizers
    return it).

    Raises:
        ValueError: empty prompt, a batch of more than one prompt or any other shape
            that is not 1-D (batching is not supported), non-integer ids, ids outside
            [0, vocab_size), or a prompt of >= context_window tokens (no room to
            generate).
    """
    try:
        ids = prompt_ids if isinstance(prompt_ids, torch.Tensor) else torch.as_tensor(prompt_ids)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"prompt must be one sequence of token ids (batching is not supported): {exc}") from None
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1:
        raise ValueError(f"prompt must be one 1-D sequence of token ids, got shape {tuple(ids.shape)} "
                         "(batches of several prompts are not supported: decode them one at a time)")
    if ids.numel() == 0:
        raise ValueError("empty prompt: at least one token is needed")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        raise ValueError(f"prompt token ids must be integers, got dtype {ids.dtype}")
    ids = ids.long()
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}); got min {int(ids.min())}, "
                         f"max {int(ids.max())}")
    if ids.numel() >= context_window:
        raise ValueError(f"prompt of {ids.numel()} tokens does not fit the context window of "
                         f"{context_window} tokens (need at least one free position)")
    return ids


def check_max_new_tokens(max_new_tokens) -> int:
    """``max_new_tokens`` as an int >= 0 (ValueError for bools, floats such as 2.7,
    negatives or non-numbers)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if int(max_new_tokens) < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return int(max_new_tokens)


def compile_verify_forward(model):
    """``torch.compile(model, backend="inductor", dynamic=True)``: the target module the
    decoder's verification forward calls when ``compile_target`` is set. The returned
    module shares ``model``'s parameters and is made once per model, so every decoder of
    one target shares its compiled graphs (it is kept in ``model.__dict__``, not
    registered as a submodule: ``model``'s modules and state dict are unchanged).

    ``dynamic=True`` marks the block width and the cache length symbolic, so a decode
    compiles a few graphs rather than one per width and cache length (counted per width
    and cache length by `benchmarks/compile_verify.py`).
    """
    compiled = model.__dict__.get("_specloop_compiled_verify")
    if compiled is None:
        compiled = torch.compile(model, backend="inductor", dynamic=True)
        object.__setattr__(model, "_specloop_compiled_verify", compiled)
    return compiled


class _Clock:
    """Wall clock that waits for the device (CUDA, MPS: `padding.sync_for_device`) before reading."""

    def __init__(self, device: torch.device):
        self.sync = sync_for_device(device)

    def __call__(self) -> float:
        if self.sync is not None:
            self.sync()
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
        compile_target: run the verification forward through ``torch.compile``
            (inductor, ``dynamic=True``; `compile_verify_forward`); the prefill stays eager.
            Compile before timing with `warm_up` (one graph for the unmasked one-token
            forward, one for masked blocks, one recompile when dynamo first sees the cache
            length change: 1-2 minutes in all for SmolLM2-135M on 2 CPU cores, less once
            inductor's on-disk cache holds the kernels). After each round's cache surgery
            a cropped cache is made contiguous (a crop leaves views with the longer
            cache's strides, on which the compiled forward would recompile every few
            rounds). Greedy float32 output is identical to the eager path's (tested);
            `benchmarks/compile_verify.py` measures the forward alone (SmolLM2-135M:
            0.74-0.84x the eager time in bfloat16, 0.82-0.93x in float32).

    Raises:
        ValueError: an invalid policy or drafter object, invalid verify_widths, or a
            target whose attention implementation cannot take the 4D tree mask
            (flash-attention; `kvcache.check_tree_attention`).
    """

    def __init__(self, target, drafter: Drafter, *, policy: DraftPolicy | None = None,
                 sampling: SamplingConfig | None = None, seed: int = 0, eos_token_id=None,
                 verify_widths: dict | str | None = None, compile_target: bool = False):
        self.model = getattr(target, "model", target)
        self._verify_model = compile_verify_forward(self.model) if compile_target else self.model
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
        check_tree_attention(self.model, "the target model")
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.context_window = context_window_of(self.model)
        self.clock = _Clock(self.device)
        if verify_widths is not None and verify_widths != "auto" and not isinstance(verify_widths, dict):
            raise ValueError(f"verify_widths must be None, 'auto' or a dict, got {verify_widths!r}")
        self.verify_widths = check_widths(verify_widths) if isinstance(verify_widths, dict) else verify_widths

    @property
    def compiled(self) -> bool:
        """Whether the verification forward is compiled (``compile_target``)."""
        return self._verify_model is not self.model

    def warm_up(self, prompt_ids, widths=(1, 2, 3), cache_steps: int = 3) -> float:
        """Compile the verification forward before timing (`compile_verify_forward`):
        verification blocks of each of ``widths`` tokens (1 = the unmasked plain step) over
        the prompt's cache, then over ``cache_steps`` longer caches (dynamo's recompile on
        the first change of length), on a scratch cache and never through the drafter, so
        no drafter state (a suffix trie, a learned length) sees these tokens. Returns the
        seconds spent (0.0 without ``compile_target``).

        Raises:
            ValueError: as `generate` for a bad prompt.
        """
        if not self.compiled:
            return 0.0
        from specloop.realmodels.kvcache import cache_length, causal_forward, compact, crop, new_cache
        from specloop.realmodels.tree import verify_block_inputs
        ids = validate_prompt(prompt_ids, self.vocab_size, self.context_window)
        t0 = time.perf_counter()
        cache = new_cache()
        causal_forward(self.model, cache, ids)
        for step in range(cache_steps + 1):
            length = cache_length(cache)
            for width in widths:
                parents = torch.arange(-1, width - 2, dtype=torch.long)     # a chain of width - 1 nodes
                mask, positions = verify_block_inputs(parents, length, self.dtype, self.device)
                block = ids[-1:].repeat(width).to(self.device)
                self.verify_forward(cache, block, mask, positions)
                crop(cache, length)
                compact(cache)
            if step < cache_steps:
                causal_forward(self.model, cache, ids[-1:])
        return time.perf_counter() - t0

    def calibrate(self) -> dict[int, int]:
        """Run the "auto" verification-width calibration now (otherwise it runs,
        untimed in the round records, at the start of the first `generate`) and
        return the {block size: width} map in use ({} when padding is off)."""
        if self.verify_widths == "auto":
            self.verify_widths = calibrate_verify_widths(self.model)
        return dict(self.verify_widths or {})

    def verify_width(self, block: int) -> int:
        """Tokens to verify a block of ``block`` tokens as."""
        return block if self.verify_widths is None else self.verify_widths.get(block, block)

    # -- target forward --------------------------------------------------------
    def verify_forward(self, cache, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                       check: bool = True):
        """One verification forward: (float32 logits (n, V), hidden states or None).

        ``check=False`` leaves the NaN / +inf check to the caller (the session folds
        it into the round's one device-to-host read, `check_logits_sum`).

        Raises:
            ValueError: NaN / +inf logits (``check``).
        """
        hidden = bool(self.drafter.needs_target_hidden)
        out = model_forward(self._verify_model, cache, input_ids, mask, positions, hidden)
        logits = out.logits[0].float()
        if check:
            check_logits_sum(float(logits.sum()), logits)
        layers = None
        if hidden:
            layers = tuple(out.hidden_states[i][0] for i in self.drafter.needs_target_hidden)
        return logits, layers

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

    # -- decoding ------------------------------------------------------------------
    def session(self, prompt_ids, max_new_tokens: int = 64, *, stream_index: int = 0,
                on_tokens: Callable[[list[int]], None] | None = None, profile: bool = False) -> DecodeSession:
        """A prefilled `DecodeSession` for one prompt (step it with `drive_round`;
        ``profile`` times each round's phases, see `DecodeSession`).

        Raises:
            ValueError: as `generate`.
        """
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        ids = validate_prompt(prompt_ids, self.vocab_size, self.context_window)
        self._check_sliding_window(int(ids.numel()) + max_new_tokens)
        self.calibrate()                          # "auto" padding: once, before the first prefill
        session = DecodeSession(self, ids, max_new_tokens, stream_index, on_tokens, profile)
        session.prefill()
        return session

    def generate(self, prompt_ids, max_new_tokens: int = 64, *, stream_index: int = 0,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Args:
            prompt_ids: int sequence / tensor (L,) (or (1, L)) of target token ids, L >= 1.
            max_new_tokens: cap on generated tokens (int >= 0).
            stream_index: written into each `RoundRecord`.
            on_tokens: called with the committed token ids after each round
                (streaming).

        Returns:
            `GenerationResult`.

        Raises:
            ValueError: empty prompt, a batch or other non-1-D input, ids outside the
                vocabulary, prompt not fitting the context, max_new_tokens not an
                int >= 0, NaN logits, an invalid proposal.
        """
        session = self.session(prompt_ids, max_new_tokens, stream_index=stream_index, on_tokens=on_tokens)
        while not session.done:
            drive_round(self.policy, session)
        return session.result()
