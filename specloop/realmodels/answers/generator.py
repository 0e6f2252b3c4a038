"""Batched greedy generation for the target's side, with continuous batching.

The target's greedy continuation of a prompt does not depend on the draft, so the
target's side of an experiment (answer sets to train heads on, the continuations a
stream recording replays) is plain greedy decoding of many prompts. `generate_greedy`
does it with a batch that stays full:

* **Slots.** B rows share one preallocated KV buffer per layer (`SlotCache`: keys and
  values of shape (B, kv_heads, S_max, head_dim), S_max = the longest prompt plus
  ``max_new_tokens``), so no step concatenates. Row b holds its own sequence at
  positions 0..n_b - 1 (right-padded, no left padding); a decode step writes each
  row's new key / value at its own position n_b (one indexed write per layer), reads
  the first W = max_b n_b + 1 positions of every row, and a float additive mask
  (B, 1, 1, W) hides each row's unused tail. Position ids are the rows' own lengths.
* **Continuous batching.** A row that stops (EOS, included in the answer, or its cap)
  frees its slot at once, and the next prompt of the queue is prefilled into it: the
  prefix (all but the last token) in one batch-1 causal forward with its own cache
  (no compute on padding; as `DecodeSession.prefill`), copied into the slot; its
  last token is fed by the next batched step, as batch-1 decoding feeds it. When the
  queue is empty and fewer than half the slots are busy, the cache is compacted to the
  busy rows (one copy), so the tail of a run costs what its rows need.
* **Length buckets.** The queue is ordered by prompt length (longest first, ties by
  input order), so rows that decode together have similar lengths and W stays close
  to each row's own length. Results are returned in input order whatever the order
  of work.

Exactness. In float32 the continuations equal batch-1 greedy decoding
(`SpeculativeDecoder` with no draft and k = 0) token for token (tested with ragged
prompts, EOS mid-batch and slot reuse; GEMM rounding does not change an argmax at
float32 precision in practice, and the test would show it if it did). In bfloat16 a
row's logits depend on the shapes it was computed with (CPU GEMM blocking), so a
continuation can leave the batch-1 one; the answer sets record the dtype, and
`specloop answers check` measures where a set diverged from batch-1 decoding.

Not compiled. ``torch.compile(dynamic=True)`` of the target's forward was measured on a
quiet machine (`benchmarks/generator_compile.py`, SmolLM2-135M bfloat16, one thread, 32
prompts x 128 tokens, batch 32): 0.68x eager (74.8 against 110.4 new tokens/s) after 160 s
of compilation, and it moved 26 of the 32 bfloat16 continuations; the width W changes
every step, which the compiled graph pays for in guards and symbolic shapes.

Ties: ``argmax`` takes the lowest token id among equal logits (torch's rule), as the
decoder's greedy verifier does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["GreedyAnswer", "SlotCache", "generate_greedy", "length_order"]


@dataclass(frozen=True)
class GreedyAnswer:
    """One prompt's greedy continuation.

    Attributes:
        index: the prompt's position in the input list.
        tokens: the continuation's token ids (EOS included when it stopped at EOS).
        stop_reason: "eos" or "length".
    """

    index: int
    tokens: tuple[int, ...]
    stop_reason: str


class _SlotLayer(CacheLayerMixin):
    """One layer of a `SlotCache`: preallocated keys / values (B, kv_heads, S_max, D)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "SlotCache"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states, value_states) -> None:      # buffers come from the owner
        raise RuntimeError("a SlotCache layer is allocated by SlotCache.allocate")

    def update(self, key_states, value_states, *args, **kwargs):
        """Write each row's new key / value (B, kv_heads, 1, D) at the row's own write
        position and return the first ``owner.width`` positions of every row."""
        rows, positions = self.owner.rows, self.owner.write_positions
        self.keys[rows, :, positions] = key_states[:, :, 0]
        self.values[rows, :, positions] = value_states[:, :, 0]
        width = self.owner.width
        return self.keys[:, :, :width], self.values[:, :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        return self.owner.width - 1

    def get_max_length(self) -> int:
        return int(self.keys.shape[2])


class SlotCache(Cache):
    """A KV cache of B slots, each holding one sequence at positions 0..n_b - 1.

    The generator sets ``write_positions`` (int64 (B,), each row's current length n_b)
    and ``width`` (max n_b + 1) before every decode forward; each layer's ``update``
    writes the rows' new entries there and returns the first ``width`` positions.
    Only single-token decode steps go through it (prefills use their own cache and are
    copied in with `load_slot`).
    """

    def __init__(self, num_layers: int):
        layers = [None] * num_layers
        super().__init__(layers=layers)
        self.layers = [_SlotLayer(self) for _ in range(num_layers)]
        self.rows = torch.zeros(0, dtype=torch.long)
        self.write_positions = torch.zeros(0, dtype=torch.long)
        self.width = 1

    def allocate(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        """Zeroed buffers (batch, kv_heads, max_len, head_dim) for every layer."""
        for layer in self.layers:
            layer.keys = torch.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype, device=device)
            layer.values = torch.zeros_like(layer.keys)
            layer.is_initialized = True
        self.rows = torch.arange(batch, device=device)

    def load_slot(self, slot: int, prefill_cache) -> None:
        """Copy a batch-1 cache of n positions into positions 0..n - 1 of ``slot``."""
        for mine, theirs in zip(self.layers, prefill_cache.layers):
            n = theirs.keys.shape[2]
            mine.keys[slot, :, :n] = theirs.keys[0]
            mine.values[slot, :, :n] = theirs.values[0]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the slots ``rows`` (int64 (B',), a copy per layer)."""
        for layer in self.layers:
            layer.keys = layer.keys.index_select(0, rows).contiguous()
            layer.values = layer.values.index_select(0, rows).contiguous()
        self.rows = torch.arange(int(rows.shape[0]), device=rows.device)


def length_order(lengths: list[int]) -> list[int]:
    """Input indices ordered by decreasing length (ties by input order)."""
    return sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))


def _kv_shape(model) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers decoder config."""
    config = model.config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return int(config.num_hidden_layers), kv_heads, head_dim


def _prefill_prefix(model, prefix: list[int]):
    """Batch-1 causal forward of ``prefix`` into a fresh cache (None for an empty one)."""
    from specloop.realmodels.kvcache import causal_forward, new_cache
    if not prefix:
        return None
    cache = new_cache()
    device = next(model.parameters()).device
    out = causal_forward(model, cache, torch.tensor(prefix, dtype=torch.long, device=device), logits_to_keep=1)
    if not torch.isfinite(out.logits).all():
        raise ValueError("the target produced non-finite logits")
    return cache


def _check_inputs(model, prompts, max_new_tokens: int, batch_size: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate_greedy needs a non-empty list of non-empty prompts")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    window = int(getattr(model.config, "max_position_embeddings", 1 << 30) or (1 << 30))
    longest = max(len(p) for p in prompts) + int(max_new_tokens)
    if longest > window:
        raise ValueError(f"a prompt of {longest - int(max_new_tokens)} tokens plus max_new_tokens "
                         f"{max_new_tokens} exceeds the target's context window ({window})")
    if getattr(model.config, "sliding_window", None) and getattr(model.config, "use_sliding_window", True) \
            and any(t == "sliding_attention" for t in (getattr(model.config, "layer_types", None) or [])):
        raise ValueError("generate_greedy supports full-attention targets only (this one has sliding-window layers)")


class _Batch:
    """The slots' state: which prompt each holds, its length, pending token, output."""

    def __init__(self, slots: int):
        self.prompt = [-1] * slots          # input index held by each slot (-1: free)
        self.length = [0] * slots           # positions in the slot's cache
        self.pending = [0] * slots          # the token the next step feeds
        self.out: list[list[int]] = [[] for _ in range(slots)]

    def busy(self) -> list[int]:
        return [s for s, p in enumerate(self.prompt) if p >= 0]


def generate_greedy(model, prompts: list[list[int]], max_new_tokens: int, eos_ids: Iterable[int], *,
                    batch_size: int = 32, on_answer: Callable[[GreedyAnswer], None] | None = None,
                    ) -> list[GreedyAnswer]:
    """Greedy continuations of ``prompts``, continuously batched (see the module docstring).

    Args:
        model: a transformers causal LM with full attention (eval mode), any dtype / device.
        prompts: token-id lists, each non-empty.
        max_new_tokens: the cap per answer (>= 1); EOS stops earlier and is kept.
        eos_ids: token ids that end an answer.
        batch_size: slots (rows per decode forward), >= 1.
        on_answer: called with each `GreedyAnswer` as it finishes (in finishing order).

    Returns:
        one `GreedyAnswer` per prompt, in input order.

    Raises:
        ValueError: empty input or prompt, max_new_tokens / batch_size < 1, a prompt
            plus max_new_tokens beyond the context window, a sliding-window target,
            non-finite logits.
    """
    _check_inputs(model, prompts, max_new_tokens, batch_size)
    eos, cap = {int(e) for e in eos_ids}, int(max_new_tokens)
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    queue = length_order([len(p) for p in prompts])
    slots = min(int(batch_size), len(prompts))
    layers, kv_heads, head_dim = _kv_shape(model)
    cache = SlotCache(layers)
    max_len = max(len(p) for p in prompts) + cap
    cache.allocate(slots, kv_heads, max_len, head_dim, dtype, device)
    state, answers = _Batch(slots), {}
    next_in_queue = 0

    def fill(slot: int) -> None:
        nonlocal next_in_queue
        index = queue[next_in_queue]
        next_in_queue += 1
        prompt = [int(t) for t in prompts[index]]
        prefill = _prefill_prefix(model, prompt[:-1])
        if prefill is not None:
            cache.load_slot(slot, prefill)
        state.prompt[slot], state.length[slot] = index, len(prompt) - 1
        state.pending[slot], state.out[slot] = prompt[-1], []

    for slot in range(slots):
        fill(slot)
    min_value = torch.finfo(dtype).min
    with torch.inference_mode():
        while True:
            busy = state.busy()
            if not busy:
                break
            if next_in_queue >= len(queue) and len(busy) * 2 <= len(state.prompt) and len(busy) < len(state.prompt):
                _compact(cache, state, busy, device)
                continue
            lengths = torch.tensor(state.length, dtype=torch.long)
            width = int(lengths.max()) + 1
            cache.write_positions, cache.width = lengths.to(device), width
            mask = torch.where(torch.arange(width)[None, :] <= lengths[:, None], 0.0, min_value)
            mask = mask.to(dtype=dtype, device=device)[:, None, None, :]
            ids = torch.tensor(state.pending, dtype=torch.long, device=device)[:, None]
            out = _decode_forward(model, cache, ids, mask, lengths[:, None].to(device))
            logits = out.logits[:, -1].float()
            if not torch.isfinite(logits[busy]).all():
                raise ValueError("the target produced non-finite logits")
            chosen = logits.argmax(-1).tolist()
            for slot in busy:
                state.length[slot] += 1
                token = int(chosen[slot])
                state.out[slot].append(token)
                state.pending[slot] = token
                if token in eos or len(state.out[slot]) >= cap:
                    answer = GreedyAnswer(state.prompt[slot], tuple(state.out[slot]),
                                          "eos" if token in eos else "length")
                    answers[answer.index] = answer
                    if on_answer is not None:
                        on_answer(answer)
                    state.prompt[slot] = -1
                    if next_in_queue < len(queue):
                        fill(slot)
            _park_free_slots(state)
    return [answers[i] for i in range(len(prompts))]


def _park_free_slots(state: _Batch) -> None:
    """Free slots keep decoding a dummy token at position 0 (their output is never
    read; writing there keeps every write inside the buffer)."""
    for slot, index in enumerate(state.prompt):
        if index < 0:
            state.length[slot], state.pending[slot] = 0, 0


def _compact(cache: SlotCache, state: _Batch, busy: list[int], device) -> None:
    """Shrink the batch to the busy slots (queue empty, at most half the slots busy)."""
    cache.keep_rows(torch.tensor(busy, dtype=torch.long, device=device))
    for name in ("prompt", "length", "pending", "out"):
        values = getattr(state, name)
        setattr(state, name, [values[s] for s in busy])


def _decode_forward(model, cache: SlotCache, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
    """One batched single-token forward through the slot cache."""
    from specloop.realmodels.kvcache import _cache_kwarg
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                 logits_to_keep=1, **{_cache_kwarg(model): cache})


def throughput(answers: list[GreedyAnswer], seconds: float) -> float:
    """New tokens per second of a run."""
    return sum(len(a.tokens) for a in answers) / seconds if seconds > 0 else float("nan")

