"""The stream recorder: batched greedy generation of a prompt stream's target side
(`generate_batch`), written shard by shard into a recording folder (`record_stream`,
resumable: a killed recording continues from its first missing shard) and compared
with batch-1 decoding afterwards (`check_batched`). The folder format, the settings
and the readers are `specloop.realmodels.recording`.

Generation (`generate_batch`) follows batch-1 decoding (`DecodeSession`): each
prompt's prefix (all but its last token) is prefilled alone in one forward (up to
`PREFILL_CHUNK` positions; no compute goes to padding), the B caches are merged left-
padded into one, then one forward per step feeds every unfinished row's pending token
(the prompt's last token, then each greedy token); a float 4D additive attention mask
hides the padding (a query always sees itself, so no softmax row is empty) and
position ids count real tokens only (a prompt's first token is at position 0, as in
batch-1 decoding). The hidden states and the top-m distribution of a position come
from the same forward that feeds its token, so every position (prompt and
continuation, the last generated token included) is covered without a second pass. A
row stops at EOS (included) or after ``max_new_tokens`` tokens and leaves the batch
once its last token has been fed (``DynamicCache.batch_select_indices``).

Exactness. In float32 the batched continuation equals batch-1 greedy decoding (tested
with ragged prompts, RoPE and absolute-position models; 16/16 SmolLM2 prompts x 64
tokens in `benchmarks/stream_record_speed.py`). In bfloat16 a row's logits depend on
the batch's shape (CPU GEMM rounding), so batched continuations can leave the batch-1
ones (SmolLM2, batch 8: 5 of 16 prompts, first difference at token 0..33), while batch
size 1 reproduces `SpeculativeDecoder` (k = 0) exactly; the manifest's ``check``
records where a recording diverged.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from specloop._folder_lock import folder_lock
from specloop.realmodels.recording import (FORMAT_NAME, FORMAT_VERSION, RecordSettings, _shard_arrays, _write_json,
                                           _write_npz, check_settings, first_difference, layer_name, open_recording,
                                           prompts_fingerprint, recording_bytes, redone_note, resume_manifest,
                                           shard_name)

__all__ = ["PREFILL_CHUNK", "generate_batch", "record_stream", "check_batched"]

PREFILL_CHUNK = 2048           # prompt positions per prefill forward (bounds the logits' memory)


_FEATURE_DTYPES = {"float16": torch.float16, "float32": torch.float32}


# -- batched greedy generation --------------------------------------------------------
def _batch_mask(valid: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Float additive mask (B, 1, n, S) for the last n of S cached positions:
    causal over valid (non-pad) keys; a query also always sees itself."""
    total = valid.shape[1]
    query = torch.arange(total - n, total)[:, None]
    key = torch.arange(total)[None, :]
    visible = (valid[:, None, :] & (key <= query)[None]) | (key == query)[None]
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


@torch.inference_mode()
def _step(model, cache, ids: torch.Tensor, valid: torch.Tensor, layers, top_m: int,
          store: torch.dtype = torch.float16):
    """Feed ids (B, n) whose key validity is the last n columns of ``valid`` (B, S).
    Returns (hidden: list of ``store`` (B, n, H), top ids int32 (B, n, m),
    top probs ``store`` (B, n, m), argmax int64 (B, n))."""
    from specloop.realmodels.kvcache import _cache_kwarg
    param = next(model.parameters())
    n = ids.shape[1]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)[:, -n:]
    mask = _batch_mask(valid, n, param.dtype).to(param.device)
    out = model(input_ids=ids.to(param.device), attention_mask=mask, position_ids=positions.to(param.device),
                use_cache=True, output_hidden_states=True, **{_cache_kwarg(model): cache})
    logits = out.logits.float()
    if not torch.isfinite(logits).all():
        raise ValueError("the target produced non-finite logits")
    top = torch.topk(torch.softmax(logits, dim=-1), top_m, dim=-1)
    hidden = [out.hidden_states[layer].to(store).cpu() for layer in layers]
    return hidden, top.indices.to(torch.int32).cpu(), top.values.to(store).cpu(), \
        logits.max(-1).indices.cpu()


