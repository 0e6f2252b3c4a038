"""`specloop simulate online` and `specloop simulate regret-sweep`.

    specloop simulate online --scenario stationary|piecewise|smooth|fast
        --learner fixed|ogd|optimistic|ensemble|optimistic-ensemble|osd --rounds T [--json]
        (learner aliases of `specloop.strategies.registry` work too: opt, ens, optens)
    specloop simulate regret-sweep [--json] [--quick]

``online`` runs one learner on one stream (`specloop.sim.online.run_online`) and
prints its summary and, per window of rounds, the regret increments, mean accepted
length and speedup. JSON: {"summary": {...}, "windows": [...]} with summary keys
scenario, learner, rounds, seed, dynamic_regret (comparator: best draft in the
ball), dynamic_regret_exact (comparator: exact match, sum KL), path_length,
target_path_length, hint_error, gradient_bound, radius, num_draft_tokens,
cost_ratio, mean_accepted_length, mean_accepted_length_sampled, acceptance_rate,
speedup, speedup_sampled, speedup_lower_bound, speedup_upper_bound.

``regret-sweep`` runs T over a geometric range for every scenario x learner x seed
(`specloop.sim.online.regret_sweep`), fits the regret growth exponents and prints
them beside the exponents of Corollaries 1-3 and Theorem 1's speedup lower bound
beside the measured speedup. JSON: a list of rows with keys scenario, learner,
exponent, predicted_exponent, regret_at_max_T, speedup, speedup_lower_bound (and
diagnostics: exponent_exact, path_length_exponent, hint_error_exponent, ...).

Both exit 1 when a measured expected speedup falls below Theorem 1's lower bound or
above its upper bound (the theorem is exact for the expected speedup computed here,
so this is a real check), 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

__all__ = ["register"]

QUICK_ROUNDS = (24, 48, 96, 192)
DEFAULT_ROUNDS = (100, 200, 400, 800, 1600)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from exc
    if len(values) < 2 or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError(f"need >= 2 horizons T >= 2, got {text!r}")
    return values


def _environment_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab", type=_positive_int, default=32, help="vocabulary size V")
    parser.add_argument("--contexts", type=_positive_int, default=1, help="number of contexts C")
    parser.add_argument("--rank", type=int, default=2, help="rank r of the low-rank draft")
    parser.add_argument("--radius", type=float, default=3.0, help="radius D of the parameter ball")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per round k")
    parser.add_argument("--cost-ratio", type=float, default=0.05, help="a / A")


def _setup_kwargs(args) -> dict:
    return {"vocab_size": args.vocab, "num_contexts": args.contexts, "rank": args.rank,
            "radius": args.radius, "num_draft_tokens": args.k, "cost_ratio": args.cost_ratio}


def register(simulate_subparsers) -> None:
    from specloop.sim.online import LEARNERS, ONLINE_SCENARIOS, POLICIES

    online = simulate_subparsers.add_parser(
        "online", help="one online learner on one stream: regret, tau, speedup per window",
        description=__doc__.split("\n\n")[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    online.add_argument("--scenario", choices=ONLINE_SCENARIOS, default="stationary")
    online.add_argument("--learner", type=_learner_name, choices=LEARNERS, default="ogd",
                        help="a learner of the registry (aliases opt, ens, optens, opt-ens accepted)")
    online.add_argument("--rounds", type=_positive_int, default=2000, help="T")
    online.add_argument("--seed", type=int, default=0)
    online.add_argument("--policy", choices=POLICIES, default="fixed",
                        help="draft-length policy (Theorem 1's bounds need 'fixed')")
    online.add_argument("--window", type=_positive_int, default=None,
                        help="rounds per window (default T // 10)")
    online.add_argument("--trace", default=None, help="save the round records to this file")
    online.add_argument("--json", action="store_true")
    _environment_args(online)
    online.set_defaults(func=run_online_cmd)

    sweep = simulate_subparsers.add_parser(
        "regret-sweep", help="regret growth exponents vs Corollaries 1-3, speedup vs Theorem 1",
        description=__doc__.split("\n\n")[3])
    sweep.add_argument("--quick", action="store_true",
                       help=f"T in {QUICK_ROUNDS}, one seed (< 30 s)")
    sweep.add_argument("--rounds", type=_int_list, default=None,
                       help=f"comma-separated horizons (default {','.join(map(str, DEFAULT_ROUNDS))})")
    sweep.add_argument("--seeds", type=_positive_int, default=None, help="seeds per T (default 3)")
    sweep.add_argument("--scenarios", default=",".join(ONLINE_SCENARIOS))
    sweep.add_argument("--learners", default=",".join(LEARNERS))
    sweep.add_argument("--processes", type=_positive_int, default=2)
    sweep.add_argument("--out", default=None, help="also write the JSON rows to this file")
    sweep.add_argument("--json", action="store_true")
    _environment_args(sweep)
    sweep.set_defaults(func=run_sweep_cmd)


def _bounds_ok(speedup: float, lower: float, upper: float) -> bool:
    if math.isnan(lower):
        return True
    return lower - 1e-9 <= speedup <= upper + 1e-9


def run_online_cmd(args) -> int:
    from specloop.sim.online import OnlineSetup, build_problem, make_policy, run_online

    setup = OnlineSetup(args.scenario, args.rounds, seed=args.seed, window=args.window,
                        **_setup_kwargs(args))
    policy = make_policy(args.policy, args.k, args.cost_ratio, args.rounds, seed=args.seed)
    result = run_online(build_problem(setup), args.learner, policy=policy)
    if args.trace:
        result.trace.save(args.trace)
    summary, windows = result.summary(), result.windows()
    if args.json:
        print(json.dumps({"summary": summary, "windows": windows}, indent=2))
    else:
        _print_online(summary, windows)
    ok = _bounds_ok(summary["speedup"], summary["speedup_lower_bound"], summary["speedup_upper_bound"])
    if not ok:
        print("specloop: check failed: speedup outside Theorem 1's bounds", file=sys.stderr)
    return 0 if ok else 1


def _print_online(summary: dict, windows: list[dict]) -> None:
    from rich.table import Table

    console = _console()
    head = Table(title=f"online {summary['learner']} on {summary['scenario']} "
                       f"(T={summary['rounds']}, mean k={summary['num_draft_tokens']})")
    head.add_column("quantity")
    head.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, float):
            head.add_row(key, f"{value:.4g}")
    console.print(head)
    table = Table(title="per window")
    for col in ("rounds", "regret (ball)", "regret (exact)", "tau", "acceptance", "speedup"):
        table.add_column(col, justify="right")
    for w in windows:
        table.add_row(f"{w['start']}-{w['end']}", f"{w['dynamic_regret']:.3f}",
                      f"{w['dynamic_regret_exact']:.3f}", f"{w['mean_accepted_length']:.3f}",
                      f"{w['acceptance_rate']:.3f}", f"{w['speedup']:.3f}")
    console.print(table)


def _console():
    """A rich console that keeps table rows on one line when output is piped."""
    from rich.console import Console
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _learner_name(text: str) -> str:
    """A learner alias -> its registered name; other text unchanged (argparse's
    ``choices`` then rejects an unknown name with exit 2)."""
    from specloop.strategies.registry import resolve_learner
    try:
        return "fixed" if text.strip() == "fixed" else resolve_learner(text)
    except ValueError:
        return text


def _names(text: str, allowed, resolve=None) -> tuple[str, ...]:
    names = tuple((resolve or str)(n.strip()) for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if not names or unknown:
        raise ValueError(f"unknown name(s) {unknown or text!r}; choose from {', '.join(allowed)}")
    return names


def run_sweep_cmd(args) -> int:
    from specloop.sim.online import LEARNERS, ONLINE_SCENARIOS, SweepConfig, regret_sweep

    from specloop.cli._paths import check_paths
    check_paths(args, out_files=("out",))
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    seeds = args.seeds or (1 if args.quick else 3)
    config = SweepConfig(scenarios=_names(args.scenarios, ONLINE_SCENARIOS),
                         learners=_names(args.learners, LEARNERS, _learner_name), rounds_list=tuple(rounds),
                         seeds=tuple(range(seeds)), processes=args.processes,
                         setup_kwargs=_setup_kwargs(args))
    rows = regret_sweep(config)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_sweep(rows)
    bad = [r for r in rows if not _bounds_ok(r["speedup"], r["speedup_lower_bound"],
                                             r["speedup_upper_bound"])]
    for r in bad:
        print(f"specloop: check failed: {r['scenario']}/{r['learner']} speedup {r['speedup']:.4f} "
              f"outside Theorem 1 [{r['speedup_lower_bound']:.4f}, {r['speedup_upper_bound']:.4f}]",
              file=sys.stderr)
    return 1 if bad else 0


def _print_sweep(rows: list[dict]) -> None:
    from rich.table import Table

    table = Table(title=f"regret growth Reg_T ~ T^e (T = {rows[0]['rounds_list']}, "
                        f"{rows[0]['seeds']} seed(s))")
    for col in ("scenario", "learner", "corollary", "e fitted", "e predicted", "b (P_T)",
                "h (delta_T)", "Reg_T max", "speedup", "Thm 1 lower"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["scenario"], r["learner"], r["corollary"], f"{r['exponent']:.2f}",
                      f"{r['predicted_exponent']:.2f}", f"{r['path_length_exponent']:.2f}",
                      f"{r['hint_error_exponent']:.2f}", f"{r['regret_at_max_T']:.1f}",
                      f"{r['speedup']:.3f}", f"{r['speedup_lower_bound']:.3f}")
    _console().print(table)
