"""`specloop reproduce [--quick] [--out DIR] [--force] [--skip-real] [--tiny]`.

Runs every part of the reproduction (theory check; theory vs simulation; optimal
k; regret sweep; real-model speedup table and prompt stream on the embedded
SmolLM2-135M with held-out prompts; LTD), each into DIR/<part>/ with a done-marker,
then writes DIR/report.md (see `specloop.report`). Re-running into the same DIR
reuses finished parts; ``--force`` recomputes them. Exit status: 0 when no part
raised a real error (unavailable parts are reported, not failures), 1 otherwise.
``--json`` prints ``{"report": path, "parts": [{name, status, reason, seconds,
reused}], "seconds": total}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DEFAULT_OUT = "reproduce-out"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "reproduce", help="run theory, simulations, real models and figures; write report.md",
        description="Run every part and write DIR/report.md with tables, figures, verdicts "
                    "and the machine. Finished parts in DIR are reused unless --force.")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: about 15 minutes on 2 CPU cores")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT),
                        help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="recompute finished parts")
    parser.add_argument("--skip-real", action="store_true",
                        help="skip the parts that run real models (theory and simulation only)")
    parser.add_argument("--tiny", action="store_true",
                        help="smallest sizes (seconds per part; for tests: SPECLOOP_SCALE=tiny)")
    parser.add_argument("--parts", default="",
                        help="comma-separated subset of parts to run (default all)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    parser.set_defaults(func=run)


def _select(spec: str):
    from specloop.report.parts import PARTS
    if not spec:
        return list(PARTS)
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    known = {p.name: p for p in PARTS}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return [known[w] for w in wanted]


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specloop.figures._base import SCALE_ENV
    from specloop.report.machine import machine_info
    from specloop.report.parts import run_part
    from specloop.report.writer import write_report

    if args.tiny:
        os.environ[SCALE_ENV] = "tiny"
    parts = _select(args.parts)
    from specloop.cli._paths import check_paths
    check_paths(args, out_folders=("out",))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = []
    bar = tqdm(parts, desc="reproduce", unit="part", file=sys.stderr, dynamic_ncols=True)
    for part in bar:
        bar.set_description(f"reproduce: {part.name}")
        result = run_part(part, args.out, quick=args.quick, force=args.force,
                          skip_real=args.skip_real)
        bar.write(f"  {part.name}: {result.status}"
                  f"{' (reused)' if result.reused else ''} {result.seconds:.0f}s"
                  f"{' - ' + result.reason if result.reason else ''}", file=sys.stderr)
        results.append(result)
    bar.close()
    total = time.perf_counter() - start
    config = {"quick": args.quick, "tiny": args.tiny, "skip_real": args.skip_real,
              "force": args.force}
    report = write_report(args.out, results, machine_info(), config, total)
    if args.json:
        print(json.dumps({"report": str(report), "seconds": round(total, 1),
                          "parts": [{k: r.to_dict()[k] for k in
                                     ("name", "status", "reason", "seconds", "reused")}
                                    for r in results]}, indent=2))
    else:
        print(f"report: {report} ({total:.0f} s)")
    return 1 if any(r.status == "error" for r in results) else 0
