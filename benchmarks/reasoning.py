"""Lookahead Reasoning / Online-LR at CPU scale: the OnlineSpec Table 2 layout
(rows Target, Draft, LR, OSD-LR, Online-LR; per task AvgLen (speedup) and accuracy),
the cheap judges' agreement with the model judge, and the cost of the target's
batch-gamma forward against a batch-1 forward (Fu et al. 2025; OnlineSpec
Sec. 3.1, Eq. 2, Table 2, Table 10, App. B.10).

AvgLen = steps committed per LR round (accepted draft steps + the target's step;
1.00 for a model alone). Speedup = committed target tokens per decoding second over
the target row's (chunk-end draft updates excluded; with them: ``speedup_with_training``).
LR is lossy: accuracy sits next to every speed number.

Quality and speed: ``--batch-prompts B`` serves B prompts of a chunk in lockstep
(`specloop.realmodels.reasoning.lockstep`) for accepted steps, AvgLen and accuracy,
and ``--timed N`` prompts spread over the stream are served again alone: tokens/s,
speedups (paired per prompt against the Target row, 95 % interval) and the phase
seconds come from those batch-1 runs only.

Verdicts (`verdicts`, each with its effect, interval and n; *undecided* where the
interval says so): Online-LR > LR > OSD-LR in AvgLen (paired per-prompt AvgLen
ratios) and in speed (paired per-prompt tokens/s ratios on the timed prompts); LR >=
1.2x the Target; LR's and Online-LR's accuracy within 3 points of the Target's
(paired per-prompt difference in points).

Small check (about 10 CPU minutes with the default models):
    python benchmarks/reasoning.py --prompts 6 --max-new-tokens 96 --json --out results/reasoning_small.json
Full run (the stated size: >= 100 prompts, >= 50 per task with accuracy; many CPU hours here):
    python benchmarks/reasoning.py --tasks arith,gsm8k --prompts 100 --max-new-tokens 512 \\
        --batch-prompts 4 --timed 20 --json --out results/reason/table2.json
Resumable: the per-method records live in ``--work`` (default next to ``--out``).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specloop.cli.reason_cmd import _clean, build_stream, timed_indices  # noqa: E402
from specloop.report.machine import machine_info  # noqa: E402
from specloop.realmodels.loading import load_model  # noqa: E402
from specloop.realmodels.reasoning.expansion import CommittedCache, expand_steps  # noqa: E402
from specloop.realmodels.reasoning.judge import (ExactMatchJudge, HiddenStateJudge, judge_agreement,  # noqa: E402
                                                 make_judge)
from specloop.realmodels.reasoning.runner import (METHODS, ReasonConfig, ReasonRunner, add_speedups,  # noqa: E402
                                                  read_records, timed_rows)
from specloop.realmodels.reasoning.steps import DELIMITERS, StepRule  # noqa: E402
from specloop.stats import decide, difference_estimate, ratio_estimate  # noqa: E402


class _Recorded:
    """The model judge's verdicts as recorded in the LR records (no recomputation)."""

    name = "recorded-model"

    def __init__(self, pairs, scores, threshold):
        self.table = {tuple(p): s for p, s in zip(pairs, scores)}
        self.threshold = threshold

    def verdicts(self, pairs):
        return [self.table[tuple(p)] >= self.threshold for p in pairs]


def judge_agreements(work: Path, target, threshold: float) -> dict:
    """Agreement and precision of the exact-match and hidden-state judges against the
    model judge (the target) on every pair the LR run judged, and each judge's cost in
    seconds a pair (the model judge's from the batch-1 LR rows' judge seconds, the
    others timed here over all pairs)."""
    pairs, scores = [], []
    for record in read_records(work / "lr" / "records.jsonl"):
        pairs.extend(tuple(p) for p in record["judged"])
        scores.extend(s for row in record["judge_scores"] for s in row)
    if not pairs:
        return {"pairs": 0}
    reference = _Recorded(pairs, scores, threshold)
    timed = [{"judge": r["timing"]["judge"], "pairs": r.get("judged_pairs", len(r.get("judged", [])))}
             for r in _timed_rows(work, "lr")]
    judged = sum(t["pairs"] for t in timed)
    out = {"pairs": len(pairs), "model_accept_rate": sum(reference.verdicts(pairs)) / len(pairs),
           "model": {"seconds_per_pair": sum(t["judge"] for t in timed) / judged if judged else None,
                     "timed_pairs": judged}}
    for name, judge in (("exact", ExactMatchJudge()), ("hidden", HiddenStateJudge(target))):
        start = time.perf_counter()
        out[name] = judge_agreement(judge, reference, pairs)
        out[name]["seconds_per_pair"] = (time.perf_counter() - start) / len(pairs)
    return out


