"""``specloop stream scale REC``: the online-at-scale grid (protocol x method x seed x
learning rate), every cell a replay of the recording REC
(`specloop.realmodels.streams.scale`), on a local process pool (default), in this
process (``--backend serial``) or on Ray (``--backend ray``, ``--address`` for a
cluster; ``pip install "specloop[distributed]"``). Resumable: rerun the same command
to continue. Results (`specloop.realmodels.streams.scale_results`): ``summary.json``,
``summary-<protocol>.json`` and figures under ``--out``.

``--protocol NAME[=DRAFTS]`` (repeatable): a protocol and the folder its drafts come
from (as ``specloop stream --drafts``; none = the shipped drafts). ``--lr-grid
METHOD=LR:LR:...`` (repeatable) adds learning-rate jobs. ``--every N`` replays every
N-th recorded prompt (a sub-stream with the same domain order). ``--json`` prints
``summary.json``'s object. ``--budget-minutes M``: no job starts a prompt after M
minutes; each writes its state and stops, the summaries are left as they were, and the
command exits 3 (rerun it to continue). Exit 1 when a job failed, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register_scale", "run_scale"]


def register_scale(sub) -> None:
    from specloop.cli._online_flags import add_online_flags
    from specloop.realmodels.streams.scale import BACKENDS
    parser = sub.add_parser("scale", help="the online-at-scale grid over a recording (replays)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", metavar="REC", help="recording folder ('specloop stream record')")
    parser.add_argument("--protocol", action="append", default=None, metavar="NAME[=DRAFTS]",
                        help="protocol and its drafts folder (default: off-domain with the shipped drafts)")
    parser.add_argument("--method", default="hydra,osd-hydra,opt-hydra,eagle3,ens-eagle3")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per online method")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the online methods' first seed (default 0): --first-seed 1 --seeds 2 runs seeds 1 and 2")
    parser.add_argument("--method-seeds", action="append", default=[], metavar="METHOD=N",
                        help="seeds for one method instead of --seeds (repeatable), e.g. ens-eagle3=1")
    parser.add_argument("--lr-grid", action="append", default=[], metavar="METHOD=LR:LR",
                        help="learning-rate jobs for a method, e.g. ogd-hydra=1e-4:3e-4:1e-3")
    parser.add_argument("--chunk", type=int, default=None, help="prompts per chunk (default: the paper's, 80/40)")
    add_online_flags(parser, mode_default="chunk", lr=False)       # rates: the learners' defaults and --lr-grid
    parser.add_argument("--prompts", type=int, default=None, help="the first N prompts of the (sub-)stream")
    parser.add_argument("--every", type=int, default=1, help="replay every N-th recorded prompt")
    parser.add_argument("-k", "--num-draft-tokens", type=int, default=4)
    parser.add_argument("--cost-table", default=None, metavar="FILE")
    parser.add_argument("--backend", choices=BACKENDS, default="process")
    parser.add_argument("--workers", type=int, default=2, help="processes (--backend process)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per job")
    parser.add_argument("--address", default=None, help="Ray cluster address (--backend ray)")
    parser.add_argument("--out", default="results/stream_scale")
    parser.add_argument("--snapshot-chunks", action="store_true",
                        help="online jobs save their draft's parameters at the end of every chunk (chunk-NNN.pt)")
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="stop every job at the first prompt boundary after M minutes, its state written "
                             "(exit 3; rerun the same command to continue)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run_scale)


def _protocols(values) -> dict:
    out = {}
    for value in values or ["off-domain"]:
        name, _, drafts = value.partition("=")
        if not name.strip():
            raise ValueError(f"--protocol {value!r} has no name")
        out[name.strip()] = drafts.strip() or None
    return out


def _lr_grid(values) -> dict:
    grid = {}
    for value in values:
        method, sep, rates = value.partition("=")
        if not sep or not rates:
            raise ValueError(f"--lr-grid {value!r}: expected METHOD=LR:LR:...")
        try:
            grid[method.strip()] = [float(x) for x in rates.split(":")]
        except ValueError:
            raise ValueError(f"--lr-grid {value!r}: learning rates must be numbers") from None
    return grid


def _method_seeds(values) -> dict:
    out = {}
    for value in values:
        method, sep, count = value.partition("=")
        if not sep or not count.strip().isdigit():
            raise ValueError(f"--method-seeds {value!r}: expected METHOD=N")
        out[method.strip()] = int(count)
    return out


def _deadline(budget_minutes: float | None) -> float | None:
    import time
    if budget_minutes is None:
        return None
    if not budget_minutes > 0:
        raise ValueError(f"--budget-minutes must be > 0, got {budget_minutes}")
    return time.time() + 60.0 * float(budget_minutes)


def _grid(args):
    from specloop.cli._online_flags import online_flags
    from specloop.realmodels.recording import open_recording, recorded_items
    from specloop.cli._paths import check_input_folder, check_paths
    from specloop.realmodels.streams.scale import GridSettings, baseline_job, plan_jobs
    protocols = _protocols(args.protocol)
    check_paths(args, out_folders=("out",), in_folders=("recording=REC",), in_files=("cost_table",))
    for name, drafts in protocols.items():
        check_input_folder(drafts, f"--protocol {name}=")
    recording = open_recording(args.recording)
    items = recorded_items(recording, args.prompts, args.every)            # checks --prompts / --every
    online = {k: v for k, v in online_flags(args).items() if k != "background"}   # replays refuse it
    jobs = plan_jobs(protocols, [m for m in args.method.split(",") if m.strip()], seeds=args.seeds,
                     lr_grid=_lr_grid(args.lr_grid), chunk=args.chunk, online=online,
                     method_seeds=_method_seeds(args.method_seeds), first_seed=args.first_seed)
    settings = GridSettings(recording=str(args.recording), out=args.out, prompts=args.prompts, every=args.every,
                            num_draft_tokens=args.num_draft_tokens, cost_table=args.cost_table, threads=args.threads,
                            snapshot_chunks=args.snapshot_chunks, deadline=_deadline(args.budget_minutes))
    return [baseline_job(args.chunk or 40)] + jobs, settings, items


def run_scale(args) -> int:
    from tqdm.auto import tqdm

    from specloop.realmodels.streams.scale import run_grid
    from specloop.realmodels.streams.scale_results import protocol_summary, write_results
    try:
        jobs, settings, items = _grid(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"specloop stream scale: {err}", file=sys.stderr)
        return 2
    bar = tqdm(total=len(jobs), desc="grid", unit="job", disable=args.json, file=sys.stderr)
    try:
        results = run_grid(jobs, settings, backend=args.backend, workers=args.workers, address=args.address,
                           on_done=lambda job, value: bar.update(1))
    except (ValueError, ImportError) as err:
        print(f"specloop stream scale: {err}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    stopped = [j for j, v in results.items() if isinstance(v, dict) and v.get("stopped_early")]
    if stopped:
        for job in stopped:
            v = results[job]
            print(f"specloop stream scale: {job.protocol}/{job.name}: {v['prompts_done']} of {len(items)} prompts "
                  "when --budget-minutes ran out", file=sys.stderr)
        print("specloop stream scale: stopped by --budget-minutes; rerun the same command to continue "
              "(summaries not rewritten)", file=sys.stderr)
        return 3
    baseline = results[jobs[0]]
    if isinstance(baseline, Exception):
        print(f"specloop stream scale: the greedy baseline failed: {baseline}", file=sys.stderr)
        return 1
    domains = [i.dataset for i in items]
    summaries = {p: protocol_summary({j: v for j, v in results.items() if j.protocol == p}, baseline, domains, p)
                 for p in dict.fromkeys(j.protocol for j in jobs[1:])}
    write_results(summaries, args.out)
    failed = {f"{p}/{k}": v for p, s in summaries.items() for k, v in s["failed"].items()}
    for name, why in failed.items():
        print(f"specloop stream scale: {name}: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(summaries, indent=1))
    else:
        for protocol, summary in summaries.items():
            print(f"[{protocol}] greedy baseline {summary['baseline_tokens_per_s']:.2f} tokens/s (priced)")
            for name, m in summary["methods"].items():
                vs = m.get("vs_frozen")
                gain = "" if vs is None else f"{100 * vs['gain']:+.1f}% [{100 * vs['gain_ci'][0]:+.1f}, " \
                                             f"{100 * vs['gain_ci'][1]:+.1f}]"
                print(f"  {name:<14} tau {m['mean_accepted_length']:.3f}  speedup {m['speedup']:.3f}  "
                      f"w/ train {m['speedup_with_training']:.3f}  {gain}")
    return 1 if failed else 0
