"""What an online ensemble costs against one OGD learner, per prompt of a replayed stream,
measured in the same run (`specloop.realmodels.streams.scale.run_job` on one recording):

* ``ogd``: one OGD learner (the unit);
* ``ens-exact``: the Hedge ensemble of N = 3 with each base learner's own loss and gradient
  (the paper), its oracle substituting values instead of writing them in and the played
  point evaluated without a backward pass (`online.functional`);
* ``ens-exact-stacked``: the same, the 3 base learners in one vmapped call
  (``--stacked-oracle``);
* ``ens-linearised``: the Ader / Sword++ surrogate (one gradient a round);
* ``ogd-grid``: the 3-rate OGD grid (lr x 1, 2, 4) as 3 separate runs.

Rows run one after the other on one torch thread; each gives wall seconds per prompt,
update seconds per prompt and tau, and its ratio to ``ogd`` from the same run. A second
part times the stacked evaluation itself on the samples of a served prompt: K loss-and-
gradient calls against one stacked call of K points, per head kind.

    python benchmarks/online_stacked.py REC --prompts 4 --out benchmarks/results/online_stacked.json

REC is a replay recording (``specloop stream record --from-answers
data/answers/sharegpt-heldout-1200 --every 100 --out REC``). Exit 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROWS = {  # name -> (method, online fields, lr multiplier)
    "ogd": ("ogd-eagle3", {}, 1.0),
    "ens-exact": ("ens-eagle3", {}, 1.0),
    "ens-exact-stacked": ("ens-eagle3", {"stacked_oracle": True}, 1.0),
    "ens-linearised": ("ens-eagle3", {"ensemble_losses": "linearised"}, 1.0),
}
GRID = (1.0, 2.0, 4.0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", metavar="REC")
    parser.add_argument("--prompts", type=int, default=4, help="prompts replayed per row")
    parser.add_argument("--mode", choices=["round", "chunk"], default="round")
    parser.add_argument("--chunk", type=int, default=2, help="prompts per chunk (chunk mode)")
    parser.add_argument("--micro-rounds", type=int, default=12, help="mini-batches timed in the second part")
    parser.add_argument("--out", default="benchmarks/results/online_stacked.json")
    return parser


def _job_row(settings, row: str, method: str, online: dict, lr: float | None, mode: str, chunk: int) -> dict:
    import dataclasses

    from specloop.realmodels.streams.scale import ScaleJob, run_job
    job = ScaleJob("bench", method, 0, lr, chunk, None, tuple(sorted({"mode": mode, **online}.items())))
    t0 = time.perf_counter()
    summary = run_job(job, dataclasses.replace(settings, out=str(Path(settings.out) / row)))   # a folder per row
    wall = time.perf_counter() - t0
    n = summary["prompts_done"]
    return {"method": method, "online": online, "lr": lr, "prompts": n, "tau": summary["mean_accepted_length"],
            "wall_s_per_prompt": wall / n, "update_s_per_prompt": summary["update_seconds"] / n}


def _stream_part(args, out_dir: Path) -> dict:
    from specloop.realmodels.online import DEFAULT_LR
    from specloop.realmodels.streams.scale import GridSettings
    from specloop.report.machine import LoadMonitor
    settings = GridSettings(recording=args.recording, out=str(out_dir), prompts=args.prompts, threads=1)
    rows = {}
    with LoadMonitor() as load:
        for name, (method, online, _) in ROWS.items():
            rows[name] = _job_row(settings, name, method, online, None, args.mode, args.chunk)
            print(f"{name:20s} {rows[name]['wall_s_per_prompt']:7.2f} s/prompt  "
                  f"updates {rows[name]['update_s_per_prompt']:7.2f}  tau {rows[name]['tau']:.3f}", flush=True)
        base_lr = DEFAULT_LR["ogd"]
        grid = [_job_row(settings, f"grid-{m:g}", "ogd-eagle3", {}, base_lr * m, args.mode, args.chunk) for m in GRID]
    unit = rows["ogd"]
    for row in rows.values():
        row["wall_vs_ogd"] = row["wall_s_per_prompt"] / unit["wall_s_per_prompt"]
        row["update_vs_ogd"] = row["update_s_per_prompt"] / unit["update_s_per_prompt"]
    rows["ogd-grid"] = {"rates": [g["lr"] for g in grid], "taus": [g["tau"] for g in grid],
                        "wall_s_per_prompt": sum(g["wall_s_per_prompt"] for g in grid),
                        "update_s_per_prompt": sum(g["update_s_per_prompt"] for g in grid)}
    rows["ogd-grid"]["wall_vs_ogd"] = rows["ogd-grid"]["wall_s_per_prompt"] / unit["wall_s_per_prompt"]
    return {"rows": rows, "load": load.summary}


def _samples(kind: str, recording, target, prompts: int = 1):
    """A drafter of ``kind``, its adapter and the samples of the first served prompt."""
    from specloop.realmodels.online import OnlineAdapter, OnlineConfig, OnlineDrafter
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.recording import recorded_items
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.streams.replay import ReplayDecoder, load_verify_cost
    inner = make_drafter(kind, target, train_if_missing=False, progress=False)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=1e-12, batch_size=4))
    cost = load_verify_cost(None, recording.settings["dtype"])
    for item in recorded_items(recording, prompts, 1):
        decoder = ReplayDecoder(recording, target, OnlineDrafter(inner, adapter), policy=FixedDraftPolicy(4),
                                verify_cost=cost, recorded_index=lambda i, j=item.index: j)
        decoder.generate(list(item.ids), int(recording.settings["max_new_tokens"]))
    return adapter


def _micro_part(args) -> dict:
    import torch

    from specloop.realmodels.loading import load_model
    from specloop.realmodels.recording import open_recording
    from specloop.report.machine import LoadMonitor
    torch.set_num_threads(1)
    recording = open_recording(args.recording)
    target = load_model(recording.settings["target"], dtype=recording.settings["dtype"])
    out = {}
    with LoadMonitor() as load:
        for kind in ("eagle3", "hydra"):
            adapter = _samples(kind, recording, target)
            buffer = adapter.buffer
            batches = [[buffer[(i + j) % len(buffer)] for j in range(4)] for i in range(args.micro_rounds)]
            points = [[p.detach() * (1 + 1e-3 * (i + 1)) for p in adapter.params] for i in range(3)]
            row = {}
            for name, fn in (("one_call", lambda b: adapter.owner.loss_grad(adapter.objective, points[0], b)),
                             ("k_calls", lambda b: [adapter.owner.loss_grad(adapter.objective, p, b) for p in points]),
                             ("stacked", lambda b: adapter.owner.loss_grad_many(adapter.objective, points, b))):
                fn(batches[0])                                   # warm-up
                t0 = time.perf_counter()
                for b in batches:
                    fn(b)
                row[f"{name}_ms"] = (time.perf_counter() - t0) / len(batches) * 1e3
            row["stacked_vs_k_calls"] = row["stacked_ms"] / row["k_calls_ms"]
            row["k"] = len(points)
            out[kind] = row
            print(f"{kind:8s} one {row['one_call_ms']:.1f} ms, {row['k']} calls {row['k_calls_ms']:.1f} ms, "
                  f"stacked {row['stacked_ms']:.1f} ms", flush=True)
    return {"kinds": out, "load": load.summary}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not (Path(args.recording) / "manifest.json").is_file():
        print(f"error: {args.recording}: not a recording folder (no manifest.json)", file=sys.stderr)
        return 2
    if args.prompts < 1 or args.micro_rounds < 1:
        print("error: --prompts and --micro-rounds must be >= 1", file=sys.stderr)
        return 2
    from specloop.report.machine import machine_info
    work = Path(tempfile.mkdtemp(prefix="specloop-online-stacked-"))
    try:
        t0 = time.perf_counter()
        result = {"benchmark": "online_stacked", "recording": str(args.recording), "prompts": args.prompts,
                  "mode": args.mode, "machine": machine_info(),
                  "stream": _stream_part(args, work), "stacked_evaluation": _micro_part(args)}
        result["seconds"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
