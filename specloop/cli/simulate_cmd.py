"""`specloop simulate chain|tree`: simulate speculative-decoding rounds on a synthetic stream.

    specloop simulate chain --vocab V --k K --scenario S --rounds N --seed S [--json] [--trace FILE]
    specloop simulate tree  --vocab V (--tree 3,2,1 | --top-k N --depth D [--verify-size M]) ...

The draft is a `NoisyDraft` of the stream (target logits + fixed Gaussian noise of
scale ``--draft-noise``; ``--frozen-draft`` keeps round 0's target, so a drifting
stream leaves it behind). Times come from ``--cost linear`` (a k + A with
``--draft-time``/``--target-time``) or ``--cost table`` (the shipped SmolLM2-135M
CPU table, or ``--cost-table FILE``).

JSON keys: command, scenario, vocab_size, num_contexts, rounds, seed, mode, iid,
num_draft_tokens (chain) or tree (plan), mean_tokens_per_round, standard_error,
theory_tokens_per_round (Assumption-1 expectation averaged over the rounds'
contexts; exact when ``theory_exact``), theory_exact, z_score, acceptance_rate
(accepted / (accepted + rejections)), theory_acceptance_rate (mean first-position
Acc = sum min(p, q)), mean_accepted_length, speedup (tokens/s vs plain decoding,
from the cost model), cost_model, simulated_seconds, draft_tokens, seconds (wall
clock of the simulation), draft_tokens_per_s. ``--check`` exits 1 when the theory is
exact and |z_score| > 4.

Other modules can add sub-commands: each module in `EXTRA_SIMULATE_MODULES` exposes
``register(simulate_subparsers)``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time

import numpy as np

from specloop.record import Trace

__all__ = ["register", "EXTRA_SIMULATE_MODULES", "run_simulation"]

#: modules adding `specloop simulate <name>` sub-commands (each exposes register(subparsers))
EXTRA_SIMULATE_MODULES: list[str] = ["specloop.cli.simulate_online_cmd"]

Z_CHECK = 4.0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"tree shape must look like 3,2,1, got {text!r}") from exc
    if not shape or any(b < 1 for b in shape):
        raise argparse.ArgumentTypeError(f"tree shape needs positive branching factors, got {text!r}")
    return shape


def _common(parser: argparse.ArgumentParser) -> None:
    from specloop.sim.streams import SCENARIOS

    parser.add_argument("--vocab", type=int, default=1000, help="vocabulary size V (2..65536)")
    parser.add_argument("--scenario", choices=SCENARIOS, default="stationary")
    parser.add_argument("--rounds", type=_positive_int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contexts", type=_positive_int, default=16, help="number of contexts C")
    parser.add_argument("--mode", choices=("sampling", "greedy"), default="sampling")
    parser.add_argument("--iid", action="store_true",
                        help="position-independent targets within a round (Assumption 1)")
    parser.add_argument("--temperature", type=float, default=1.0, help="target temperature")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the targets")
    parser.add_argument("--draft-noise", type=float, default=1.0, help="draft logit noise scale")
    parser.add_argument("--draft-temperature", type=float, default=1.0)
    parser.add_argument("--frozen-draft", action="store_true",
                        help="the draft keeps round 0's target (static draft)")
    parser.add_argument("--cost", choices=("linear", "table"), default="linear")
    parser.add_argument("--draft-time", type=float, default=0.05, help="a: seconds per draft step")
    parser.add_argument("--target-time", type=float, default=1.0,
                        help="A: seconds per target forward (linear cost)")
    parser.add_argument("--cost-table", default=None, help="verify-cost JSON (default: shipped)")
    parser.add_argument("--cost-dtype", default="float32", help="column of the cost table")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if |simulated - theory| > {Z_CHECK:g} standard errors")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trace", default=None, help="write the round records (JSON Lines)")


def register(subparsers) -> None:
    """Add ``specloop simulate`` with its ``chain`` and ``tree`` sub-commands."""
    parser = subparsers.add_parser("simulate", help="simulate speculative decoding on synthetic streams",
                                   description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="simulate_command", metavar="KIND")
    sub.required = True
    chain = sub.add_parser("chain", help="chain drafts of k tokens")
    chain.add_argument("--k", type=_nonnegative_int, default=4, help="draft tokens per round")
    _common(chain)
    chain.set_defaults(func=_main, simulate_kind="chain")
    tree = sub.add_parser("tree", help="static or EAGLE-2 dynamic draft trees")
    tree.add_argument("--tree", type=_shape, default=None, help="static branching, e.g. 3,2,1")
    tree.add_argument("--top-k", type=_positive_int, default=None, help="EAGLE-2 dynamic top-k")
    tree.add_argument("--depth", type=_positive_int, default=None, help="dynamic tree depth D")
    tree.add_argument("--verify-size", type=_positive_int, default=None,
                      help="verification budget: nodes sent to the target")
    tree.add_argument("--proposal", choices=("iid", "without-replacement", "deterministic"),
                      default=None, help="how siblings are drafted (default by tree kind and mode)")
    _common(tree)
    tree.set_defaults(func=_main, simulate_kind="tree")
    for name in EXTRA_SIMULATE_MODULES:
        importlib.import_module(name).register(sub)


def _tree_plan(args):
    from specloop.strategies.base import TreePlan

    if (args.tree is None) == (args.top_k is None):
        raise ValueError("give exactly one of --tree SHAPE or --top-k N (with --depth D)")
    if args.tree is not None:
        if args.depth is not None:
            raise ValueError("--depth applies to --top-k trees; a --tree shape sets its own depth")
        return TreePlan(branching=args.tree, verify_size=args.verify_size)
    if args.depth is None:
        raise ValueError("--top-k needs --depth D")
    return TreePlan(top_k=args.top_k, max_depth=args.depth, verify_size=args.verify_size)


def _cost_model(args):
    from specloop.sim.costs import LinearCost, TableCost, load_cost_table

    if args.cost == "linear":
        return LinearCost(draft_time=args.draft_time, target_time=args.target_time)
    from specloop.cli._paths import check_paths
    check_paths(args, in_files=("cost_table",))
    return TableCost(load_cost_table(args.cost_table, args.cost_dtype), draft_time=args.draft_time)


def run_simulation(args) -> tuple[dict, Trace | None]:
    """Run the simulation an argparse namespace describes; returns (report, trace)."""
    from specloop.sim.batch import simulate_stream
    from specloop.sim.drafts import NoisyDraft
    from specloop.sim.streams import make_stream

    stream = make_stream(args.scenario, args.vocab, args.rounds, args.seed,
                         num_contexts=args.contexts, iid=args.iid,
                         temperature=args.temperature, zipf_exponent=args.zipf)
    draft = NoisyDraft(stream, noise=args.draft_noise, temperature=args.draft_temperature,
                       seed=args.seed + 1, frozen=args.frozen_draft)
    cost = _cost_model(args)
    plan = args.k if args.simulate_kind == "chain" else _tree_plan(args)
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    result = simulate_stream(stream, draft, plan, rng, mode=args.mode,
                             proposal=getattr(args, "proposal", None))
    seconds = time.perf_counter() - start
    batch = result.batch
    trace = None
    if args.trace:
        trace = batch.to_trace(cost, meta={"scenario": args.scenario, "vocab_size": args.vocab,
                                           "seed": args.seed, "mode": args.mode,
                                           "kind": args.simulate_kind})
    report = _report(args, stream, result, cost, seconds)
    return report, trace


def _simulated_seconds(batch, cost) -> float:
    """Total simulated seconds of the rounds (draft steps + one verify forward each)."""
    if hasattr(batch, "num_draft_tokens"):
        steps, verified = batch.num_draft_tokens, batch.num_draft_tokens + 1
    else:
        steps, verified = batch.depth, batch.num_nodes + 1
    total = 0.0
    for value, count in zip(*np.unique(verified, return_counts=True)):
        total += count * cost.verify_seconds(int(value))
    for value, count in zip(*np.unique(steps, return_counts=True)):
        total += count * cost.draft_seconds(int(value))
    return float(total)


def _report(args, stream, result, cost, seconds) -> dict:
    batch = result.batch
    mean, se = batch.mean_tokens_per_round(), batch.standard_error()
    theory = float(np.mean(result.theory_tokens))
    exact = bool(stream.iid and math.isfinite(theory))
    z = (mean - theory) / se if se > 0 else (0.0 if mean == theory else math.inf)
    drafted = int(batch.num_draft_tokens.sum() if hasattr(batch, "num_draft_tokens")
                  else batch.num_nodes.sum())
    accepted = batch.accepted
    limit = batch.num_draft_tokens if hasattr(batch, "num_draft_tokens") else batch.depth
    rejections = int(np.count_nonzero(accepted < limit))
    simulated = _simulated_seconds(batch, cost)
    report = {
        "command": args.simulate_kind, "scenario": args.scenario, "vocab_size": args.vocab,
        "num_contexts": args.contexts, "rounds": batch.rounds, "seed": args.seed,
        "mode": args.mode, "iid": bool(stream.iid),
        "mean_tokens_per_round": mean, "standard_error": se,
        "theory_tokens_per_round": theory if math.isfinite(theory) else None,
        "theory_exact": exact, "z_score": z if math.isfinite(theory) else None,
        "acceptance_rate": float(accepted.sum() / max(accepted.sum() + rejections, 1)),
        "theory_acceptance_rate": float(result.first_acceptance.mean()),
        "mean_accepted_length": mean,
        "cost_model": {"kind": args.cost, "draft_time": cost.draft_time,
                       "target_time": cost.target_time, "cost_ratio": cost.cost_ratio},
        "simulated_seconds": simulated, "draft_tokens": drafted,
        "speedup": float(batch.tokens_per_round.sum()) * cost.verify_seconds(1) / simulated,
        "seconds": seconds, "draft_tokens_per_s": drafted / seconds if seconds > 0 else None,
    }
    if args.simulate_kind == "chain":
        report["num_draft_tokens"] = args.k
    else:
        report["tree"] = {"branching": list(args.tree) if args.tree else None,
                          "top_k": args.top_k, "depth": args.depth,
                          "verify_size": args.verify_size, "proposal": args.proposal}
    return report


def _print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"specloop simulate {report['command']} ({report['scenario']})")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for key in ("rounds", "mean_tokens_per_round", "standard_error", "theory_tokens_per_round",
                "theory_exact", "z_score", "acceptance_rate", "theory_acceptance_rate",
                "speedup", "seconds", "draft_tokens_per_s"):
        value = report.get(key)
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    Console().print(table)


def _main(args) -> int:
    from specloop.cli.theory_cmd import jsonable

    report, trace = run_simulation(args)
    if args.trace:
        trace.save(args.trace)
        report["trace"] = str(args.trace)
    if args.json:
        print(json.dumps(jsonable(report)))
    else:
        _print_table(report)
    if args.check and report["theory_exact"] and abs(report["z_score"]) > Z_CHECK:
        print(f"specloop simulate: simulated tokens per round {report['mean_tokens_per_round']:.4f} "
              f"is {report['z_score']:.1f} standard errors from theory "
              f"{report['theory_tokens_per_round']:.4f}", file=sys.stderr)
        return 1
    return 0
