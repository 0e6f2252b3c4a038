"""``specloop answers``: the target's greedy answers to a prompt list, as committed inputs.

``specloop answers generate --out DIR``: continuously batched greedy generation
(`specloop.realmodels.answers.generator`) in resumable pieces; rerunning the same
command continues a killed or budget-stopped run (``--budget-minutes``), and a folder
made with other settings, another target or tokenizer is refused (exit 2).

``specloop answers info DIR [--json]``: prompts, answer positions, completeness,
split, target fingerprint (every piece verified by its sha256 first).

Format: `specloop.realmodels.answers.answer_set`.
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser("answers", help="generate and inspect answer sets (the target's greedy answers)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="answers_command", metavar="SUBCOMMAND")
    sub.required = True
    gen = sub.add_parser("generate", help="generate (or resume) an answer set",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("--target", default="smollm2-135m", help="target model (registry name, HF id or path)")
    gen.add_argument("--datasets", default="sharegpt",
                     help="comma-separated datasets in domain order (e.g. sharegpt-code,sharegpt-writing,sharegpt-chat), "
                          "or prompt files (.jsonl, .json, .csv, .parquet: rows with 'prompt' or chat 'messages', "
                          "optional 'id', 'domain'; split like a packaged dataset) or datasets in the local Hugging "
                          "Face cache (owner/name[:split])")
    gen.add_argument("--split", choices=["heldout", "warmup", "all"], default="warmup")
    gen.add_argument("--order", choices=["shift", "interleave"], default="shift")
    gen.add_argument("--prompts", type=int, required=True, help="prompts in the set (split over datasets)")
    gen.add_argument("--max-new-tokens", type=int, default=512, help="cap per answer (EOS stops earlier)")
    gen.add_argument("--max-prompt-tokens", type=int, default=512, help="keep the last N prompt tokens")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--batch-size", type=int, default=32, help="decode slots (rows per forward)")
    gen.add_argument("--piece-size", type=int, default=128, help="prompts per piece file")
    gen.add_argument("--budget-minutes", type=float, default=None,
                     help="stop cleanly at the piece boundary before this budget is passed")
    gen.add_argument("--out", required=True, help="answer set folder (resumable)")
    gen.add_argument("--json", action="store_true", help="print one JSON object (the manifest plus rates)")
    gen.set_defaults(func=run_generate)
    info = sub.add_parser("info", help="summarise (and verify) an answer set")
    info.add_argument("folder", help="answer set folder")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=run_info)


def _settings(args, threads: int):
    from specloop.realmodels.answers.answer_set import AnswerSettings
    for name in ("prompts", "max_new_tokens", "max_prompt_tokens", "batch_size", "piece_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        raise ValueError(f"--budget-minutes must be > 0, got {args.budget_minutes}")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    return AnswerSettings(target=args.target, dtype=args.dtype, datasets=datasets, split=args.split,
                          order=args.order, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                          max_prompt_tokens=args.max_prompt_tokens, chat_template=not args.raw,
                          batch_size=args.batch_size, piece_size=args.piece_size, torch_threads=threads)


def run_generate(args) -> int:
    import time
    from pathlib import Path

    import torch

    from specloop.cli._progress import ResumedBar
    from specloop.data.streams import build_stream, stream_prompts
    from specloop.realmodels.answers.run import check_resumable, generate_answer_set
    from specloop.realmodels.loading import load_model
    try:
        from specloop.cli._paths import check_paths
        check_paths(args, out_folders=("out",))
        out = Path(args.out)
        settings = _settings(args, torch.get_num_threads())
        manifest = check_resumable(out, settings) if out.is_dir() else None    # before the model loads
        stream_prompts(settings.datasets, args.prompts, args.order, args.split)  # a bad prompt file: before it too
        target = load_model(args.target, dtype=args.dtype, device=args.device)
        items = build_stream(settings.datasets, args.prompts, target.tokenizer, order=args.order,
                             chat_template=not args.raw, max_prompt_tokens=args.max_prompt_tokens, split=args.split)
        before = 0 if manifest is None else sum(p["answer_positions"] for p in manifest["pieces"])
        bar = ResumedBar("answers", args.json)
        t0 = time.perf_counter()
        try:
            manifest = generate_answer_set(target, items, out, settings, budget_minutes=args.budget_minutes,
                                           progress=bar.progress)
        finally:
            bar.close()
    except (ValueError, FileNotFoundError) as err:
        print(f"specloop answers generate: {err}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    new = sum(p["answer_positions"] for p in manifest["pieces"]) - before
    result = {**manifest, "wall_s": wall, "new_tokens_this_run": new,
              "tokens_per_s": new / wall if wall > 0 else None}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        done = sum(p["prompts"] for p in manifest["pieces"])
        print(f"{done}/{args.prompts} prompts, {sum(p['answer_positions'] for p in manifest['pieces'])} answer "
              f"positions in {out} ({'complete' if manifest['complete'] else 'resume with the same command'}); "
              f"this run: {new} new tokens, {result['tokens_per_s'] or 0:.1f} tokens/s")
    return 0


def run_info(args) -> int:
    from specloop.realmodels.answers.answer_set import answer_set_info
    try:
        info = answer_set_info(args.folder)
    except (ValueError, FileNotFoundError) as err:
        print(f"specloop answers info: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        for key, value in info.items():
            print(f"{key}: {value}")
    return 0
