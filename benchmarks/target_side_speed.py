"""New tokens/s of the target's side: the recorder, transformers, and the answer-set generator.

The same prompts (the first ``--prompts`` ShareGPT warm-up first turns, chat-templated,
last ``--max-prompt-tokens`` tokens) and ``--max-new-tokens`` greedy tokens with EOS
stopping, at each torch thread count of ``--threads``, one method after the other:

(a) ``recorder``: `specloop.realmodels.streams.record.generate_batch` (what
    `specloop stream record` runs) at its default settings (batch 8, top-m 32, the
    heads' feature layers): prefill, greedy steps, features of every position;
(b) ``hf_static``: transformers ``generate`` (greedy, ``cache_implementation="static"``),
    prompts left-padded in batches of each size of ``--hf-batch-sizes``; the best batch
    size counts;
(c) ``hf_continuous``: transformers' continuous batching (``generate_batch``, paged
    cache) with its default configuration;
(d) ``answers``: `specloop.realmodels.answers.generator.generate_greedy`, continuously
    batched over a preallocated slot cache (``--batch-size`` slots);

and the prefill rate of the rebuild (`rebuild_recording` of (d)'s answers into a
recording: every position's features and top-m by teacher-forced prefill), in
positions/s. New tokens are counted as an answer set counts them: each row's greedy
tokens up to and including its first EOS (HF's batched ``generate`` keeps stepping a
finished row until the batch ends; those steps are its cost, not new tokens).

The load average (1 minute, before / after) is stored beside every figure: on a shared
machine every rate moves with it. Ratios are of figures measured in this run:
``ratios[threads] = {"vs_best_hf": d / max(b, c), "vs_recorder": d / a}`` and
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


def _recorder(model, prompts, max_new, eos):
    from specloop.realmodels.recording import head_feature_layers
    from specloop.realmodels.streams.record import generate_batch
    layers, out = head_feature_layers(model.config), []
    for b in range(0, len(prompts), 8):
        out += [r["tokens"][len(p):].tolist()
                for p, r in zip(prompts[b:b + 8], generate_batch(model, prompts[b:b + 8], max_new, eos, layers, 32))]
    return out


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
    got, s, b, a = _timed(lambda: _recorder(model, prompts, max_new, eos))
    figures["recorder"] = _figure("recorder", got, s, b, a, batch_size=8)
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
    got, s, b, a = _timed(lambda: _answers(model, prompts, max_new, eos, args.batch_size))
    figures["answers"] = _figure("answers", got, s, b, a, batch_size=args.batch_size,
                                 agreement_with_hf_static=sum(x == y for x, y in zip(got, best_hf_tokens)))
    hf_rates = [f["tokens_per_s"] for k, f in figures.items() if k.startswith("hf_") and "tokens_per_s" in f]
    d = figures["answers"]["tokens_per_s"]
    return {"threads": threads, "figures": figures,
            "ratios": {"vs_best_hf": round(d / max(hf_rates), 3),
                       "vs_recorder": round(d / figures["recorder"]["tokens_per_s"], 3)}}


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
