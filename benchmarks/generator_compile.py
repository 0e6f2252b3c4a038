"""Does ``torch.compile`` speed up the answer-set generator on this CPU?

`specloop.realmodels.answers.generator.generate_greedy` decodes with a batch of slots
whose attention width W = max_b n_b + 1 grows by one every step, and prefills each
new prompt's prefix at batch 1 with its own length: the shapes change on every call,
so the model is compiled with ``dynamic=True`` (one graph over symbolic lengths)
rather than once per shape. This benchmark times, in one run and at one torch-thread
count, the same prompts (the first ``--prompts`` ShareGPT warm-up first turns,
chat-templated) through:

* ``eager``: the generator as shipped;
* ``compiled``: the same generator with the target's ``forward`` wrapped by
  ``torch.compile(dynamic=True)`` (mode ``--mode``); its first call (graph capture and
  code generation) is timed apart as ``compile_seconds`` and not counted in its rate;

alternating eager / compiled ``--repeats`` times so a load drift hits both alike, and
reports new tokens/s of each pass with the 1-minute load average before / after, the
ratio of the medians (``compiled_vs_eager``), the number of prompts whose continuation
differs between the two (bfloat16 rounding may move a row; float32 should not), and
the break-even: how many new tokens a run must generate before the compile cost is
repaid (``break_even_new_tokens``; null when compiled is not faster).

    python benchmarks/generator_compile.py [--prompts 32] [--max-new-tokens 64]
        [--batch-size 32] [--threads 1] [--dtype bfloat16] [--repeats 2]
        [--mode default] [--json] [--out benchmarks/results/generator_compile.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "generator_compile.json"


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _pass(model, prompts, max_new, eos, batch_size) -> tuple[list[list[int]], dict]:
    from specloop.realmodels.answers.generator import generate_greedy
    before, t0 = _load(), time.perf_counter()
    answers = generate_greedy(model, prompts, max_new, eos, batch_size=batch_size)
    seconds = time.perf_counter() - t0
    tokens = [list(a.tokens) for a in answers]
    new = sum(len(t) for t in tokens)
    return tokens, {"new_tokens": new, "seconds": round(seconds, 3), "tokens_per_s": round(new / seconds, 2),
                    "load_before": before, "load_after": _load()}


def run(args) -> dict:
    from specloop.data.streams import build_stream
    from specloop.realmodels.decoder import eos_ids_of
    from specloop.realmodels.loading import load_model
    torch.set_num_threads(args.threads)
    target = load_model(args.target, dtype=args.dtype)
    model = target.model
    items = build_stream(["sharegpt"], args.prompts, target.tokenizer, split="warmup",
                         max_prompt_tokens=args.max_prompt_tokens)
    prompts = [list(it.ids) for it in items]
    eos = set(eos_ids_of(model, target.tokenizer))
    _pass(model, prompts[:2], 4, eos, 2)                                      # allocator / kernel warm-up
    eager_forward = model.forward
    compiled_forward = torch.compile(eager_forward, dynamic=True, mode=args.mode)
    model.forward = compiled_forward
    t0 = time.perf_counter()
    _pass(model, prompts[:2], 4, eos, 2)
    _, first = _pass(model, prompts, args.max_new_tokens, eos, args.batch_size)
    compile_seconds = time.perf_counter() - t0
    passes = {"eager": [], "compiled": []}
    outputs = {}
    for _ in range(args.repeats):
        for name, forward in (("eager", eager_forward), ("compiled", compiled_forward)):
            model.forward = forward
            outputs[name], figure = _pass(model, prompts, args.max_new_tokens, eos, args.batch_size)
            passes[name].append(figure)
    model.forward = eager_forward
    median = {k: statistics.median(f["tokens_per_s"] for f in v) for k, v in passes.items()}
    ratio = median["compiled"] / median["eager"]
    saved_per_token = 1.0 / median["eager"] - 1.0 / median["compiled"]
    overhead = compile_seconds - first["new_tokens"] / median["compiled"]
    return {"benchmark": "generator_compile", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
            "settings": {"target": args.target, "dtype": args.dtype, "prompts": len(prompts),
                         "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
                         "threads": args.threads, "repeats": args.repeats, "mode": args.mode,
                         "dynamic": True},
            "compile_seconds": round(compile_seconds, 1), "first_compiled_pass": first,
            "passes": passes, "median_tokens_per_s": median, "compiled_vs_eager": round(ratio, 3),
            "prompts_differing": sum(a != b for a, b in zip(outputs["eager"], outputs["compiled"])),
            "break_even_new_tokens": round(overhead / saved_per_token) if saved_per_token > 0 else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mode", default="default", choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"))
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"eager {result['median_tokens_per_s']['eager']:.1f} tok/s, compiled "
              f"{result['median_tokens_per_s']['compiled']:.1f} tok/s ({result['compiled_vs_eager']:.3f}x), "
              f"compile {result['compile_seconds']:.0f} s, {result['prompts_differing']} prompts differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