def _per_prompt(work: Path, method: str) -> dict:
    """{index: (AvgLen, correct or None)} over a method's records, and {index: tokens/s}
    over its batch-1 rows."""
    records = read_records(work / method / "records.jsonl")
    quality = {r["index"]: (sum(r["committed_per_round"]) / r["rounds"] if r["rounds"] else None, r["correct"])
               for r in records}
    speed = {r["index"]: r["target_tokens"] / r["timing"]["seconds"] for r in _timed_rows(work, method)
             if r["timing"]["seconds"] > 0}
    return {"quality": quality, "speed": speed}


def _ratio_claim(statement, mine: dict, ref: dict, claimed_size=None) -> dict:
    keys = sorted(k for k in set(mine) & set(ref) if mine[k] and ref[k])
    if len(keys) < 2:
        return {"statement": statement, "verdict": "undecided", "n": len(keys), "effect": None, "interval": None}
    est = ratio_estimate([mine[k] / ref[k] for k in keys], statement)
    return {"statement": statement, "effect": est.effect, "interval": list(est.interval), "n": est.n,
            "verdict": decide(est.effect, est.interval, est.n, "greater", claimed_size=claimed_size, null=1.0)}


def verdicts(work: Path, methods: list[str]) -> list[dict]:
    """The paper's Table 2 claims (module docstring), each decided by its interval."""
    data = {m: _per_prompt(work, m) for m in methods}
    avglen = {m: {k: v[0] for k, v in d["quality"].items()} for m, d in data.items()}
    out = []
    for better, worse in (("online-lr", "lr"), ("lr", "osd-lr")):
        if better in data and worse in data:
            out.append(_ratio_claim(f"{better} > {worse} in AvgLen", avglen[better], avglen[worse]))
            out.append(_ratio_claim(f"{better} > {worse} in tokens/s", data[better]["speed"], data[worse]["speed"]))
    if "lr" in data and "target" in data:
        out.append(_ratio_claim("lr >= 1.2x the target", data["lr"]["speed"], data["target"]["speed"], 1.2))
    for method in ("lr", "online-lr"):
        if method in data and "target" in data:
            mine, ref = data[method]["quality"], data["target"]["quality"]
            keys = [k for k in sorted(set(mine) & set(ref)) if mine[k][1] is not None and ref[k][1] is not None]
            statement = f"{method} accuracy within 3 points of the target"
            if len(keys) < 2:
                out.append({"statement": statement, "verdict": "undecided", "n": len(keys)})
                continue
            est = difference_estimate([100.0 * (mine[k][1] - ref[k][1]) for k in keys], statement)
            out.append({"statement": statement, "effect": est.effect, "interval": list(est.interval), "n": est.n,
                        "verdict": decide(est.effect, est.interval, est.n, "greater", claimed_size=-3.0)})
    return out


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def batch_cost(target, gamma: int, context: int = 256, repeats: int = 5) -> dict:
    """Seconds of one decode forward at batch 1 vs batch gamma over a ``context``-token
    cache, and of one step expansion (16 tokens, no delimiter) of 1 vs gamma prefixes."""
    from specloop.realmodels.kvcache import _cache_kwarg
    model, tok = target.model, target.tokenizer
    ids = torch.randint(100, 5000, (context,)).tolist()
    base = CommittedCache(model, ids)

    def forward(batch):
        import copy
        cache = copy.deepcopy(base.cache)
        if batch > 1:
            cache.batch_repeat_interleave(batch)
        with torch.inference_mode():
            model(input_ids=torch.full((batch, 1), ids[-1]), position_ids=torch.full((batch, 1), context - 1),
                  use_cache=True, **{_cache_kwarg(model): cache})

    rule = StepRule("\u0000never", 16, "cost")
    prefixes = [ids] + [ids + ids[5:5 + 4 * i] for i in range(1, gamma)]
    one = _median_seconds(lambda: forward(1), repeats)
    many = _median_seconds(lambda: forward(gamma), repeats)
    exp1 = _median_seconds(lambda: expand_steps(model, tok, prefixes[:1], rule, eos_ids=set(), base=base), 2)
    expg = _median_seconds(lambda: expand_steps(model, tok, prefixes, rule, eos_ids=set(), base=base), 2)
    return {"context_tokens": context, "gamma": gamma, "forward_batch1_s": one, "forward_batch_gamma_s": many,
            "batch_gamma_over_batch1": many / one, "expand_1_prefix_16_tokens_s": exp1,
            "expand_gamma_prefixes_16_tokens_s": expg, "expand_gamma_over_1": expg / exp1,
            "target_tokens_per_s_batch1_decode": 1.0 / one}


