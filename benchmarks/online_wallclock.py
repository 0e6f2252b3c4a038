"""Live wall-clock of online updates on SmolLM2-135M (`specloop.realmodels.streams.live_wallclock`):
frozen draft, serial updates, background updates with decoding and updates on one core
each, background on both cores, background publishing every N updates; the same held-out
prompts in the same order for every row, rows interleaved per chunk.

Prompts: every ``--every``-th prompt of a committed answer set (default the held-out
ShareGPT stream, 400 code -> 400 writing -> 400 chat; ``--every 12`` gives 100 prompts in
all three domains), ``--max-new-tokens`` from the set. Resumable in chunks
(``--budget-minutes``: exit 3 when it stops early; rerun the same command)::

    OMP_NUM_THREADS=2 python benchmarks/online_wallclock.py --method opt-hydra --dtype float32 \\
        --every 12 --budget-minutes 150 --out results/online_wallclock/opt-hydra-float32.json

Writes JSON: settings, machine, the 1-minute load over the run, and per row
``tokens_per_s``, ``tau``, ``update_cost_fraction``, ``update_cpu_fraction`` and, for online
rows, ``wallclock_vs_frozen`` / ``wallclock_vs_frozen_ci`` (geometric mean of per-prompt
tokens/s ratios to the frozen row, 95 % interval); ``cost_model``: each online row's speedup
predicted by `specloop.theory.online_cost` from its measured parts beside the measured one
(`live_wallclock.cost_model_check`); ``gpu_prediction``: the measured tau gain at the update
shares the paper's Tables 1 and 6 imply for its A800 deployment (`gpu_prediction`);
``what_would_pay``: the update share of a round that would reach 1.05x at the measured gain,
and the serial speedup at rarer updates (`what_would_pay`). Exit 2 on bad input, 1 when an
online row's output differed from the frozen row's (greedy decoding must be lossless).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", default=str(REPO / "data" / "answers" / "sharegpt-heldout-1200"))
    parser.add_argument("--every", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=None, help="the first N of the kept prompts")
    parser.add_argument("--method", default="opt-hydra", help="online method, e.g. opt-hydra, ens-eagle3")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--publish-every", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("-k", "--num-draft-tokens", type=int, default=4)
    parser.add_argument("--mode", choices=["round", "chunk"], default="round")
    parser.add_argument("--update-every", type=int, default=None,
                        help="round mode: one learner step every N rounds (default: every round)")
    parser.add_argument("--ensemble-losses", choices=["exact", "linearised"], default="exact",
                        help="ensembles (ens-eagle3): exact = each base learner's own loss (the paper); "
                             "linearised = one gradient a round (the Ader / Sword++ surrogate, about half the cost)")
    parser.add_argument("--budget-minutes", type=float, default=None)
    parser.add_argument("--out", default="results/online_wallclock/result.json")
    return parser


#: OnlineSpec (Vicuna-7B on A800s): speedup over the frozen draft without training (Table 1)
#: and with training time added (Table 6), per method and dataset
PAPER_SPEEDUPS = {"opt-hydra": {"Code-Search": (1.31, 1.02), "Alpaca-Finance": (1.55, 1.05)},
                  "ens-eagle3": {"Code-Search": (1.18, 1.07), "Alpaca-Finance": (1.27, 1.13)}}


def gpu_prediction(result: dict, method: str) -> dict:
    """What the live rows predict for a deployment like the paper's: the serial update
    share there is implied by its two speedups (`theory.online_cost.implied_update_share`,
    derived, not measured here); the tau gain g is this run's serial row (measured here,
    assumed to carry over to a 7B target); serial on the paper's hardware
    (1 + g) / (1 + rho), on a separate device 1 + g (publishing assumed free, updates
    landing every round); and the gain the paper's update share needs to break even."""
    from specloop.realmodels.streams.live_wallclock import frozen_row
    from specloop.theory.online_cost import implied_update_share, serial_speedup
    serial = next((row for row in result["rows"].values() if row.get("method") and not row["background"]), None)
    if serial is None or method not in PAPER_SPEEDUPS:
        return {}
    frozen = frozen_row(result)[1]
    gain = serial["tau"] / frozen["tau"] - 1
    out = {"gain_measured_here": gain, "separate_device": 1 + gain, "datasets": {}}
    for name, (s_inf, s_train) in PAPER_SPEEDUPS[method].items():
        share = implied_update_share(s_inf, s_train)
        rho = share["update_seconds_per_inference_second"]
        out["datasets"][name] = {**share, "paper_speedups": [s_inf, s_train],
                                 "serial_predicted": serial_speedup(1.0, 0.0, rho, gain),
                                 "serial_break_even_gain": rho}
    return out


#: the committed replay of the gain against the update interval (off-domain Hydra, 150 prompts)
UPDATE_EVERY = REPO / "results" / "stream_scale_update_every"
#: the speedup issue's target: online at least this many times the frozen draft's tokens/s
TARGET_SPEEDUP = 1.05


def _replay_gain_curve(folder: Path = UPDATE_EVERY):
    """`GainCurve` of Opt-Hydra's paired tau gain against the update interval, from the
    committed replays ``summary-off-domain-update-every-M.json`` (None if absent)."""
    from specloop.theory.online_cost import GainCurve
    points = []
    for path in sorted(folder.glob("summary-off-domain-update-every-*.json")):
        summary = json.loads(path.read_text(encoding="utf-8"))
        methods = summary.get("methods") or summary["off-domain"]["methods"]
        points.append((int(path.stem.rsplit("-", 1)[1]), float(methods["opt-hydra"]["vs_frozen"]["gain"])))
    return GainCurve.from_points(points) if points else None


