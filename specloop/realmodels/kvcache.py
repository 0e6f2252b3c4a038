"""KV-cache surgery for speculative decoding: keep only the accepted path.

Works on transformers' ``DynamicCache`` (per-layer ``keys`` / ``values`` of shape
(batch, heads, seq, head_dim)). After a tree verification the cache holds the
prefix, the pending token and *every* drafted node; `keep_positions` retains the
prefix, the pending token and the accepted nodes in sequence order, so the cache
equals the one produced by feeding the committed tokens one at a time (tested).
"""
from __future__ import annotations

import functools

import torch

__all__ = ["cache_length", "crop", "keep_positions", "compact", "cache_tensors", "new_cache",
           "check_tree_attention", "TREE_MASK_ATTENTION"]

#: attention implementations that take the decoder's 4D additive float tree mask as given
TREE_MASK_ATTENTION = ("sdpa", "eager")


def check_tree_attention(model, who: str = "the target model") -> None:
    """Raise ValueError (one line) when ``model``'s attention implementation cannot take
    a 4D additive float mask (flash-attention drops or rejects it, so a tree or a chain
    would be verified with the wrong attention); sdpa and eager can (None = unknown,
    accepted: a model that is not a transformers model)."""
    config = getattr(getattr(model, "_orig_mod", model), "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl is not None and impl not in TREE_MASK_ATTENTION:
        raise ValueError(f"{who} uses attn_implementation={impl!r}, which cannot take the decoder's 4D tree mask; "
                         "load it with attn_implementation=\"sdpa\" (or \"eager\")")


def new_cache():
    """An empty full-attention ``DynamicCache`` (no sliding-window layers)."""
    from transformers import DynamicCache
    return DynamicCache()


def cache_length(cache) -> int:
    """Tokens in the cache (0 for None / empty)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop(cache, length: int) -> None:
    """Keep the first ``length`` positions (in place). Raises ValueError if
    ``length`` is negative or longer than the cache."""
    current = cache_length(cache)
    if not 0 <= length <= current:
        raise ValueError(f"cannot crop a cache of {current} tokens to {length}")
    if length < current:
        cache.crop(length - current)  # transformers 5: a negative count removes tokens


def keep_positions(cache, keep: torch.Tensor) -> None:
    """Keep the cache positions listed in ``keep`` (int64 (m,), increasing), in place.

    A contiguous prefix ``0..m-1`` is a plain crop (no copy)."""
    m = int(keep.shape[0])
    if m == 0:
        raise ValueError("keep_positions: nothing to keep")
    if int(keep[-1]) == m - 1:
        crop(cache, m)
        return
    index: dict = {}                  # one copy of the index per device, not one per layer
    with torch.inference_mode():      # like the forwards that made them (a compiled forward guards on it)
        for layer in cache.layers:
            device = layer.keys.device
            idx = index.get(device)
            if idx is None:
                idx = index[device] = keep.to(device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)


def compact(cache) -> None:
    """Cache tensors with the strides of a fresh tensor of their shape (a crop leaves views
    with the longer cache's strides, on which a compiled forward recompiles; the check is
    on the strides themselves, since ``is_contiguous`` ignores those of size-1 dims)."""
    def dense(x: torch.Tensor) -> torch.Tensor:
        return x if x.stride() == torch.empty(x.shape, device="meta").stride() else \
            torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)
    with torch.inference_mode():
        for layer in cache.layers:
            layer.keys, layer.values = dense(layer.keys), dense(layer.values)


def cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, for tests and debugging."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the cache argument ``cache``; older ``past_key_values``
    (a ``torch.compile``d model is looked through to the module it wraps)."""
    return _cache_kwarg_of(type(getattr(model, "_orig_mod", model)))


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of(model_class) -> str:
    import inspect
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def model_forward(model, cache, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                  output_hidden_states: bool = False, logits_to_keep: int = 0):
    """One forward of a causal LM over ``input_ids`` (int64 (n,)) on top of
    ``cache`` with a float 4D additive ``mask`` (1, 1, n, cache_len + n; None: plain causal) and
    ``positions`` (1, n); returns the transformers output (inference mode).
    ``logits_to_keep`` > 0 computes the LM head on the last that many positions only."""
    device = next(model.parameters()).device
    kwargs = {_cache_kwarg(model): cache}
    if logits_to_keep:
        kwargs["logits_to_keep"] = int(logits_to_keep)
    with torch.inference_mode():
        return model(input_ids=input_ids.reshape(1, -1).to(device), attention_mask=mask,
                     position_ids=positions.to(device), use_cache=True,
                     output_hidden_states=output_hidden_states, **kwargs)


def causal_forward(model, cache, input_ids: torch.Tensor, output_hidden_states: bool = False,
                   logits_to_keep: int = 0):
    """Feed ``input_ids`` (int64 (n,), n >= 1) causally after the cache's tokens.

    No mask is built: the model's own causal masking (from the cache length) is what a
    plain causal forward needs, for every attention implementation (a dense (n, n)
    float mask for a long prompt was memory and time for nothing)."""
    n = int(input_ids.shape[0])
    start = cache_length(cache)
    device = next(model.parameters()).device
    positions = torch.arange(start, start + n, device=device)[None]
    return model_forward(model, cache, input_ids, None, positions, output_hidden_states, logits_to_keep)