def _timed_rows(work: Path, method: str) -> list[dict]:
    """A method's batch-1 rows: records served alone plus its timing rows."""
    return timed_rows(read_records(work / method / "records.jsonl"), read_records(work / method / "timing.jsonl"))


def cost_model(work: Path, gamma: int, batch: dict | None) -> dict | None:
    """`specloop.theory.lookahead_cost` with the inputs measured on the batch-1 rows:
    step length, draft seconds a step, judge seconds a pair, commit seconds a round and
    the judge's acceptance rate from the LR row; the target's seconds a token from the
    Target row; beta(gamma) from ``batch`` (`batch_cost`). Returns the predicted
    speedup beside the measured one, the most LR could give (p = 1), the break-even
    acceptance rate, and the same with beta = 1 (a memory-bound accelerator); None
    without timed LR and Target rows."""
    from specloop.theory.lookahead_cost import (LookaheadCosts, break_even_acceptance, lookahead_speedup,
                                                max_speedup)
    lr, target = _timed_rows(work, "lr"), _timed_rows(work, "target")
    if not lr or not target or batch is None:
        return None
    def total(rows, key):
        return sum(r["timing"].get(key, 0.0) for r in rows)
    steps = sum(sum(r["committed_per_round"]) for r in lr)
    judged = sum(r.get("judged_pairs", len(r.get("judged", []))) for r in lr)
    drafted = sum(sum(r["drafted_per_round"]) for r in lr if "drafted_per_round" in r)
    rounds = sum(r["rounds"] for r in lr)
    t_decode = total(target, "seconds") / sum(r["target_tokens"] for r in target)
    costs = LookaheadCosts(step_tokens=sum(r["target_tokens"] for r in lr) / steps, t_decode=t_decode,
                           batch_ratio=max(1.0, batch["batch_gamma_over_batch1"]),
                           t_draft=total(lr, "draft") / max(drafted, 1), t_judge=total(lr, "judge") / max(judged, 1),
                           t_commit=total(lr, "commit") / max(rounds, 1))
    # p from the judge's sequence: accepted pairs over accepted + the one rejection of each
    # round that did not accept every drafted step (right whether or not the judge scored
    # the pairs after a rejection, as a batch_all judge does)
    accepted = sum(sum(r["accepted_per_round"]) for r in lr)
    rejections = sum(a < d for r in lr if "drafted_per_round" in r
                     for a, d in zip(r["accepted_per_round"], r["drafted_per_round"]))
    accept = accepted / max(accepted + rejections, 1)
    measured = (sum(r["target_tokens"] for r in lr) / total(lr, "seconds")) / (1.0 / t_decode)
    ideal = LookaheadCosts(costs.step_tokens, costs.t_decode, 1.0, costs.t_draft, costs.t_judge, costs.t_commit)
    return {"inputs": {**costs.__dict__, "acceptance_rate": accept, "gamma": gamma, "timed_lr_prompts": len(lr)},
            "predicted_speedup": lookahead_speedup(accept, gamma, costs), "measured_speedup": measured,
            "max_speedup_all_accepted": max_speedup(gamma, costs),
            "break_even_acceptance": break_even_acceptance(gamma, costs),
            "with_batch_ratio_1": {"predicted_speedup": lookahead_speedup(accept, gamma, ideal),
                                   "max_speedup_all_accepted": max_speedup(gamma, ideal),
                                   "break_even_acceptance": break_even_acceptance(gamma, ideal)}}


def _cell(block: dict) -> dict:
    return {"avg_len": block.get("avg_accepted_steps"), "speedup": block.get("speedup"),
            "accuracy": block.get("accuracy"), "accuracy_ci": block.get("accuracy_ci"),
            "finished": block.get("finished"), "tokens_per_s": block.get("tokens_per_s"),
            "prompts": block.get("prompts"), "timed_prompts": block.get("timed_prompts")}


def table(summaries: dict) -> list[dict]:
    rows = []
    for method, s in summaries.items():
        rows.append({"method": s["label"], "overall": _cell(s),
                     "speedup_paired": s.get("speedup_paired"), "speedup_paired_ci": s.get("speedup_paired_ci"),
                     "speedup_paired_n": s.get("speedup_paired_n"), "update_seconds": s.get("update_seconds"),
                     "lockstep_mismatches": s.get("lockstep_mismatches"),
                     "tasks": {t: _cell(b) for t, b in s["tasks"].items()},
                     "speedup_with_training": (s["tokens_per_s_with_training"] / summaries["target"]["tokens_per_s"]
                                               if "target" in summaries else math.nan),
                     "mean_accepted_draft_steps": s.get("mean_accepted_draft_steps"),
                     "mean_accepted_length": s.get("mean_accepted_length"),
                     "phase_seconds": s.get("phase_seconds")})
    return rows


