"""Why an online draft does or does not beat its frozen draft: per chunk,
tau and the positions the learner had seen, and the next chunk's held-out
cross-entropy of the frozen draft and of the online state before / after the chunk's
updates; with ``--offline``, per domain, the frozen draft trained offline on the same
served positions (`specloop.realmodels.streams.online_heldout`).

Needs a replayed stream run with ``--snapshot-chunks``, e.g.::

    specloop stream --replay REC --method hydra,opt-hydra --prompts 16 --chunk 4 \\
        --mode round --snapshot-chunks --out RESULTS
    python benchmarks/online_heldout.py REC RESULTS --method opt-hydra --frozen hydra --offline

Writes JSON (default ``benchmarks/results/online_heldout.json``): the
`online_heldout` table plus ``offline`` rows and ``seconds``; prints a short table.
Exit 2 on bad input (a missing snapshot, a frozen ``--method``, another draft kind).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", metavar="REC", help="the replayed stream recording")
    parser.add_argument("results", metavar="RESULTS", help="the 'specloop stream --replay' results folder")
    parser.add_argument("--method", default="opt-hydra", help="online method (its folder has chunk-NNN.pt)")
    parser.add_argument("--frozen", default="hydra", help="frozen method for tau_frozen")
    parser.add_argument("--drafts", default=None, metavar="DIR", help="the stream's --drafts folder, if any")
    parser.add_argument("--every", type=int, default=1, help="the sub-stream step the stream replayed")
    parser.add_argument("--top-m", type=int, default=32, help="recorded p_target tokens for ce_topm")
    parser.add_argument("--offline", action="store_true", help="also train the in-domain offline reference")
    parser.add_argument("--epochs", type=int, default=3, help="offline: passes over the served positions")
    parser.add_argument("--batch-size", type=int, default=64, help="offline: anchors per step")
    parser.add_argument("--lr", type=float, default=3e-4, help="offline: AdamW peak learning rate")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="offline: training budget per domain")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default="benchmarks/results/online_heldout.json")
    return parser


def _frozen_drafter(target, method: str, drafts: str | None):
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.streams.runner import resolve_method
    kind = resolve_method(method).drafter
    options = {} if drafts is None else {"checkpoint": str(Path(drafts) / kind)}
    return make_drafter(kind, target, train_if_missing=False, progress=False, **options)


def _fmt(row: dict, depth: str = "1") -> str:
    def one(name):
        m = row[name][depth]
        return f"{m['ce_greedy']:6.3f} {m['ce_topm']:6.3f} {m['top1']:5.3f}"
    return f"{one('frozen')} | {one('before')} | {one('after')}"


def _print(result: dict) -> None:
    print(f"{result['method']} vs {result['frozen']}: chunk {result['chunk']}, depth 1; "
          "ce_greedy ce_topm top1 of frozen | before | after on the next chunk")
    for r in result["chunks"]:
        frozen = math.nan if r["tau_frozen"] is None else r["tau_frozen"]
        print(f"chunk {r['chunk']:3d} tau {r['tau']:.3f} (frozen {frozen:.3f}) seen {r['positions_seen']:6d}  "
              f"{_fmt(r)}")
    for d, r in result["per_domain"].items():
        print(f"domain {d}: tau {r['tau']:.3f} frozen {r['tau_frozen']} positions seen {r['positions_seen']}")
    for r in result.get("offline", []):
        off, on, fr = (r[k]["1"] for k in ("offline", "online_after", "frozen"))
        print(f"offline {r['domain']} (through chunk {r['through_chunk']}, {r['train_positions']} positions, "
              f"{r['steps']} steps): ce_greedy {off['ce_greedy']:.3f} vs online {on['ce_greedy']:.3f} vs frozen "
              f"{fr['ce_greedy']:.3f}; top1 {off['top1']:.3f} / {on['top1']:.3f} / {fr['top1']:.3f}")


def main(argv=None) -> int:
    import torch

    from specloop.realmodels.loading import load_model
    from specloop.realmodels.streams.online_heldout import offline_rows, online_heldout
    from specloop.realmodels.recording import open_recording
    args = _parser().parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    t0 = time.perf_counter()
    try:
        recording = open_recording(args.recording)
        target = load_model(recording.settings["target"], dtype=recording.settings["dtype"])
        drafter = _frozen_drafter(target, args.method, args.drafts)
        result = online_heldout(recording, args.results, args.method, drafter, frozen=args.frozen,
                                every=args.every, top_m=args.top_m)
        if args.offline:
            result["offline"] = offline_rows(result, recording, target.model, drafter, epochs=args.epochs,
                                             batch_size=args.batch_size, lr=args.lr, max_seconds=args.max_seconds,
                                             top_m=args.top_m)
    except (FileNotFoundError, ValueError) as exc:
        print(f"online_heldout: {exc}", file=sys.stderr)
        return 2
    result["seconds"] = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    _print(result)
    print(f"wrote {out} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