def _prefill(model, prefix: list[int], layers, top_m: int, store: torch.dtype = torch.float16):
    """Feed a prompt's prefix (all but its last token) into a fresh batch-1 cache, in one
    forward per `PREFILL_CHUNK` positions (as `DecodeSession.prefill` does).
    Returns (cache or None for an empty prefix, per-chunk (hidden list, top ids, top probs))."""
    from specloop.realmodels.kvcache import new_cache
    if not prefix:
        return None, []
    cache, ids, parts = new_cache(), torch.tensor([prefix], dtype=torch.long), []
    valid = torch.ones((1, len(prefix)), dtype=torch.bool)
    for start in range(0, len(prefix), PREFILL_CHUNK):
        stop = min(start + PREFILL_CHUNK, len(prefix))
        hidden, top_ids, top_probs, _ = _step(model, cache, ids[:, start:stop], valid[:, :stop], layers, top_m,
                                              store)
        parts.append(([h[0] for h in hidden], top_ids[0], top_probs[0]))
    return cache, parts


def _merge_caches(caches, lengths: list[int]):
    """Batch-1 caches of ``lengths`` tokens (None for 0) -> one left-padded batch
    cache (zeros at the padding, which the mask hides)."""
    from transformers import DynamicCache

    from specloop.realmodels.kvcache import new_cache
    template = next((c for c in caches if c is not None), None)
    if template is None:
        return new_cache()
    width, merged = max(lengths), []
    for layer in range(len(template.layers)):
        shape = template.layers[layer].keys.shape
        keys, values = [], []
        for cache, n in zip(caches, lengths):
            if cache is None:
                k = v = template.layers[layer].keys.new_zeros((1, shape[1], 0, shape[3]))
            else:
                k, v = cache.layers[layer].keys, cache.layers[layer].values
            keys.append(torch.nn.functional.pad(k, (0, 0, width - n, 0)))
            values.append(torch.nn.functional.pad(v, (0, 0, width - n, 0)))
        merged.append((torch.cat(keys), torch.cat(values)))
    return DynamicCache(ddp_cache_data=merged)


def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, eos_ids, layers, top_m: int,
                   feature_dtype: str = "float16") -> list[dict]:
    """Greedy continuations of a batch of prompts and every position's features.

    As batch-1 decoding (`DecodeSession`): each prompt's prefix (all but the last
    token) is prefilled alone (no compute on padding); the caches are merged
    left-padded; then every step feeds each unfinished row's pending token (first the
    prompt's last token, then each greedy token) in one forward; a row whose final
    token has been fed leaves the batch.

    Args:
        model: a transformers causal LM (eval mode). prompts: B token-id lists, each
            non-empty. max_new_tokens: >= 1. eos_ids: ints that end a continuation.
        layers: ``hidden_states`` indices to keep. top_m: tokens of p_target kept.
        feature_dtype: "float16" (default) or "float32": how features and top-m
            probabilities are stored.

    Returns:
        per prompt a dict: ``tokens`` int32 (L + T,), ``new_tokens`` int (T),
        ``stop_reason`` ("eos" / "length"), ``hidden`` list of float16 (L + T, H) per
        layer, ``topm_ids`` int32 (L + T, m), ``topm_probs`` float16 (L + T, m).

    Raises:
        ValueError: empty batch or prompt, max_new_tokens < 1, non-finite logits.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate_batch needs a non-empty batch of non-empty prompts")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    eos, lengths = {int(e) for e in eos_ids}, [len(p) - 1 for p in prompts]
    store = _FEATURE_DTYPES[feature_dtype]
    prefilled = [_prefill(model, list(p[:-1]), layers, top_m, store) for p in prompts]
    parts = [list(chunks) for _, chunks in prefilled]
    cache = _merge_caches([c for c, _ in prefilled], lengths)
    width = max(lengths)
    valid = torch.tensor([[i >= width - n for i in range(width)] for n in lengths], dtype=torch.bool)
    valid = valid.reshape(len(prompts), width)
    pending = [int(p[-1]) for p in prompts]
    generated: list[list[int]] = [[] for _ in prompts]
    finished = [False] * len(prompts)
    active = list(range(len(prompts)))
    while active:                    # every active row has a pending token to feed
        step_ids = torch.tensor([[pending[r]] for r in active], dtype=torch.long)
        valid = torch.cat([valid, torch.ones((len(active), 1), dtype=torch.bool)], dim=1)
        hidden, top_ids, top_probs, argmax = _step(model, cache, step_ids, valid, layers, top_m, store)
        keep = []
        for i, r in enumerate(active):
            parts[r].append(([h[i] for h in hidden], top_ids[i], top_probs[i]))
            if finished[r]:
                continue                                     # its final token is fed: leaves the batch
            pending[r] = int(argmax[i, -1])
            generated[r].append(pending[r])
            finished[r] = pending[r] in eos or len(generated[r]) >= max_new_tokens
            keep.append(i)
        if 0 < len(keep) < len(active):
            cache.batch_select_indices(torch.tensor(keep))
            valid = valid[keep]
        active = [active[i] for i in keep]
    out = []
    for row, prompt in enumerate(prompts):
        chunks = parts[row]
        out.append({
            "tokens": np.asarray(list(prompt) + generated[row], dtype=np.int32),
            "new_tokens": len(generated[row]),
            "stop_reason": "eos" if generated[row][-1] in eos else "length",
            "hidden": [torch.cat([c[0][i] for c in chunks]).numpy() for i in range(len(layers))],
            "topm_ids": torch.cat([c[1] for c in chunks]).numpy(),
            "topm_probs": torch.cat([c[2] for c in chunks]).numpy()})
    return out


# -- the recorder ---------------------------------------------------------------------
def _vocab_size(model) -> int:
    """Rows of the LM head (the logits' width), else ``config.vocab_size``."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def _model_info(model, eos) -> dict:
    config = model.config
    return {"vocab_size": _vocab_size(model),
            "hidden_size": int(config.hidden_size), "num_hidden_layers": int(config.num_hidden_layers),
            "eos_ids": sorted(int(e) for e in eos)}


def _new_manifest(settings: RecordSettings, model, eos) -> dict:
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "settings": settings.to_dict(),
            "model": _model_info(model, eos), "layer_names": {str(x): layer_name(x) for x in settings.layers},
            "shards": [], "complete": False, "total_bytes": 0}


