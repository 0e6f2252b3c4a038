"""Online-LR's DPO learning rate and update interval, chosen on the tuning split
(OnlineSpec Sec. 3.1, Eq. 2, App. B.10: lr 5e-7, one update per chunk of 25 prompts).

Every setting (lr x interval) serves the same tuning stream (``specloop reason
--split tuning``: prompts kept apart from the reported held-out ones) with Online-LR,
beside one frozen LR row; the quality side runs in lockstep (``--batch-prompts``), so
no timing is taken here. Per setting: the judge-accepted draft steps per round per
chunk, over the whole stream and over the prompts after the first update, and the
paired gain over frozen LR on those later prompts (per-prompt ratio of accepted
steps per round, AvgLen: accepted draft steps plus the target's step when one was
appended; geometric mean with a 95 % Student-t interval,
`specloop.stats.ratio_estimate`). The setting picked is the one with the highest
AvgLen gain after the first update; its interval is reported as measured, without a
correction for picking the best of several (read it as optimistic), and the reported
Table 2 row is then run on the held-out prompts, not taken from here.

Resumable (each setting is a runner folder under ``--work``; ``--budget-minutes``
stops within that many minutes at a lockstep-group boundary, a group starting only when it
is predicted to end in time, with exit 3; rerun the same command)::

    OMP_NUM_THREADS=1 python benchmarks/reason_sweep.py --tasks arith,gsm8k --prompts 40 \\
        --lrs 5e-7,1e-5,1e-4 --intervals 20,5 --max-new-tokens 256 --batch-prompts 8 \\
        --work results/reason/sweep --out results/reason/sweep.json

Exit 2 on bad input, 3 when the budget ran out before every setting finished.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the frozen LR row's chunk (reporting only: a frozen draft never updates), fixed so that
#: rerunning with other --intervals reuses it
FROZEN_CHUNK = 20
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be a comma list of numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"--{name} must list numbers > 0, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--tasks", default="arith,gsm8k")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--lrs", default="5e-7,1e-5,1e-4", help="DPO learning rates")
    parser.add_argument("--intervals", default="20,5", help="prompts between draft updates (the chunk)")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--step-delimiter", default="newline")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-prompts", type=int, default=8)
    parser.add_argument("--budget-minutes", type=float, default=None)
    parser.add_argument("--work", default="results/reason/sweep")
    parser.add_argument("--out", default="results/reason/sweep.json")
    return parser


def per_prompt_avglen(records: list[dict]) -> dict[int, float]:
    """{stream index: committed steps per round} of a method's records."""
    return {r["index"]: sum(r["committed_per_round"]) / r["rounds"] for r in records if r["rounds"]}


def setting_row(records: list[dict], frozen: list[dict], interval: int, summary: dict) -> dict:
    """One setting's row: accepted draft steps per round per chunk, AvgLen before and
    after the first update, and the paired AvgLen gain over frozen LR after it."""
    from specloop.stats import decide, ratio_estimate
    mine, ref = per_prompt_avglen(records), per_prompt_avglen(frozen)
    later = sorted(i for i in set(mine) & set(ref) if i >= interval)
    row = {"interval": interval, "prompts": len(records),
           "accepted_draft_steps_per_round_per_chunk": [c["mean_accepted_draft_steps"] for c in summary["per_chunk"]],
           "updates": [c["update"] for c in summary["per_chunk"]],
           "avg_len": summary["avg_accepted_steps"], "later_prompts": len(later)}
    if len(later) >= 2:
        est = ratio_estimate([mine[i] / ref[i] for i in later], "per-prompt AvgLen ratio, online-lr / lr")
        row.update(gain_after_first_update=est.effect - 1.0, gain_ci=[x - 1.0 for x in est.interval],
                   verdict=decide(est.effect, est.interval, est.n, "greater", null=1.0))
    else:
        row.update(gain_after_first_update=None, gain_ci=None, verdict="undecided")
    return row


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        lrs, intervals = _floats(args.lrs, "lrs"), [int(v) for v in _floats(args.intervals, "intervals")]
        from specloop.cli.reason_cmd import _clean, build_stream
        items = build_stream(args.tasks, args.prompts, split="tuning")
        from specloop.realmodels.reasoning.runner import ReasonConfig
        base = ReasonConfig(chunk=FROZEN_CHUNK, num_draft_steps=args.gamma, max_new_tokens=args.max_new_tokens,
                            step_delimiter=args.step_delimiter, epochs=args.epochs)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.reasoning.judge import make_judge
    from specloop.realmodels.reasoning.runner import ReasonRunner, read_records
    from specloop.report.machine import machine_info
    deadline = None if args.budget_minutes is None else time.time() + 60 * args.budget_minutes
    target, draft = load_model(args.target), load_model(args.draft)
    judge = make_judge("model", target)
    work = Path(args.work)
    frozen_runner = ReasonRunner(target, draft, items, work / "frozen", base, judge=judge)
    frozen = frozen_runner.run_method("lr", batch_prompts=args.batch_prompts, deadline=deadline)
    rows, complete = {}, frozen["prompts"] == len(items)
    for interval in intervals:
        for lr in lrs:
            name = f"lr{lr:g}-every{interval}"
            config = replace(base, chunk=interval, lr=lr)
            runner = ReasonRunner(target, draft, items, work / name, config, judge=judge)
            summary = runner.run_method("online-lr", batch_prompts=args.batch_prompts, deadline=deadline)
            complete &= summary["prompts"] == len(items)
            rows[name] = {"lr": lr, **setting_row(read_records(work / name / "online-lr" / "records.jsonl"),
                                                  read_records(work / "frozen" / "lr" / "records.jsonl"),
                                                  interval, summary)}
    scored = {k: v for k, v in rows.items() if v["gain_after_first_update"] is not None}
    best = max(scored, key=lambda k: scored[k]["gain_after_first_update"]) if scored else None
    result = {"config": {**asdict(base), "tasks": args.tasks, "prompts": len(items), "split": "tuning",
                         "lrs": lrs, "intervals": intervals, "machine": machine_info()},
              "frozen_lr": {"avg_len": frozen["avg_accepted_steps"], "prompts": frozen["prompts"],
                            "accepted_draft_steps_per_round_per_chunk":
                                [c["mean_accepted_draft_steps"] for c in frozen["per_chunk"]]},
              "settings": rows, "best": best, "complete": complete}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(result), indent=1), encoding="utf-8")
    for name, row in rows.items():
        gain = row["gain_after_first_update"]
        print(f"{name:>22}: AvgLen {row['avg_len']:.3f}, gain after the first update "
              f"{'-' if gain is None else f'{100 * gain:+.1f} %'} ({row['verdict']})", file=sys.stderr)
    if not complete:
        print("budget spent before every setting finished; rerun the same command to continue", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
