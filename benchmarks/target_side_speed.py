"""New tokens/s of the target's side: the recorder, transformers, and the answer-set generator.

The same prompts (the first ``--prompts`` ShareGPT warm-up first turns, chat-templated,
last ``--max-prompt-tokens`` tokens) and ``--max-new-tokens`` greedy tokens with EOS
stopping, at each torch thread count of ``--threads``, one method after the other:

(a) ``recorder``: the stream recorder's former batched generator (``generate_batch``,
    kept in this file as the historical baseline since `specloop stream record` now
    generates with (d) and takes the features from the rebuild's teacher-forced
    prefill; kept here so ``vs_recorder`` keeps its meaning: the answer-set generator
    against the generator it replaced) at the recorder's default settings (batch 8,
    top-m 32, the heads' feature layers): prefill, greedy steps, features of every
    position;
(b) ``hf_static``: transformers ``generate`` (greedy, ``cache_implementation="static"``),
    prompts left-padded in batches of each size of ``--hf-batch-sizes``; the best batch
    size counts;
(c) ``hf_continuous``: transformers' continuous batching (``generate_batch``, paged
    cache) with its default configuration;
(d) ``answers``: `specloop.realmodels.answers.generator.generate_greedy`, continuously
    batched over a preallocated slot cache (``--batch-size`` slots);
(e) ``stream_record``: what `specloop stream record` runs now (`record_stream` into a
    temporary folder at its default settings: batch 8, top-m 32, the heads' feature
    layers, float16 features, no batch-1 check): (d)'s generator with 8 slots, then
    every position's features and top-m by teacher-forced prefill, shard written;

and the prefill rate of the rebuild (`rebuild_recording` of (d)'s answers into a
recording: every position's features and top-m by teacher-forced prefill), in
positions/s. New tokens are counted as an answer set counts them: each row's greedy
tokens up to and including its first EOS (HF's batched ``generate`` keeps stepping a
finished row until the batch ends; those steps are its cost, not new tokens).

The load average (1 minute, before / after) is stored beside every figure: on a shared
machine every rate moves with it. Ratios are of figures measured in this run:
``ratios[threads] = {"vs_best_hf": d / max(b, c), "vs_recorder": d / a,
"stream_record_vs_recorder": e / a}`` (e / a: `specloop stream record`'s new tokens/s,
features included, after / before it moved to the answer-set generator) and
``rebuild_vs_generate`` (rebuild positions/s over (d)'s new tokens/s, at the largest
thread count). ``agreement`` counts the prompts whose (d) answer equals (b)'s at the
best batch size (in bfloat16 batched rounding may move a row; in float32 they agree).

    python benchmarks/target_side_speed.py [--quick] [--json] [--threads 1,2]
        [--prompts 64] [--max-new-tokens 128] [--dtype bfloat16]
        [--out benchmarks/results/target_side_speed.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "target_side_speed.json"


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _timed(fn):
    """(result, seconds, load before, load after) of ``fn()``."""
    before, t0 = _load(), time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0, before, _load()


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def _figure(name: str, answers: list[list[int]], seconds: float, before: float, after: float, **extra) -> dict:
    new = sum(len(a) for a in answers)
    return {"method": name, "new_tokens": new, "seconds": round(seconds, 3),
            "tokens_per_s": round(new / seconds, 2), "load_before": before, "load_after": after, **extra}


# -- (a) the historical baseline: the stream recorder's former generator ----------------
# Left-padded batches: each prompt's prefix prefilled alone, the batch-1 caches merged
# into one DynamicCache, one forward per step over every unfinished row (a float 4D
# mask hides the padding), hidden states and top-m of every position from the forward
# that feeds its token; a finished row leaves the batch (batch_select_indices).
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


def _recorder(model, prompts, max_new, eos):
    from specloop.realmodels.recording import head_feature_layers
    layers, out = head_feature_layers(model.config), []
    for b in range(0, len(prompts), 8):
        out += [r["tokens"][len(p):].tolist()
                for p, r in zip(prompts[b:b + 8], generate_batch(model, prompts[b:b + 8], max_new, eos, layers, 32))]
    return out


def _stream_record(target, items, max_new, dtype: str) -> tuple[list[list[int]], float, float, float]:
    """(e): `record_stream` as `specloop stream record` runs it by default: the answers
    read back from the recording, and (seconds, load before, load after) of the
    recording alone."""
    from specloop.realmodels.recording import RecordSettings, head_feature_layers, open_recording
    from specloop.realmodels.streams.record import record_stream
    settings = RecordSettings(target="bench", dtype=dtype, datasets=("sharegpt",), split="warmup", order="shift",
                              prompts=len(items), max_new_tokens=max_new, max_prompt_tokens=None,
                              chat_template=True, top_m=32, layers=head_feature_layers(target.model.config),
                              batch_size=8, shard_size=32)
    with tempfile.TemporaryDirectory() as tmp:
        _, seconds, before, after = _timed(
            lambda: record_stream(target, items, Path(tmp) / "rec", settings, check_prompts=0))
        rec, out = open_recording(Path(tmp) / "rec"), []
        for item in items:
            got = rec.prompt(item.index)
            out.append(got["tokens"][got["prompt_length"]:].tolist())
    return out, seconds, before, after


def _hf_static(model, prompts, max_new, eos, batch_size: int, pad_id: int):
    out = []
    for b in range(0, len(prompts), batch_size):
        chunk = prompts[b:b + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             cache_implementation="static", eos_token_id=sorted(eos), pad_token_id=pad_id)
        out += [_until_eos(row[width:].tolist(), eos) for row in gen]
    return out


def _hf_continuous(model, prompts, max_new, eos):
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(eos),
                              pad_token_id=sorted(eos)[0])
    result = model.generate_batch(inputs=prompts, generation_config=config)
    by_prompt = {tuple(r.prompt_ids): _until_eos(list(r.generated_tokens), eos) for r in result.values()}
    return [by_prompt[tuple(p)] for p in prompts]


def _answers(model, prompts, max_new, eos, batch_size: int):
    from specloop.realmodels.answers.generator import generate_greedy
    return [list(a.tokens) for a in generate_greedy(model, prompts, max_new, eos, batch_size=batch_size)]


def _rebuild(target, items, settings) -> tuple[int, float, float, float]:
    """Positions and seconds of rebuilding (d)'s answers into a recording."""
    from specloop.realmodels.answers.run import generate_answer_set
    from specloop.realmodels.answers.rebuild import rebuild_recording
    with tempfile.TemporaryDirectory() as tmp:
        generate_answer_set(target, items, Path(tmp) / "set", settings)
        manifest, seconds, before, after = _timed(
            lambda: rebuild_recording(target, Path(tmp) / "set", Path(tmp) / "rec", batch_size=8))
    return sum(s["positions"] for s in manifest["shards"]), seconds, before, after


