"""Rebuild a stream recording from an answer set by teacher-forced prefill.

A recording (`specloop.realmodels.recording`) holds, at every position of every
prompt and its greedy continuation, the hidden states the draft heads read and the
target's top-m next-token distribution. Given the continuation (an answer set), all of
that comes from one causal forward over prompt + answer: no generation. Rows are
batched right-padded (a causal row never sees the padding after it), longest first.

The rebuilt recording has the format and settings of a direct one (``batch_size`` is
the rebuild's). Tokens are exactly the answer set's; features and top-m probabilities
come from a full-sequence forward instead of the incremental one, so they agree with a
direct recording up to float rounding (tested: hidden states within 2e-2 absolute in
float16 storage, top-1 token equal, top-m probabilities within 1e-2).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from specloop._folder_lock import folder_lock

__all__ = ["rebuild_recording"]


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


def rebuild_recording(target, answers_dir, out_dir, *, prompts: int | None = None, top_m: int = 32,
                      batch_size: int = 4, shard_size: int = 32, feature_dtype: str = "float16",
                      progress=None) -> dict:
    """Write the recording of an answer set's first ``prompts`` prompts into ``out_dir``.

    Args:
        target: the `LoadedModel` the answers came from (checked by fingerprint and
            tokenizer hash). answers_dir: an answer set folder. out_dir: the recording
            folder (shards already written with the same settings are kept).
        prompts: how many prompts (None: all in the set). top_m, shard_size,
            feature_dtype: as `RecordSettings`. batch_size: rows per prefill forward.
        progress: optional callable(prompts_done, prompts_total).

    Returns:
        the recording's manifest.

    Raises:
        ValueError: another target / dtype / tokenizer than the set's, ``prompts``
            outside 1..the set's size, a recording with other settings in ``out_dir``;
            `DamagedPieceError` for a damaged piece.
    """
    from specloop.realmodels.answers.answer_set import open_answer_set, target_fingerprint, tokenizer_sha256
    from specloop.realmodels.recording import (RecordSettings, _shard_arrays, _write_json, _write_npz,
                                               check_settings, head_feature_layers, prompts_fingerprint,
                                               recording_bytes, shard_name)
    from specloop.realmodels.streams.record import _new_manifest
    answers = open_answer_set(answers_dir)
    if answers.manifest["target_fingerprint"] != target_fingerprint(target.model):
        raise ValueError(f"{answers_dir} was generated by a target with other weights or dtype than "
                         f"{target.name!r} as loaded (target fingerprint differs)")
    if target.tokenizer is not None and answers.manifest["tokenizer_sha256"] != tokenizer_sha256(target.tokenizer):
        raise ValueError(f"{answers_dir} was generated with another tokenizer or chat template")
    count = answers.num_prompts if prompts is None else int(prompts)
    if not 1 <= count <= answers.num_prompts:
        raise ValueError(f"asked for {prompts} prompts; {answers_dir} holds {answers.num_prompts}")
    records = [r for _, r in zip(range(count), answers.records())]
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
    eos = answers.manifest["eos_ids"]
    with folder_lock(out):
        return _write_shards(target.model, records, out, settings, eos, progress,
                             (_new_manifest, _shard_arrays, _write_json, _write_npz, recording_bytes, shard_name),
                             str(answers_dir))


def _write_shards(model, records, out: Path, settings, eos, progress, io_helpers, answers: str) -> dict:
    from types import SimpleNamespace
    from specloop.realmodels.recording import redone_note, resume_manifest
    new_manifest, shard_arrays, write_json, write_npz, recording_bytes, shard_name = io_helpers
    path = out / "manifest.json"
    manifest, redo = resume_manifest(out, lambda: {**new_manifest(settings, model, eos), "answers": answers})
    done = {s["file"] for s in manifest["shards"]}
    store = {"float16": torch.float16, "float32": torch.float32}[settings.feature_dtype]
    total, size = len(records), settings.shard_size
    for number, first in enumerate(range(0, total, size)):
        if shard_name(number) in done:
            continue
        t0, chunk = time.perf_counter(), records[first:first + size]
        results: list[dict | None] = [None] * len(chunk)
        order = sorted(range(len(chunk)), key=lambda j: -(chunk[j]["prompt"].size + chunk[j]["answer"].size))
        for b in range(0, len(order), settings.batch_size):
            rows = order[b:b + settings.batch_size]
            seqs = [chunk[j]["prompt"].tolist() + chunk[j]["answer"].tolist() for j in rows]
            for j, seq, feats in zip(rows, seqs, _teacher_forced(model, seqs, settings.layers, settings.top_m, store)):
                results[j] = {**feats, "tokens": np.asarray(seq, dtype=np.int32),
                              "new_tokens": int(chunk[j]["answer"].size), "stop_reason": chunk[j]["stop_reason"]}
        items = [SimpleNamespace(ids=r["prompt"].tolist(), index=first + j, dataset=r["dataset"],
                                 prompt_id=r["prompt_id"]) for j, r in enumerate(chunk)]
        arrays = shard_arrays(items, results, settings.layers, np.dtype(settings.feature_dtype))
        written = write_npz(out / shard_name(number), arrays)
        manifest["shards"].append({"file": shard_name(number), "first_index": first, "prompts": len(chunk),
                                   "positions": int(arrays["tokens"].size),
                                   "new_tokens": int(arrays["new_tokens"].sum()), **written,
                                   "seconds": time.perf_counter() - t0})
        manifest["shards"].sort(key=lambda s: s["first_index"])
        manifest["total_bytes"] = recording_bytes(out)
        write_json(path, manifest)
        if progress is not None:
            progress(min(first + size, total), total)
    manifest["complete"] = True
    manifest["total_bytes"] = recording_bytes(out)
    write_json(path, manifest)
    return {**manifest, "redone": redone_note(redo, manifest)} if redo else manifest