def what_would_pay(cost_model: dict, gain_curve=None, intervals=(1, 2, 4, 8, 16, 32)) -> dict:
    """From the serial row's measured parts: the update seconds per round that would
    reach `TARGET_SPEEDUP` at the measured gain ((1 + g) / S - 1 of the round, when
    positive), and the serial speedup (1 + g(m)) (v + d) / (v + d + c + u / m) at other
    update intervals m (c: sample collection, every round; u: the learner step), with the measured gain (constant in m: an upper bound) and with
    the replay's gain curve g(m) (`_replay_gain_curve`: measured off-domain)."""
    from specloop.theory.online_cost import serial_speedup
    serial = next((c for c in cost_model.values() if c["placement"] == "serial"), None)
    if serial is None:
        return {}
    vd, gain = serial["verify_plus_draft_seconds_per_round"], serial["gain"]
    collect = max(0.0, serial["decoder_online_seconds_per_round"])       # every round, whatever m
    step = serial["update_seconds_per_step"] * serial["steps_per_round"]   # once per m rounds
    needed = (1 + gain) / TARGET_SPEEDUP - 1

    def at(m: int, g: float) -> float:
        return serial_speedup(vd, 0.0, collect + step / m, g)
    out = {"sample_seconds_per_round": collect, "step_seconds_per_round": step,
           "verify_plus_draft_seconds_per_round": vd, "gain": gain, "update_share_of_round": (collect + step) / vd,
           "update_share_needed": needed if needed > 0 else None,
           "by_interval_measured_gain": {m: at(m, gain) for m in intervals}}
    if gain_curve is not None:
        out["by_interval_replay_curve"] = {m: at(m, gain_curve(m)) for m in intervals}
        out["replay_curve_points"] = dict(zip(gain_curve.intervals, gain_curve.gains))
    return out


def _online_settings(args) -> dict:
    """The online rows' `OnlineConfig` fields; ``update_every`` only when given and
    ``ensemble_losses`` only when not the paper's exact losses, so that runs written
    before the flags existed keep their settings (and resume)."""
    return {"mode": args.mode, **({} if args.update_every is None else {"update_every": args.update_every}),
            **({} if args.ensemble_losses == "exact" else {"ensemble_losses": args.ensemble_losses})}


def _prompts(folder: str, every: int, limit: int | None):
    from specloop.realmodels.answers.answer_set import open_answer_set
    answers = open_answer_set(folder)
    kept = [r for i, r in enumerate(answers.records()) if i % every == 0]
    kept = kept[:limit] if limit else kept
    return answers, [[int(t) for t in r["prompt"]] for r in kept], [r["dataset"] for r in kept]


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.every < 1 or args.chunk < 1 or any(v is not None and v < 1 for v in (args.prompts, args.update_every)):
        print("error: --every, --chunk, --prompts and --update-every must be >= 1", file=sys.stderr)
        return 2
    try:
        from specloop.realmodels.streams.runner import resolve_method
        spec = resolve_method(args.method)
        if spec.learner is None:
            raise ValueError(f"{args.method} is a frozen draft; name an online method")
        answers, prompts, domains = _prompts(args.answers, args.every, args.prompts)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from tqdm.auto import tqdm

    from specloop.realmodels.loading import load_model
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.streams.live_wallclock import cost_model_check, default_rows, run_live_wallclock
    from specloop.report.machine import LoadMonitor, machine_info
    target = load_model(answers.settings["target"], dtype=args.dtype)
    rows = default_rows(spec.name, cores=args.cores, publish_every=args.publish_every)
    out = Path(args.out)
    deadline = None if args.budget_minutes is None else time.time() + 60 * args.budget_minutes
    bar = tqdm(total=len(prompts) * len(rows), desc="rows x prompts", unit="prompt", file=sys.stderr)
    with LoadMonitor() as load:
        result = run_live_wallclock(
            target, prompts, rows, make_drafter=lambda kind: make_drafter(kind or spec.drafter, target,
                                                                          train_if_missing=False, progress=False),
            chunk=args.chunk, max_new_tokens=int(answers.settings["max_new_tokens"]),
            num_draft_tokens=args.num_draft_tokens, online=_online_settings(args), progress=bar.update,
            state_dir=out.with_suffix(".state"), deadline=deadline)
    bar.close()
    result.update(settings={**vars(args), "domains": sorted(set(domains)), "prompts_total": len(prompts)},
                  machine=machine_info(), load=load.summary, cost_model=cost_model_check(result, args.chunk),
                  gpu_prediction=gpu_prediction(result, spec.name))
    result["what_would_pay"] = what_would_pay(result["cost_model"], _replay_gain_curve())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    for name, row in result["rows"].items():
        vs = row.get("wallclock_vs_frozen")
        extra = "" if vs is None else (f"  x{vs:.3f} [{row['wallclock_vs_frozen_ci'][0]:.3f}, "
                                       f"{row['wallclock_vs_frozen_ci'][1]:.3f}]  update share "
                                       f"{row['update_cost_fraction']:.2f}")
        print(f"{name:32s} {row['tokens_per_s']:7.2f} tok/s  tau {row['tau']:.3f}{extra}")
    for name, check in result["cost_model"].items():
        print(f"cost model {name:21s} {check['placement']:18s} predicted {check['predicted']:.3f}  "
              f"measured {check['measured']:.3f} (total tokens/s ratio)")
    print(f"wrote {out} ({result['prompts']} of {len(prompts)} prompts)")
    if not result["outputs_equal"]:
        return 1
    return 0 if result["complete"] else 3


if __name__ == "__main__":
    sys.exit(main())