def _one_thread_count(target, items, threads: int, args, eos) -> dict:
    torch.set_num_threads(threads)
    model, prompts, max_new = target.model, [list(it.ids) for it in items], args.max_new_tokens
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else sorted(eos)[0]
    _answers(model, prompts[:2], 4, eos, 2)                                   # warm-up (allocator, kernels)
    figures = {}
    recorded, s, b, a = _timed(lambda: _recorder(model, prompts, max_new, eos))
    figures["recorder"] = _figure("recorder", recorded, s, b, a, batch_size=8)
    hf = []
    for size in args.hf_batch_sizes:
        got, s, b, a = _timed(lambda: _hf_static(model, prompts, max_new, eos, size, pad_id))
        hf.append((_figure("hf_static", got, s, b, a, batch_size=size), got))
    best_hf, best_hf_tokens = max(hf, key=lambda f: f[0]["tokens_per_s"])
    figures["hf_static"] = {**best_hf, "by_batch_size": [f for f, _ in hf]}
    try:
        got, s, b, a = _timed(lambda: _hf_continuous(model, prompts, max_new, eos))
        figures["hf_continuous"] = _figure("hf_continuous", got, s, b, a)
    except Exception as err:                          # it may not run on this CPU / version: say why
        figures["hf_continuous"] = {"method": "hf_continuous", "error": f"{type(err).__name__}: {err}"[:300]}
    got, s, b, a = _stream_record(target, items, max_new, args.dtype)
    figures["stream_record"] = _figure("stream_record", got, s, b, a, batch_size=8,
                                       agreement_with_recorder=sum(x == y for x, y in zip(got, recorded)))
    got, s, b, a = _timed(lambda: _answers(model, prompts, max_new, eos, args.batch_size))
    figures["answers"] = _figure("answers", got, s, b, a, batch_size=args.batch_size,
                                 agreement_with_hf_static=sum(x == y for x, y in zip(got, best_hf_tokens)))
    hf_rates = [f["tokens_per_s"] for k, f in figures.items() if k.startswith("hf_") and "tokens_per_s" in f]
    d, a = figures["answers"]["tokens_per_s"], figures["recorder"]["tokens_per_s"]
    return {"threads": threads, "figures": figures,
            "ratios": {"vs_best_hf": round(d / max(hf_rates), 3), "vs_recorder": round(d / a, 3),
                       "stream_record_vs_recorder": round(figures["stream_record"]["tokens_per_s"] / a, 3)}}


