"""A stream recording's features by teacher-forced prefill: rebuilt from an answer set
(`rebuild_recording`), and written for the direct recorder too (`write_shards`).

A recording (`specloop.realmodels.recording`) holds, at every position of every
prompt and its greedy continuation, the hidden states the draft heads read and the
target's top-m next-token distribution. Given the continuation, all of that comes from
one causal forward over prompt + answer: no generation. Rows are batched right-padded
(a causal row never sees the padding after it), longest first, ``batch_size`` rows per
forward.

`write_shards` is the one shard loop of both recorders: `rebuild_recording` feeds it
the answer set's continuations, `specloop stream record`
(`specloop.realmodels.streams.record.record_stream`) the continuations it generates per
shard with `specloop.realmodels.answers.generator.generate_greedy`. So a recording
rebuilt from an answer set and a direct one with the same continuations and settings
hold the same features (the rebuilt one's ``batch_size`` is the rebuild's).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from specloop._folder_lock import folder_lock

__all__ = ["rebuild_recording", "write_shards", "shard_results"]


_HEAD_CHUNK = 256             # positions per LM-head chunk (bounds the (chunk, V) float32 logits)


def _plain_head(model) -> bool:
    """Whether logits are exactly ``lm_head(last hidden state)`` (no soft-capping or scale),
    so the body and the head can run apart."""
    config = model.config
    return (getattr(model, "lm_head", None) is not None and hasattr(model, "base_model")
            and model.base_model is not model and not getattr(config, "final_logit_softcapping", None)
            and getattr(config, "logit_scale", None) in (None, 1.0))


def _top_m(model, hidden: torch.Tensor, logits, top_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-m ids and probabilities of (n, V) logits, or of ``lm_head(hidden)`` by chunks of
    `_HEAD_CHUNK` positions: probabilities are exp(logit - logsumexp) in float32, so no
    (n, V) softmax is materialised."""
    ids, probs = [], []
    for start in range(0, hidden.shape[0], _HEAD_CHUNK):
        chunk = (model.lm_head(hidden[start:start + _HEAD_CHUNK]) if logits is None
                 else logits[start:start + _HEAD_CHUNK]).float()
        if not torch.isfinite(chunk).all():
            raise ValueError("the target produced non-finite logits")
        top = torch.topk(chunk, top_m, dim=-1)
        ids.append(top.indices)
        probs.append(torch.exp(top.values - torch.logsumexp(chunk, dim=-1, keepdim=True)))
    return torch.cat(ids), torch.cat(probs)


@torch.inference_mode()
def _teacher_forced(model, sequences: list[list[int]], layers, top_m: int, store: torch.dtype) -> list[dict]:
    """Hidden states (per layer, (n, H)), top-m ids (n, m) and probs (n, m) of each
    sequence, from one right-padded batched forward (the LM head runs on real positions
    only, by chunks, where the model's logits are a plain head over the last hidden state)."""
    device = next(model.parameters()).device
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, :len(seq)] = 1
    plain = _plain_head(model)
    forward = model.base_model if plain else model
    out = forward(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False,
                  output_hidden_states=True)
    results = []
    for row, seq in enumerate(sequences):
        n = len(seq)
        last = out.last_hidden_state[row, :n] if plain else None
        top_ids, top_probs = _top_m(model, last, None if plain else out.logits[row, :n], top_m)
        results.append({"hidden": [out.hidden_states[layer][row, :n].to(store).cpu().numpy() for layer in layers],
                        "topm_ids": top_ids.to(torch.int32).cpu().numpy(),
                        "topm_probs": top_probs.to(store).cpu().numpy()})
    return results