def record_stream(target, items, out_dir, settings: RecordSettings, *, check_prompts: int = 4,
                  progress=None) -> dict:
    """Record ``items`` into ``out_dir`` (resumable; see the module docstring's format).

    Args:
        target: a `LoadedModel` or a bare transformers causal LM (tokenizer-free: the
            items carry token ids).
        items: `specloop.data.streams.StreamItem` s (``index``, ``dataset``,
            ``prompt_id``, ``ids``) in stream order, ``settings.prompts`` of them.
        out_dir: the recording folder (created). Shards already listed in its manifest
            are kept; a killed recording continues from the first missing shard and
            writes the files an uninterrupted one would.
        settings: `RecordSettings`; an empty ``prompts_sha256`` is filled in from items.
        check_prompts: prompts (spread evenly over the stream) re-decoded batch-1 with
            `SpeculativeDecoder` (k = 0) after the last shard (`check_batched`); 0 = none.
        progress: optional callable(prompts_done, prompts_total) after each batch.

    Returns:
        the manifest (dict), as written; plus ``redone`` (`recording.redone_note`) when
        listed shards were missing or damaged (size / sha256) and were recorded again.

    Raises:
        ValueError: item count or prompt fingerprint differ from ``settings``; the
            folder was recorded with other settings (`check_settings`); a layer index
            outside the model; top_m above the vocabulary; `FolderInUseError` (a
            ValueError) when another live process is recording into the folder.
    """
    import dataclasses

    from specloop.realmodels.decoder import eos_ids_of
    from specloop.realmodels.loading import LoadedModel
    model = target.model if isinstance(target, LoadedModel) else target     # (a CausalLM has .model too)
    items = list(items)
    if len(items) != settings.prompts:
        raise ValueError(f"settings ask for {settings.prompts} prompts, got {len(items)} items")
    fingerprint = prompts_fingerprint(it.ids for it in items)
    if not settings.prompts_sha256:
        settings = dataclasses.replace(settings, prompts_sha256=fingerprint)
    elif settings.prompts_sha256 != fingerprint:
        raise ValueError("the items' token ids do not match settings.prompts_sha256")
    n_layers = int(model.config.num_hidden_layers)
    if any(not -n_layers - 1 <= x <= n_layers for x in settings.layers):
        raise ValueError(f"layers {settings.layers} outside the target's hidden_states (0..{n_layers})")
    info_vocab = _vocab_size(model)
    if settings.top_m > info_vocab:
        raise ValueError(f"top_m {settings.top_m} exceeds the vocabulary ({info_vocab})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, settings)
    eos = eos_ids_of(model, target.tokenizer if isinstance(target, LoadedModel) else None)
    with folder_lock(out):                          # one recorder per folder
        return _record_shards(target, model, items, out, settings, eos, check_prompts, progress)


def _record_shards(target, model, items, out: Path, settings: RecordSettings, eos, check_prompts: int,
                   progress) -> dict:
    """`record_stream`'s loop over the missing shards, then the batch-1 check."""
    path = out / "manifest.json"
    manifest, redo = resume_manifest(out, lambda: _new_manifest(settings, model, eos))
    done = {s["file"] for s in manifest["shards"]}
    size, total = settings.shard_size, len(items)
    prompts_done = sum(s["prompts"] for s in manifest["shards"])
    if progress is not None:
        progress(prompts_done, total)
    for number, first in enumerate(range(0, total, size)):
        if shard_name(number) in done:
            continue
        shard_items, results, t0 = items[first:first + size], [], time.perf_counter()
        for b in range(0, len(shard_items), settings.batch_size):
            batch = shard_items[b:b + settings.batch_size]
            results += generate_batch(model, [list(it.ids) for it in batch], settings.max_new_tokens, eos,
                                      settings.layers, settings.top_m, settings.feature_dtype)
            prompts_done += len(batch)
            if progress is not None:
                progress(prompts_done, total)
        arrays = _shard_arrays(shard_items, results, settings.layers, np.dtype(settings.feature_dtype))
        written = _write_npz(out / shard_name(number), arrays)
        manifest["shards"].append({"file": shard_name(number), "first_index": first, "prompts": len(shard_items),
                                   "positions": int(arrays["tokens"].size),
                                   "new_tokens": int(arrays["new_tokens"].sum()), **written,
                                   "seconds": time.perf_counter() - t0})
        manifest["shards"].sort(key=lambda s: s["first_index"])
        manifest["total_bytes"] = recording_bytes(out)
        _write_json(path, manifest)
    manifest["complete"] = True
    if check_prompts and "check" not in manifest:
        indices = _sample_indices(total, check_prompts)
        manifest["check"] = check_batched(target, out, indices, eos)
    _write_json(path, manifest)
    manifest["total_bytes"] = recording_bytes(out)
    _write_json(path, manifest)
    return {**manifest, "redone": redone_note(redo, manifest)} if redo else manifest


def _sample_indices(total: int, count: int) -> list[int]:
    """``count`` stream indices spread evenly over ``range(total)`` (unique, ascending)."""
    return sorted({int(round(x)) for x in np.linspace(0, total - 1, min(int(count), total))})


def check_batched(target, out_dir, stream_indices, eos_ids=None) -> dict:
    """Re-decode recorded prompts one at a time and compare with the recording.

    Batch-1 greedy decoding is `SpeculativeDecoder` with no draft and k = 0 (the
    decoder's own prefill, cache and EOS handling), ``max_new_tokens`` of the recording.

    Returns:
        {"stream_indices": [..], "matching": int, "divergent": [{"stream_index",
        "first_diff" (index into the continuation of the first differing token, or
        the shorter length when one is a prefix of the other)}]}.
    """
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.loading import LoadedModel
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.drafters.base import NoDraft
    recording = open_recording(out_dir)
    loaded = target if isinstance(target, LoadedModel) else LoadedModel(target, None, "target", "stream-record")
    eos = recording.manifest["model"]["eos_ids"] if eos_ids is None else sorted(int(e) for e in eos_ids)
    decoder = SpeculativeDecoder(loaded, NoDraft(), policy=FixedDraftPolicy(0), eos_token_id=eos, seed=0)
    max_new = int(recording.settings["max_new_tokens"])
    divergent = []
    for index in stream_indices:
        rec = recording.prompt(int(index))
        prompt = torch.tensor(rec["tokens"][:rec["prompt_length"]], dtype=torch.long)
        batch1 = decoder.generate(prompt, max_new).new_tokens
        recorded = rec["tokens"][rec["prompt_length"]:].tolist()
        if batch1 != recorded:
            divergent.append({"stream_index": int(index), "first_diff": first_difference(batch1, recorded)})
    return {"stream_indices": [int(i) for i in stream_indices], "matching": len(stream_indices) - len(divergent),
            "divergent": divergent}