def run(args) -> dict:
    from specloop.data.streams import build_stream
    from specloop.realmodels.answers.answer_set import AnswerSettings
    from specloop.realmodels.decoder import eos_ids_of
    from specloop.realmodels.loading import load_model
    target = load_model(args.target, dtype=args.dtype)
    items = build_stream(["sharegpt"], args.prompts, target.tokenizer, split="warmup",
                         max_prompt_tokens=args.max_prompt_tokens)
    eos = set(eos_ids_of(target.model, target.tokenizer))
    per_threads = {str(n): _one_thread_count(target, items, n, args, eos) for n in args.threads}
    settings = AnswerSettings(target=args.target, dtype=args.dtype, datasets=("sharegpt",), split="warmup",
                              order="shift", prompts=len(items), max_new_tokens=args.max_new_tokens,
                              max_prompt_tokens=args.max_prompt_tokens, chat_template=True,
                              batch_size=args.batch_size, piece_size=len(items), torch_threads=max(args.threads))
    torch.set_num_threads(max(args.threads))
    positions, seconds, before, after = _rebuild(target, items, settings)
    rebuild = {"positions": positions, "seconds": round(seconds, 3), "positions_per_s": round(positions / seconds, 2),
               "threads": max(args.threads), "load_before": before, "load_after": after}
    generate_rate = per_threads[str(max(args.threads))]["figures"]["answers"]["tokens_per_s"]
    return {"benchmark": "target_side_speed", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
            "settings": {"target": args.target, "dtype": args.dtype, "prompts": len(items),
                         "prompt_tokens": sum(len(it.ids) for it in items), "max_new_tokens": args.max_new_tokens,
                         "max_prompt_tokens": args.max_prompt_tokens, "batch_size": args.batch_size,
                         "hf_batch_sizes": args.hf_batch_sizes, "quick": args.quick},
            "per_threads": per_threads, "rebuild": rebuild,
            "ratios": {k: v["ratios"] for k, v in per_threads.items()},
            "rebuild_vs_generate": round(rebuild["positions_per_s"] / generate_rate, 3),
            "targets": {"vs_best_hf": 1.0, "vs_recorder": 4.0, "rebuild_vs_generate": 10.0}}


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32, help="slots of the answer-set generator")
    parser.add_argument("--hf-batch-sizes", type=_ints, default=[8, 16, 32, 64])
    parser.add_argument("--threads", type=_ints, default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="16 prompts x 32 tokens, HF batch 16 only")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the JSON (default {DEFAULT_OUT}; --quick writes nothing unless given)")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.hf_batch_sizes, args.batch_size = 16, 32, [16], 16
    if args.prompts < 1 or args.max_new_tokens < 1 or args.batch_size < 1:
        parser.error("--prompts, --max-new-tokens and --batch-size must be >= 1")
    result = run(args)
    out = args.out if args.out is not None else (None if args.quick else DEFAULT_OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for threads, part in result["per_threads"].items():
            rates = ", ".join(f"{k} {v.get('tokens_per_s', v.get('error'))}" for k, v in part["figures"].items())
            print(f"{threads} thread(s): {rates} new tokens/s; ratios {part['ratios']}", file=sys.stdout)
        print(f"rebuild {result['rebuild']['positions_per_s']} positions/s; "
              f"rebuild_vs_generate {result['rebuild_vs_generate']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
