"""The stream recorder: the target's side of a prompt stream, written shard by shard
into a recording folder (`record_stream`, resumable: a killed recording continues from
its first missing shard) and compared with batch-1 decoding afterwards
(`check_batched`). The folder format, the settings and the readers are
`specloop.realmodels.recording`.

One generator for the target's side. Per shard, the continuations come from the
answer-set generator (`specloop.realmodels.answers.generator.generate_greedy`:
continuously batched greedy decoding over a preallocated slot cache, ``batch_size``
slots), and every position's features and top-m from the teacher-forced prefill that
rebuilds a recording from an answer set (`specloop.realmodels.answers.rebuild.
write_shards`: one right-padded causal forward over prompt + continuation per
``batch_size`` rows). So ``specloop stream record`` and ``specloop answers generate``
followed by ``specloop stream record --from-answers`` run the same code and write the
same shards (same settings, same tokens).

Cost. The features come from a second pass over every position (the former recorder
read them off the decode forwards), so a direct recording costs the generation plus
one prefill: on SmolLM2-135M, float32, one thread, 16 ShareGPT prompts (1,494 prompt
tokens), 128 new tokens, batch 8, it recorded 32.9 new tokens/s against the former
recorder's 48.5 (0.68x; 0.60x at 32 new tokens), the same 16 continuations
(`benchmarks/target_side_speed.py`, figures (a) and (e)). Where the answers exist
already, ``--from-answers`` pays the prefill alone.

Exactness. In float32 the recorded continuations equal batch-1 greedy decoding
(`generate_greedy`'s contract; tested here with ragged prompts, EOS mid-batch, RoPE and
absolute-position models). In bfloat16 a row's logits depend on the shapes it was
computed with (CPU GEMM blocking), so a continuation can leave the batch-1 one; the
manifest's ``check`` (`check_batched`) records where a recording diverged.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specloop._folder_lock import folder_lock
from specloop.realmodels.answers.generator import generate_greedy
from specloop.realmodels.answers.rebuild import write_shards
from specloop.realmodels.recording import (RecordSettings, _write_json, check_settings, first_difference,
                                           open_recording, prompts_fingerprint, recording_bytes, redone_note,
                                           vocab_size)

__all__ = ["record_stream", "check_batched"]


def record_stream(target, items, out_dir, settings: RecordSettings, *, check_prompts: int = 4,
                  progress=None) -> dict:
    """Record ``items`` into ``out_dir`` (resumable; see the module docstring).

    Args:
        target: a `LoadedModel` or a bare transformers causal LM with full attention
            (tokenizer-free: the items carry token ids).
        items: `specloop.data.streams.StreamItem` s (``index``, ``dataset``,
            ``prompt_id``, ``ids``) in stream order, ``settings.prompts`` of them.
        out_dir: the recording folder (created). Shards already listed in its manifest
            are kept; a killed recording continues from the first missing shard and
            writes the files an uninterrupted one would.
        settings: `RecordSettings`; an empty ``prompts_sha256`` is filled in from items.
            ``batch_size`` is both the generator's slots and the prefill's rows.
        check_prompts: prompts (spread evenly over the stream) re-decoded batch-1 with
            `SpeculativeDecoder` (k = 0) after the last shard (`check_batched`); 0 = none.
        progress: optional callable(prompts_done, prompts_total): first with the
            prompts already recorded, then as each continuation finishes.

    Returns:
        the manifest (dict), as written; plus ``redone`` (`recording.redone_note`) when
        listed shards were missing or damaged (size / sha256) and were recorded again.

    Raises:
        ValueError: item count or prompt fingerprint differ from ``settings``; the
            folder was recorded with other settings (`check_settings`); a layer index
            outside the model; top_m above the vocabulary; a prompt plus
            max_new_tokens beyond the context window, a sliding-window target
            (`generate_greedy`); `FolderInUseError` (a ValueError) when another live
            process is recording into the folder.
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
    if settings.top_m > vocab_size(model):
        raise ValueError(f"top_m {settings.top_m} exceeds the vocabulary ({vocab_size(model)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, settings)
    eos = eos_ids_of(model, target.tokenizer if isinstance(target, LoadedModel) else None)
    with folder_lock(out):                          # one recorder per folder
        return _record_shards(target, model, items, out, settings, eos, check_prompts, progress)


def _generated_records(model, items, settings: RecordSettings, eos, counted) -> list[dict]:
    """The greedy continuations of ``items`` (`generate_greedy`, ``batch_size`` slots) as
    `write_shards` records; ``counted()`` after each finished continuation."""
    answers = generate_greedy(model, [list(it.ids) for it in items], settings.max_new_tokens, eos,
                              batch_size=settings.batch_size, on_answer=lambda answer: counted())
    return [{"prompt": list(it.ids), "answer": list(a.tokens), "stop_reason": a.stop_reason,
             "dataset": it.dataset, "prompt_id": it.prompt_id} for it, a in zip(items, answers)]


def _record_shards(target, model, items, out: Path, settings: RecordSettings, eos, check_prompts: int,
                   progress) -> dict:
    """`record_stream`'s missing shards (`write_shards`), then the batch-1 check."""
    total, done = len(items), [0]

    def report(prompts_done: int, prompts_total: int) -> None:
        done[0] = prompts_done
        if progress is not None:
            progress(prompts_done, prompts_total)

    def counted() -> None:
        report(done[0] + 1, total)

    manifest, redo = write_shards(
        model, out, settings, eos,
        lambda first, count: _generated_records(model, items[first:first + count], settings, eos, counted),
        progress=report)
    if check_prompts and "check" not in manifest:
        indices = _sample_indices(total, check_prompts)
        manifest["check"] = check_batched(target, out, indices, eos)
        _write_json(out / "manifest.json", manifest)
        manifest["total_bytes"] = recording_bytes(out)
        _write_json(out / "manifest.json", manifest)
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