def shard_results(model, records: list[dict], settings) -> list[dict]:
    """Every position's features and top-m of a shard's prompts + continuations.

    Args:
        model: a transformers causal LM (eval mode).
        records: per prompt ``prompt`` and ``answer`` (int sequences: the prompt's ids,
            its continuation) and ``stop_reason``.
        settings: a `RecordSettings` (``layers``, ``top_m``, ``batch_size`` rows per
            forward, ``feature_dtype``).

    Returns:
        per record, in input order, the dict `recording._shard_arrays` reads:
        ``tokens`` int32 (L + T,), ``new_tokens`` (T), ``stop_reason``, ``hidden``
        (per layer (L + T, H)), ``topm_ids`` int32 (L + T, m), ``topm_probs`` (L + T, m)
        in ``feature_dtype``.

    Raises:
        ValueError: non-finite logits.
    """
    store = {"float16": torch.float16, "float32": torch.float32}[settings.feature_dtype]
    seqs = [[int(t) for t in r["prompt"]] + [int(t) for t in r["answer"]] for r in records]
    results: list[dict | None] = [None] * len(records)
    order = sorted(range(len(records)), key=lambda j: -len(seqs[j]))
    for b in range(0, len(order), settings.batch_size):
        rows = order[b:b + settings.batch_size]
        for j, feats in zip(rows, _teacher_forced(model, [seqs[j] for j in rows], settings.layers,
                                                  settings.top_m, store)):
            results[j] = {**feats, "tokens": np.asarray(seqs[j], dtype=np.int32),
                          "new_tokens": len(records[j]["answer"]), "stop_reason": records[j]["stop_reason"]}
    return results


def write_shards(model, out: Path, settings, eos, shard_records, *, extra: dict | None = None,
                 progress=None) -> tuple[dict, dict]:
    """Write the recording's missing shards into ``out`` (the caller holds its lock).

    Args:
        model: a transformers causal LM. out: the recording folder. settings: its
            `RecordSettings` (``prompts`` in all). eos: the continuations' EOS ids.
        shard_records: callable(first, count) -> the records of stream indices
            first .. first + count - 1: per prompt ``prompt``, ``answer``,
            ``stop_reason``, ``dataset``, ``prompt_id`` (called only for missing shards).
        extra: keys added to a new manifest (e.g. ``answers``).
        progress: optional callable(prompts_done, prompts_total), first with the
            prompts already recorded, then after each shard.

    Returns:
        (manifest, redo): the manifest as written (``complete`` true) and
        `recording.resume_manifest`'s shards that were missing or damaged and were
        recorded again.
    """
    from types import SimpleNamespace

    from specloop.realmodels.recording import (_shard_arrays, _write_json, _write_npz, new_manifest,
                                               recording_bytes, resume_manifest, shard_name)
    path = out / "manifest.json"
    manifest, redo = resume_manifest(out, lambda: {**new_manifest(settings, model, eos), **(extra or {})})
    done = {s["file"] for s in manifest["shards"]}
    total, size = int(settings.prompts), settings.shard_size
    if progress is not None:
        progress(sum(int(s["prompts"]) for s in manifest["shards"]), total)
    for number, first in enumerate(range(0, total, size)):
        if shard_name(number) in done:
            continue
        t0 = time.perf_counter()
        records = shard_records(first, min(size, total - first))
        results = shard_results(model, records, settings)
        items = [SimpleNamespace(ids=list(r["prompt"]), index=first + j, dataset=r["dataset"],
                                 prompt_id=r["prompt_id"]) for j, r in enumerate(records)]
        arrays = _shard_arrays(items, results, settings.layers, np.dtype(settings.feature_dtype))
        written = _write_npz(out / shard_name(number), arrays)
        manifest["shards"].append({"file": shard_name(number), "first_index": first, "prompts": len(records),
                                   "positions": int(arrays["tokens"].size),
                                   "new_tokens": int(arrays["new_tokens"].sum()), **written,
                                   "seconds": time.perf_counter() - t0})
        manifest["shards"].sort(key=lambda s: s["first_index"])
        manifest["total_bytes"] = recording_bytes(out)
        _write_json(path, manifest)
        if progress is not None:
            progress(sum(int(s["prompts"]) for s in manifest["shards"]), total)
    manifest["complete"] = True
    manifest["total_bytes"] = recording_bytes(out)
    _write_json(path, manifest)
    return manifest, redo


