"""`specloop theory` sub-commands: ``optimal-k`` and ``check``.

* ``specloop theory optimal-k --acceptance-rate A --cost-ratio C [--k-max N] [--json]``
  JSON keys: acceptance_rate, cost_ratio, k_exact (committed counting, main text),
  k_exact_appendix (Appendix C.1 counting), speedup_exact, k_paper (Corollary 4's
  closed form, unrounded), k_paper_rounded, speedup_paper (at the rounded closed
  form), efficiency (speedup_paper / speedup_exact).
* ``specloop theory check [--seed S] [--cases-per-family N] [--json]``: one object per
  claim with claim, holds, cases, violations, worst_ratio, counterexample (plus
  statement, details). Exits 0 whatever the verdicts; non-zero only on errors.

Non-finite floats are written to JSON as the strings "inf", "-inf", "nan".
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

# specloop.theory (scipy) is imported inside the commands: `specloop --help` stays light.

__all__ = ["register", "optimal_k_report", "jsonable"]


def jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats into strict-JSON values."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else str(value)
    return obj


def optimal_k_report(acceptance_rate: float, cost_ratio: float,
                     k_max: int | None = None) -> dict[str, Any]:
    """The values `specloop theory optimal-k` prints (see module docstring)."""
    from specloop.theory import (optimal_k_efficiency, optimal_k_exact, optimal_k_paper, round_paper_k,
                                 speedup_linear)

    k_exact = optimal_k_exact(acceptance_rate, cost_ratio, "committed", k_max)
    k_appendix = optimal_k_exact(acceptance_rate, cost_ratio, "appendix", k_max)
    k_paper = optimal_k_paper(acceptance_rate, cost_ratio)
    k_round = round_paper_k(k_paper)
    if k_max is not None:
        k_round = min(k_round, float(k_max))
    speedup_paper = (1.0 / cost_ratio if cost_ratio > 0 else math.inf) if math.isinf(k_round) \
        else float(speedup_linear(acceptance_rate, k_round, cost_ratio))
    return {"acceptance_rate": float(acceptance_rate), "cost_ratio": float(cost_ratio),
            "k_exact": k_exact, "k_exact_appendix": k_appendix,
            "speedup_exact": float(speedup_linear(acceptance_rate, k_exact, cost_ratio)),
            "k_paper": k_paper, "k_paper_rounded": k_round, "speedup_paper": speedup_paper,
            "efficiency": optimal_k_efficiency(acceptance_rate, cost_ratio, k_max=k_max)}


def _cmd_optimal_k(args: argparse.Namespace) -> int:
    report = optimal_k_report(args.acceptance_rate, args.cost_ratio, args.k_max)
    if args.json:
        print(json.dumps(jsonable(report), indent=2))
        return 0
    table = Table(title="Optimal candidate length k")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for key, value in report.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    Console(width=100).print(table)
    return 0


def _summary(example: dict[str, Any] | None) -> str:
    if example is None:
        return "-"
    if "k_exact" in example:
        return (f"Acc={example['acceptance_rate']:g} c={example['cost_ratio']:.3g}: "
                f"k_exact={example['k_exact']} round(k_paper)={example['k_paper_rounded']} "
                f"eff={example['efficiency']:.3f}")
    if "rounds" in example:
        return (f"{example['family']} V={example['vocab']} T={example['rounds']} "
                f"k={example['num_draft_tokens']}: true={example['true']:.4g} "
                f"bound={example['bound']:.4g} Reg={example['dynamic_regret']:.3g}")
    return f"{example.get('family', '')} V={example.get('vocab', '?')}"


def _cmd_check(args: argparse.Namespace) -> int:
    from specloop.theory import run_theory_check

    results = run_theory_check(seed=args.seed, cases_per_family=args.cases_per_family)
    if args.json:
        print(json.dumps(jsonable([r.to_dict() for r in results]), indent=2))
        return 0
    table = Table(title=f"specloop theory check (seed {args.seed})")
    for name, justify in (("claim", "left"), ("holds", "center"), ("cases", "right"),
                          ("violations", "right"), ("worst_ratio", "right"),
                          ("counterexample", "left")):
        table.add_column(name, justify=justify)
    for r in results:
        table.add_row(r.claim, "yes" if r.holds else "NO", str(r.cases), str(r.violations),
                      f"{r.worst_ratio:.4g}", _summary(r.counterexample))
    Console(width=160).print(table)
    return 0


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(subparsers) -> None:
    """Add ``theory`` with its ``optimal-k`` and ``check`` sub-commands."""
    theory = subparsers.add_parser("theory", help="closed forms, bounds and the theory check")
    sub = theory.add_subparsers(dest="theory_command", metavar="THEORY_COMMAND")
    sub.required = True

    opt = sub.add_parser("optimal-k", help="exact optimal k vs Corollary 4's closed form")
    opt.add_argument("--acceptance-rate", type=float, required=True, help="Acc in [0, 1]")
    opt.add_argument("--cost-ratio", type=float, required=True, help="a / A >= 0")
    opt.add_argument("--k-max", type=_nonnegative_int, default=None,
                     help="cap on k (needed when the speedup grows without bound in k)")
    opt.add_argument("--json", action="store_true", help="print JSON instead of a table")
    opt.set_defaults(func=_cmd_optimal_k)

    chk = sub.add_parser("check", help="evaluate every stated theory claim on generated cases")
    chk.add_argument("--seed", type=int, default=0)
    chk.add_argument("--cases-per-family", type=_positive_int, default=60)
    chk.add_argument("--json", action="store_true", help="print JSON instead of a table")
    chk.set_defaults(func=_cmd_check)


if __name__ == "__main__":  # pragma: no cover
    from specloop.cli import main
    sys.exit(main(["theory", *sys.argv[1:]]))