def _fmt(x, spec):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def print_table(rows, tasks, file=sys.stderr) -> None:
    head = "".join(f" | {t:>22} {'Acc':>6}" for t in tasks)
    print(f"{'method':>10}{head}", file=file)
    for row in rows:
        cells = ""
        for t in tasks:
            c = row["tasks"].get(t, {})
            cells += f" | {_fmt(c.get('avg_len'), '.2f'):>8} ({_fmt(c.get('speedup'), '.2f')}x) " \
                     f"{_fmt(c.get('tokens_per_s'), '.2f'):>5}t/s {_fmt(c.get('accuracy'), '.1f'):>6}"
        print(f"{row['method']:>10}{cells}", file=file)


def _phases(work: Path, method: str) -> dict:
    """Seconds per phase summed over the method's batch-1 rows (lockstep timings are shared)."""
    return {k: sum(r["timing"].get(k, 0.0) for r in _timed_rows(work, method))
            for k in ("draft", "target", "judge", "commit")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--tasks", default="arith,humaneval")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--split", choices=["heldout", "tuning"], default="heldout")
    parser.add_argument("--batch-prompts", type=int, default=1, help="prompts of a chunk served in lockstep")
    parser.add_argument("--timed", type=int, default=20, help="prompts served alone for timing (lockstep runs)")
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="stop within this many minutes at a lockstep-group boundary: a group starts only when "
                             "it is predicted to end in time (exit 3; rerun to go on)")
    parser.add_argument("--chunk", type=int, default=25)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-step-tokens", type=int, default=None)
    parser.add_argument("--step-delimiter", choices=list(DELIMITERS), default=None,
                        help="step boundary for every task (default: each task's rule)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--token-spec", action="store_true")
    parser.add_argument("--judge-kind", choices=["model", "exact", "hidden"], default="model")
    parser.add_argument("--lr", type=float, default=5e-7)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--work", default=None, help="results folder of the runs (default <out>.runs)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default="results/reasoning.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    work = Path(args.work) if args.work else out.with_suffix(".runs")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    items = build_stream(args.tasks, args.prompts, split=args.split)
    timing = timed_indices(len(items), args.timed) if args.batch_prompts > 1 else None
    config = ReasonConfig(chunk=args.chunk, num_draft_steps=args.gamma, max_new_tokens=args.max_new_tokens,
                          max_step_tokens=args.max_step_tokens, step_delimiter=args.step_delimiter,
                          repetition_penalty=args.repetition_penalty,
                          token_spec=args.token_spec, lr=args.lr, epochs=args.epochs)
    start = time.perf_counter()
    target, draft = load_model(args.target), load_model(args.draft)
    judge = make_judge(args.judge_kind, target)
    runner = ReasonRunner(target, draft, items, work, config, judge=judge)
    summaries = {}
    deadline = None if args.budget_minutes is None else time.time() + 60 * args.budget_minutes
    for method in methods:
        print(f"[reasoning] {method} ...", file=sys.stderr, flush=True)
        summaries[method] = runner.run_method(method, batch_prompts=args.batch_prompts, timing_prompts=timing,
                                              deadline=deadline)
        summaries[method]["phase_seconds"] = _phases(work, method)
        if summaries[method]["prompts"] < len(items):
            print(f"[reasoning] budget spent: {method} at {summaries[method]['prompts']} of {len(items)} prompts; "
                  "rerun the same command to continue", file=sys.stderr)
            return 3
    add_speedups(summaries)
    result = {"config": {**config.__dict__, "target": args.target, "draft": args.draft, "tasks": args.tasks,
                         "split": args.split, "prompts": len(items), "judge": f"{args.judge_kind} ({args.target})",
                         "batch_prompts": args.batch_prompts, "timed": timing if timing is not None else "all",
                         "machine": machine_info()},
              "table": table(summaries),
              "judge_agreement": (judge_agreements(work, target, judge.threshold)
                                  if "lr" in summaries and args.judge_kind == "model" else None),
              "verdicts": verdicts(work, methods),
              "batch_cost": None if args.skip_cost else batch_cost(target, args.gamma),
              "cost_model": None,
              "summaries": summaries, "wall_seconds": time.perf_counter() - start}
    result["cost_model"] = cost_model(work, args.gamma, result["batch_cost"])
    print_table(result["table"], sorted({i.task for i in items}))
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_clean(result), indent=1, default=lambda o: None)
    out.write_text(text, encoding="utf-8")
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
