"""``specloop stream record``: record the target's side of a prompt stream once: per
prompt the chat-templated ids, the greedy continuation, and at every
position the hidden states the draft heads read (float16) and the target's top-m
next-token distribution. The continuations come from the answer-set generator
(continuously batched greedy decoding, ``--batch-size`` slots; the one ``specloop
answers generate`` runs), the features and top-m from the teacher-forced prefill of
``--from-answers`` (``--batch-size`` rows per forward); shards written atomically as
they finish, so a killed recording resumes to the same files; a folder recorded with
other settings is refused (exit 2). Format: `specloop.realmodels.recording`.

``--json`` prints the manifest plus ``tokens_per_s`` (new tokens per second of this run)
and ``total_bytes``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["register_record", "run_record"]


def register_record(sub) -> None:
    parser = sub.add_parser("record", help="record a stream's target side for exact replays",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m", help="target model (registry name, HF id or path)")
    parser.add_argument("--datasets", default="humaneval,mt-bench,ifbench",
                        help="comma-separated datasets, in domain order (also: sharegpt), or prompt files (.jsonl, "
                             ".json, .csv, .parquet: rows with 'prompt' or chat 'messages', optional 'id', 'domain'; "
                             "split like a packaged dataset) or datasets in the local Hugging Face cache "
                             "(owner/name[:split])")
    parser.add_argument("--split", choices=["heldout", "warmup", "all"], default="heldout",
                        help="the datasets' split (heldout: the stream; warmup: offline initialisation)")
    parser.add_argument("--order", choices=["shift", "interleave"], default="shift")
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts (split over datasets; default 12); with --from-answers the set's first N "
                             "(default: all)")
    parser.add_argument("--from-answers", default=None, metavar="DIR",
                        help="rebuild the recording from an answer set by teacher-forced prefill (no generation); "
                             "target, dtype and prompts come from the set")
    parser.add_argument("--every", type=int, default=1, metavar="N",
                        help="with --from-answers: keep every N-th prompt of the set (a sub-stream in the set's "
                             "domain order; --prompts then counts the kept prompts)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="keep the last N prompt tokens")
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per forward (the generator's slots, the prefill's rows)")
    parser.add_argument("--shard-size", type=int, default=32, help="prompts per shard file")
    parser.add_argument("--top-m", type=int, default=32, help="tokens of p_target kept per position")
    parser.add_argument("--feature-dtype", choices=["float16", "float32"], default="float16",
                        help="storage of the features and top-m probabilities (float32: twice the size, online "
                             "learners replay round for round)")
    parser.add_argument("--check-prompts", type=int, default=4,
                        help="prompts re-decoded batch-1 to check the batched continuation (0: none)")
    parser.add_argument("--out", required=True,
                        help="recording folder, created with any missing parent folders (resumable: rerun the same "
                             "command to continue it or to re-record a damaged shard)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run_record)


_FLAG_KEYS = ("target", "dtype", "datasets", "split", "order", "prompts", "max_new_tokens", "max_prompt_tokens",
              "chat_template", "top_m", "batch_size", "shard_size", "feature_dtype")


def _flag_settings(args) -> dict:
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    return {"target": args.target, "dtype": args.dtype, "datasets": datasets, "split": args.split,
            "order": args.order, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
            "max_prompt_tokens": args.max_prompt_tokens, "chat_template": not args.raw, "top_m": args.top_m,
            "batch_size": args.batch_size, "shard_size": args.shard_size, "feature_dtype": args.feature_dtype}


def _record(args) -> dict:
    from specloop.cli._progress import ResumedBar
    from specloop.data.streams import build_stream, stream_prompts
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.recording import RecordSettings, check_settings, head_feature_layers
    from specloop.realmodels.streams.record import record_stream
    flags = _flag_settings(args)
    for name in ("prompts", "max_new_tokens", "max_prompt_tokens", "top_m", "batch_size", "shard_size"):
        if flags[name] < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {flags[name]}")
    if args.check_prompts < 0:
        raise ValueError(f"--check-prompts must be >= 0, got {args.check_prompts}")
    check_settings(args.out, flags, keys=_FLAG_KEYS)          # before the model loads
    stream_prompts(flags["datasets"], args.prompts, args.order, args.split)     # a bad prompt file: before it too
    target = load_model(args.target, dtype=args.dtype, device=args.device)
    items = build_stream(flags["datasets"], args.prompts, target.tokenizer, order=args.order,
                         chat_template=not args.raw, max_prompt_tokens=args.max_prompt_tokens, split=args.split)
    settings = RecordSettings(layers=head_feature_layers(target.model.config), **flags)
    bar = ResumedBar("record", args.json)
    t0 = time.perf_counter()
    try:
        manifest = record_stream(target, items, args.out, settings, check_prompts=args.check_prompts,
                                 progress=bar.progress)
    finally:
        bar.close()
    seconds = sum(s["seconds"] for s in manifest["shards"])
    new = sum(s["new_tokens"] for s in manifest["shards"])
    return {**manifest, "tokens_per_s": new / seconds if seconds else None, "wall_s": time.perf_counter() - t0}


def _rebuild(args) -> dict:
    from specloop.cli._progress import ResumedBar
    from specloop.realmodels.answers.answer_set import open_answer_set
    from specloop.realmodels.answers.rebuild import rebuild_recording
    from specloop.realmodels.loading import load_model
    if args.prompts is not None and args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
    if args.every < 1:
        raise ValueError(f"--every must be >= 1, got {args.every}")
    settings = open_answer_set(args.from_answers).settings
    target = load_model(settings["target"], dtype=settings["dtype"], device=args.device)
    bar = ResumedBar("rebuild", args.json)
    t0 = time.perf_counter()
    try:
        manifest = rebuild_recording(target, args.from_answers, args.out, prompts=args.prompts, top_m=args.top_m,
                                     batch_size=args.batch_size, shard_size=args.shard_size,
                                     feature_dtype=args.feature_dtype, progress=bar.progress, every=args.every)
    finally:
        bar.close()
    seconds = sum(s["seconds"] for s in manifest["shards"])
    positions = sum(s["positions"] for s in manifest["shards"])
    return {**manifest, "tokens_per_s": None, "positions_per_s": positions / seconds if seconds else None,
            "wall_s": time.perf_counter() - t0}


def run_record(args) -> int:
    from specloop.cli._paths import check_paths
    try:
        check_paths(args, out_folders=("out",), in_folders=("from_answers",))
        if args.from_answers is not None:
            result = _rebuild(args)
        else:
            if args.every != 1:
                raise ValueError("--every selects prompts of an answer set: give --from-answers DIR")
            if args.prompts is None:
                args.prompts = 12
            result = _record(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"specloop stream record: {err}", file=sys.stderr)
        return 2
    for note in result.get("redone", []):
        same = {True: "byte-identical to the original", False: "NOT byte-identical to the original (this "
                "environment records other bytes)", None: "its entry had no sha256 to compare"}[note["identical"]]
        print(f"specloop stream record: {args.out}/{note['file']} was missing or damaged and was recorded again "
              f"({same})", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    positions = sum(s["positions"] for s in result["shards"])
    check = result.get("check", {})
    print(f"recorded {sum(s['prompts'] for s in result['shards'])} prompts, {positions} positions, "
          f"{sum(s['new_tokens'] for s in result['shards'])} new tokens into {args.out}")
    if result.get("positions_per_s"):
        print(f"rebuilt from {args.from_answers}: {result['positions_per_s']:.1f} positions/s (teacher-forced prefill)")
    if result["tokens_per_s"]:
        print(f"generation: {result['tokens_per_s']:.1f} new tokens/s (batch {args.batch_size})")
    print(f"total size: {result['total_bytes'] / 2**20:.1f} MiB ({result['total_bytes'] / max(positions, 1):.0f} "
          "bytes per position)")
    if check:
        print(f"batch-1 check: {check['matching']}/{len(check['stream_indices'])} continuations equal; "
              f"divergent: {check['divergent'] or 'none'}")
    return 0
