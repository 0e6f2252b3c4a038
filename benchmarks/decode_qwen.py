"""Decoding speed on Qwen2.5-Coder-1.5B-Instruct with a SmolLM2-135M draft.

The stated targets for this pair: specloop >= 2.5x plain greedy and >= 1.3x HF's
universal assisted decoding (UAD; Timor et al. 2025, "Accelerating LLM Inference
with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies";
``model.generate(..., assistant_model=draft, tokenizer=target_tok,
assistant_tokenizer=draft_tok)``), both in the same precision.

Same run, same prompts (held-out HumanEval from `specloop.data.prompts`, chat
template applied as in ``benchmarks/decode.py``), greedy decoding, per dtype
(``--dtypes``, bfloat16 first):

* ``hf-greedy``                plain greedy, ``model.generate`` (the baseline)
* ``hf-uad-nN``                HF UAD with SmolLM2-135M-Instruct as assistant,
                               ``num_assistant_tokens=N`` (``--uad-tokens``; schedule
                               ``constant``); ``hf-uad-default`` keeps the assistant's
                               own generation config (HF defaults: 20 tokens, confidence
                               threshold 0.4)
* ``specloop-smollm2-chain-kK``  our decoder, chain of K target tokens re-tokenised from
                               the SmolLM2 draft (`drafters.small_lm.RetokenizingDrafter`)
* ``specloop-ngram-tree``      our decoder, n-gram prompt lookup (`drafters.ngram`), a
                               trie of ``--tree-width`` continuations of depth
                               ``--tree-depth`` verified in one forward (as decode.py)

Per method: tokens/s (new tokens / seconds, prefill included, as HF's generate
includes it), mean accepted length tau (bonus token included; NaN for HF rows, which
do not report it), ``speedup`` vs ``hf-greedy`` in the same dtype,
``speedup_vs_best_plain`` vs the faster plain greedy over all dtypes run,
``vs_hf_uad`` vs the best HF UAD row in the same dtype, and
``identical_to_hf_greedy`` (every prompt's new tokens equal HF greedy's; a check,
expected true in float32, bfloat16 may differ where near-ties round differently
between a one-token and a many-token forward). A warm-up pass per method
(``--warmup-tokens`` tokens on the first prompt) is dropped; each method runs
``--repeats`` times over all prompts, methods interleaved per repeat (order reversed on
odd repeats); the median per-repeat tokens/s is reported. ``meta`` records the load
average before and after, and the conversion / load seconds.

    OMP_NUM_THREADS=2 nice -n -15 python benchmarks/decode_qwen.py --prompts 2 --max-new-tokens 64 --repeats 1 --json

Every number is a ratio measured in the same run; run it on a machine as quiet as
you can get and read ``meta.load_avg_*``.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import _hf_runner, _prompts, _spec_runner  # noqa: E402  (benchmarks/decode.py: same runners and prompts)

RESULTS = Path(__file__).resolve().parent / "results"


def _uad_setup(assistant, num_tokens: int | None, defaults: dict):
    """Set the assistant's ``num_assistant_tokens`` (constant schedule) or restore
    its own generation config (``num_tokens=None``)."""
    def setup():
        cfg = assistant.generation_config
        for key, value in defaults.items():
            setattr(cfg, key, value)
        if num_tokens is not None:
            cfg.num_assistant_tokens = int(num_tokens)
            cfg.num_assistant_tokens_schedule = "constant"
    return setup


def _methods(target, drafter, args) -> dict:
    """The benchmark rows; HF's assistant is the drafter's own SmolLM2 module."""
    from specloop.realmodels.decoder import eos_ids_of
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape

    eos = sorted(eos_ids_of(target.model, target.tokenizer))
    methods = {"hf-greedy": _hf_runner(target.model, eos)}
    assistant = drafter.lm.model
    cfg = assistant.generation_config
    defaults = {key: getattr(cfg, key, None) for key in
                ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    uad = dict(assistant_model=assistant, tokenizer=target.tokenizer, assistant_tokenizer=drafter.draft_tok)
    for n in args.uad_tokens:
        name = "hf-uad-default" if n is None else f"hf-uad-n{n}"
        methods[name] = _hf_runner(target.model, eos, setup=_uad_setup(assistant, n, defaults), **uad)
    for k in args.k:
        methods[f"specloop-smollm2-chain-k{k}"] = _spec_runner(None, target, drafter, FixedDraftPolicy(k))
    shape = f"{args.tree_width}x" + "x".join(["1"] * (args.tree_depth - 1)) + f",v={args.tree_nodes}"
    methods["specloop-ngram-tree"] = _spec_runner(None, target, NGramDrafter(max_matches=args.tree_width),
                                                  FixedDraftPolicy(args.tree_depth, parse_tree_shape(shape)))
    return methods


def _bench_dtype(dtype: str, prompts, args, meta: dict, target=None) -> dict:
    from specloop.realmodels.drafters.small_lm import RetokenizingDrafter, make_small_lm_drafter
    from specloop.realmodels.loading import load_model

    if target is None:
        t0 = time.perf_counter()
        target = load_model(args.target, dtype=dtype)
        meta.setdefault("target_load_seconds", {})[dtype] = time.perf_counter() - t0
    drafter = make_small_lm_drafter(target, args.draft, dtype=dtype)
    if not isinstance(drafter, RetokenizingDrafter):
        raise RuntimeError(f"expected a re-tokenising drafter for {args.draft} -> {args.target}, "
                           f"got {type(drafter).__name__}")
    methods = _methods(target, drafter, args)
    for name, run in methods.items():  # warm-up, dropped
        run(prompts[0][2], min(args.warmup_tokens, args.max_new_tokens))
        print(f"[{dtype}] warm-up {name} done", file=sys.stderr, flush=True)
    per_repeat = {name: [] for name in methods}
    tau = {name: [] for name in methods}
    tokens = {name: 0 for name in methods}
    outputs: dict[str, list[list[int]]] = {}
    for repeat in range(args.repeats):
        order = list(methods) if repeat % 2 == 0 else list(reversed(methods))
        for name in order:
            total_tokens, total_seconds, taus, outs = 0, 0.0, [], []
            for _, _, ids in prompts:
                new, seconds, t = methods[name](ids, args.max_new_tokens)
                total_tokens += len(new)
                total_seconds += seconds
                taus.append(t)
                outs.append(new)
            per_repeat[name].append(total_tokens / total_seconds)
            tau[name].append(statistics.fmean(taus))
            tokens[name] = total_tokens
            outputs[name] = outs
            print(f"[{dtype}] repeat {repeat} {name}: {total_tokens / total_seconds:.2f} tok/s  "
                  f"tau {statistics.fmean(taus):.2f}", file=sys.stderr, flush=True)
    reference = outputs["hf-greedy"]
    out = {}
    for name in methods:
        out[name] = {"tokens_per_s": statistics.median(per_repeat[name]),
                     "tokens_per_s_all": per_repeat[name],
                     "mean_accepted_length": _none_if_nan(statistics.median(tau[name])),
                     "new_tokens": tokens[name],
                     "identical_to_hf_greedy": outputs[name] == reference}
    del methods, drafter, target
    gc.collect()
    return out


def _none_if_nan(value: float) -> float | None:
    return None if math.isnan(value) else value


def _ratios(results: dict) -> None:
    best_plain = max(table["hf-greedy"]["tokens_per_s"] for table in results.values())
    for table in results.values():
        base = table["hf-greedy"]["tokens_per_s"]
        uad = [row["tokens_per_s"] for name, row in table.items() if name.startswith("hf-uad")]
        best_uad = max(uad) if uad else float("nan")
        for row in table.values():
            row["speedup"] = row["tokens_per_s"] / base
            row["speedup_vs_best_plain"] = row["tokens_per_s"] / best_plain
            row["vs_hf_uad"] = row["tokens_per_s"] / best_uad


def _parse_uad(text: str) -> list[int | None]:
    out: list[int | None] = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        if item == "default":
            out.append(None)
            continue
        if not item.isdigit() or int(item) < 1:
            raise SystemExit(f"--uad-tokens: {item!r} is neither 'default' nor a positive integer")
        out.append(int(item))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m", help="draft model (also HF's assistant)")
    parser.add_argument("--datasets", default="humaneval")
    parser.add_argument("--prompts", type=int, default=2, help="held-out prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--warmup-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--k", default="4,6", help="chain lengths k of the SmolLM2 chain rows")
    parser.add_argument("--uad-tokens", default="default,5",
                        help="HF UAD settings: 'default' (assistant's own config) and/or num_assistant_tokens")
    parser.add_argument("--tree-width", type=int, default=4, help="n-gram continuations in the tree")
    parser.add_argument("--tree-depth", type=int, default=8)
    parser.add_argument("--tree-nodes", type=int, default=24, help="verify size cap of the n-gram tree")
    parser.add_argument("--out", type=Path, default=RESULTS / "decode_qwen.json")
    args = parser.parse_args(argv)
    args.k = [int(x) for x in str(args.k).split(",") if x]
    args.uad_tokens = _parse_uad(args.uad_tokens)
    if args.prompts < 1 or args.max_new_tokens < 1 or args.repeats < 1:
        raise SystemExit("--prompts, --max-new-tokens and --repeats must be >= 1")
    import torch
    import transformers
    from specloop.realmodels.loading import load_model

    load_before = os.getloadavg()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    dtypes = [d for d in args.dtypes.split(",") if d]
    t0 = time.perf_counter()
    first = load_model(args.target, dtype=dtypes[0])  # converts the GGUF once if not cached
    meta: dict = {"target_load_seconds": {dtypes[0]: time.perf_counter() - t0}}
    prompts = _prompts(first.tokenizer, args.datasets.split(","), args.prompts)
    results = {dtypes[0]: _bench_dtype(dtypes[0], prompts, args, meta, target=first)}
    del first
    for dtype in dtypes[1:]:
        results[dtype] = _bench_dtype(dtype, prompts, args, meta)
    _ratios(results)
    meta.update({"target": args.target, "draft": args.draft, "datasets": args.datasets,
                 "prompts": [f"{d}/{i}" for d, i, _ in prompts], "prompt_tokens": [len(ids) for *_, ids in prompts],
                 "max_new_tokens": args.max_new_tokens, "warmup_tokens": args.warmup_tokens,
                 "repeats": args.repeats, "k": args.k,
                 "uad_tokens": ["default" if n is None else n for n in args.uad_tokens],
                 "tree": {"width": args.tree_width, "depth": args.tree_depth, "nodes": args.tree_nodes},
                 "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                 "niceness": os.nice(0), "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
                 "machine": platform.machine(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                 "transformers": transformers.__version__, "started": started,
                 "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    out = {"meta": meta, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
    for dtype, table in results.items():
        for name, row in table.items():
            print(f"{dtype:9s} {name:28s} {row['tokens_per_s']:7.2f} tok/s  tau {row['mean_accepted_length'] or float('nan'):.2f}  "
                  f"speedup {row['speedup']:.2f}  vs-uad {row['vs_hf_uad']:.2f}  "
                  f"same-as-greedy {row['identical_to_hf_greedy']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
