"""`specloop figures all [--quick] [--out DIR]` and `specloop figures NAME ... `.

Regenerates figures (see `specloop.figures`). A figure whose inputs are not
available yet is reported as ``unavailable`` with its reason and does not fail the
command; a figure that raises any other exception is reported as ``error`` and
makes the command exit 1. ``--json`` prints a list of rows with keys ``name``,
``status`` (ok | unavailable | error), ``reason``, ``images``, ``data``, ``numbers``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

DEFAULT_OUT = "out/figures"


def register(subparsers) -> None:
    from specloop.figures import FIGURES
    parser = subparsers.add_parser(
        "figures", help="regenerate figures (data + PNG + SVG)",
        description="Regenerate figures: `specloop figures all` or `specloop figures NAME ...`. "
                    f"Names: {', '.join(FIGURES)}.")
    parser.add_argument("names", nargs="+", metavar="NAME",
                        help=f"'all' or one or more of: {', '.join(FIGURES)}")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (seconds to a few minutes per figure)")
    parser.add_argument("--out", default=DEFAULT_OUT, type=Path,
                        help=f"output folder; each figure writes OUT/NAME/ (default {DEFAULT_OUT})")
    parser.add_argument("--json", action="store_true", help="print a JSON list of results")
    parser.set_defaults(func=run)


def resolve_names(names: list[str]) -> list[str]:
    """Expand 'all' and validate names (ValueError on an unknown one)."""
    from specloop.figures import FIGURES
    if "all" in names:
        return list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {', '.join(unknown)}; choose from all, {', '.join(FIGURES)}")
    return list(dict.fromkeys(names))


def run_one(name: str, out_dir: Path, quick: bool) -> dict:
    """Run one figure; never raises: returns a status row."""
    from specloop.figures import FigureUnavailable, run_figure
    start = time.perf_counter()
    row = {"name": name, "status": "ok", "reason": "", "images": [], "data": [],
           "numbers": {}, "claims": [], "notes": [], "seconds": 0.0}
    try:
        result = run_figure(name, out_dir / name, quick=quick)
        as_dict = result.to_dict()
        row.update(images=[str(p) for p in result.image_paths], data=[str(p) for p in result.data_paths],
                   numbers=as_dict["numbers"], claims=as_dict["claims"], notes=as_dict["notes"])
    except FigureUnavailable as exc:
        row.update(status="unavailable", reason=str(exc))
    except Exception as exc:  # a real error: report it with its traceback, keep going
        row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stderr)
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def run(args: argparse.Namespace) -> int:
    from specloop.cli._paths import check_paths
    names = resolve_names(args.names)
    check_paths(args, out_folders=("out",))
    rows = []
    for name in names:
        if not args.json:
            print(f"[figures] {name} ...", file=sys.stderr, flush=True)
        rows.append(run_one(name, args.out, args.quick))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
    return 1 if any(r["status"] == "error" for r in rows) else 0


def _print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title="specloop figures")
    for col in ("figure", "status", "seconds", "output / reason"):
        table.add_column(col)
    for r in rows:
        detail = ", ".join(p for p in r["images"] if p.endswith(".png")) or r["reason"]
        style = {"ok": "green", "unavailable": "yellow", "error": "red"}[r["status"]]
        table.add_row(r["name"], f"[{style}]{r['status']}[/]", f"{r['seconds']:.1f}", detail)
    Console().print(table)