def rebuild_recording(target, answers_dir, out_dir, *, prompts: int | None = None, top_m: int = 32,
                      batch_size: int = 4, shard_size: int = 32, feature_dtype: str = "float16",
                      progress=None, every: int = 1) -> dict:
    """Write the recording of an answer set's first ``prompts`` prompts into ``out_dir``.

    Args:
        target: the `LoadedModel` the answers came from (checked by fingerprint and
            tokenizer hash). answers_dir: an answer set folder. out_dir: the recording
            folder (shards already written with the same settings are kept).
        prompts: how many prompts (None: all in the set). top_m, shard_size,
            feature_dtype: as `RecordSettings`. batch_size: rows per prefill forward.
        progress: optional callable(prompts_done, prompts_total), first with the
            prompts already recorded (a resumed rebuild), then after each shard.
        every: keep every ``every``-th prompt of the set (int >= 1; its 0th,
            every-th, ...): a sub-stream in the set's own domain order; ``prompts``
            then counts the kept prompts (None: all of them). The manifest's
            ``every`` says which.

    Returns:
        the recording's manifest.

    Raises:
        ValueError: another target / dtype / tokenizer than the set's, ``prompts``
            outside 1..the set's (sub-stream's) size, ``every`` < 1, a recording with
            other settings in ``out_dir``;
            `DamagedPieceError` for a damaged piece.
    """
    from specloop.realmodels.answers.answer_set import open_answer_set, target_fingerprint, tokenizer_sha256
    from specloop.realmodels.recording import (RecordSettings, check_settings, head_feature_layers,
                                               prompts_fingerprint, redone_note)
    answers = open_answer_set(answers_dir)
    if answers.manifest["target_fingerprint"] != target_fingerprint(target.model):
        raise ValueError(f"{answers_dir} was generated by a target with other weights or dtype than "
                         f"{target.name!r} as loaded (target fingerprint differs)")
    if target.tokenizer is not None and answers.manifest["tokenizer_sha256"] != tokenizer_sha256(target.tokenizer):
        raise ValueError(f"{answers_dir} was generated with another tokenizer or chat template")
    if int(every) != every or every < 1:
        raise ValueError(f"every must be an int >= 1, got {every}")
    every = int(every)
    available = -(-answers.num_prompts // every)
    count = available if prompts is None else int(prompts)
    if not 1 <= count <= available:
        raise ValueError(f"asked for {prompts} prompts; {answers_dir} holds {answers.num_prompts}"
                         + (f" ({available} at every {every}-th)" if every > 1 else ""))
    kept = (r for i, r in enumerate(answers.records()) if i % every == 0)
    records = [r for _, r in zip(range(count), kept)]
    s = answers.settings
    layers = head_feature_layers(target.model.config)
    settings = RecordSettings(target=s["target"], dtype=s["dtype"], datasets=tuple(s["datasets"]), split=s["split"],
                              order=s["order"], prompts=count, max_new_tokens=int(s["max_new_tokens"]),
                              max_prompt_tokens=s["max_prompt_tokens"], chat_template=bool(s["chat_template"]),
                              top_m=top_m, layers=layers, batch_size=batch_size, shard_size=shard_size,
                              prompts_sha256=prompts_fingerprint(r["prompt"].tolist() for r in records),
                              feature_dtype=feature_dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, settings)
    with folder_lock(out):
        manifest, redo = write_shards(target.model, out, settings, answers.manifest["eos_ids"],
                                      lambda first, n: records[first:first + n],
                                      extra={"answers": str(answers_dir), **({"every": every} if every > 1 else {})},
                                      progress=progress)
    return {**manifest, "redone": redone_note(redo, manifest)} if redo else manifest
