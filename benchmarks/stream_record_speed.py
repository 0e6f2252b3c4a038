"""Tokens/s of the batched stream recorder against batch-1 greedy decoding.

For each dtype: the same prompts (held-out stream over ``--datasets``, chat-templated,
last ``--max-prompt-tokens`` tokens) are

* recorded by `specloop.realmodels.streams.record.record_stream` (what `specloop stream
  record` runs: the answer-set generator with ``--batch-size`` slots, then every
  position's hidden states of the heads' layers and top-m p_target by teacher-forced
  prefill, ``--batch-size`` rows per forward; one shard, no batch-1 check: everything a
  shard holds), into a temporary folder, and
* decoded one at a time by `SpeculativeDecoder` with no draft and k = 0 (the plain
  greedy baseline of `specloop stream`).

Reported per dtype: new tokens per wall-clock second of each (prefill included), the
ratio, the first differing token of every prompt whose batched continuation left the
batch-1 one, and the bytes per recorded position (float16 hidden states of each layer,
int32 + float16 top-m, int32 token). The machine's load average (before / after) is
stored with the numbers: on a shared machine both rates move with it.

    python benchmarks/stream_record_speed.py [--prompts 16] [--max-new-tokens 64]
        [--batch-size 8] [--dtypes float32,bfloat16] [--out benchmarks/results/stream_record_speed.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "stream_record_speed.json"


def _measure(dtype: str, args) -> dict:
    from specloop.data.streams import build_stream
    from specloop.realmodels.decoder import SpeculativeDecoder, eos_ids_of
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.drafters.base import NoDraft
    from specloop.realmodels.answers.generator import generate_greedy
    from specloop.realmodels.recording import RecordSettings, first_difference, head_feature_layers, open_recording
    from specloop.realmodels.streams.record import record_stream
    target = load_model(args.target, dtype=dtype)
    items = build_stream(args.datasets, args.prompts, target.tokenizer, max_prompt_tokens=args.max_prompt_tokens)
    prompts = [list(it.ids) for it in items]
    eos = eos_ids_of(target.model, target.tokenizer)
    layers = head_feature_layers(target.model.config)
    generate_greedy(target.model, [prompts[0][:8]], 2, eos, batch_size=1)              # warm-up
    settings = RecordSettings(target=args.target, dtype=dtype, datasets=tuple(args.datasets.split(",")),
                              split="heldout", order="shift", prompts=len(items), max_new_tokens=args.max_new_tokens,
                              max_prompt_tokens=args.max_prompt_tokens, chat_template=True, top_m=args.top_m,
                              layers=layers, batch_size=args.batch_size, shard_size=len(items))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        record_stream(target, items, Path(tmp) / "rec", settings, check_prompts=0)
        batched_s = time.perf_counter() - t0
        recording = open_recording(Path(tmp) / "rec")
        batched = [recording.prompt(it.index) for it in items]
    decoder = SpeculativeDecoder(target, NoDraft(), policy=FixedDraftPolicy(0), eos_token_id=sorted(eos))
    t0 = time.perf_counter()
    single = [decoder.generate(torch.tensor(p), args.max_new_tokens).new_tokens for p in prompts]
    single_s = time.perf_counter() - t0
    divergent = []
    for i, (rec, ref) in enumerate(zip(batched, single)):
        got = rec["tokens"][len(prompts[i]):].tolist()
        if got != ref:
            divergent.append({"prompt": i, "first_diff": first_difference(got, ref)})
    new_batched = sum(r["new_tokens"] for r in batched)
    new_single = sum(len(t) for t in single)
    hidden = int(target.model.config.hidden_size)
    return {"layers": list(layers), "prompts": len(prompts), "prompt_tokens": sum(map(len, prompts)),
            "new_tokens_batched": new_batched, "new_tokens_batch1": new_single,
            "batched_s": batched_s, "batch1_s": single_s,
            "batched_tokens_per_s": new_batched / batched_s, "batch1_tokens_per_s": new_single / single_s,
            "ratio": (new_batched / batched_s) / (new_single / single_s),
            "positions_per_s_batched": (sum(map(len, prompts)) + new_batched) / batched_s,
            "bytes_per_position": len(layers) * hidden * 2 + args.top_m * (4 + 2) + 4,
            "divergent": divergent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--datasets", default="humaneval,mt-bench,ifbench,sharegpt")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--top-m", type=int, default=32)
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    results = {dtype: _measure(dtype, args) for dtype in args.dtypes.split(",")}
    out = {"meta": {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": platform.machine(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "wall_s": time.perf_counter() - t0, "target": args.target, "datasets": args.datasets,
                    "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens,
                    "batch_size": args.batch_size, "top_m": args.top_m},
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
