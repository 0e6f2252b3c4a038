"""Real-decoder confirmation of an online stream replay.

    OMP_NUM_THREADS=1 python benchmarks/online_confirm.py REC \\
        --run results/stream_scale_round/off-domain/opt-hydra-s0/opt-hydra --kind hydra \\
        [--drafts /work/drafts/shipped-old] --every 6 --chunk 20 [--chunks 3,6] [--prompts 5] \\
        [--max-new-tokens 128] [--repeats 1] --out benchmarks/results/online_confirm.json

An online method's replayed stream (`specloop stream scale ... --snapshot-chunks`) left
its draft's parameters at the end of every chunk (``chunk-NNN.pt``). For each chosen
chunk c (default: the chunk holding each domain's last prompt, the last domain
excepted) this takes the state at the end of c and the next chunk's first
``--prompts`` prompts, and serves them with that state -- *frozen* (``--serve
frozen``, no updates while serving) or as the start of the run's online method
(``--serve online``: a fresh learner with the run's settings, round mode, its updates
timed on the wall clock) -- and with the frozen draft the stream started from, each
two ways:

* ``real``: `SpeculativeDecoder`, the target really runs; wall-clock tokens/s.
  Adapted and frozen alternate per prompt and repeat (paired).
* ``replay``: `ReplayDecoder` over the recording, the same drafts; exact tau for
  greedy decoding, so tau must equal the real decoder's wherever batch-1 greedy
  decoding stays on the recording.

JSON per check: ``chunk``, ``prompts`` (sub-stream positions), ``domain`` of those
prompts, per draft (``adapted`` / ``frozen``) ``tau_real``, ``tau_replay``,
``matching_rounds`` / ``rounds`` (`replay_check.compare_traces`), ``tokens_per_s``
(real, all repeats) and per-prompt rows; ``tau_online_stream`` (what the learning
draft got on those prompts inside the stream, from its ``rounds.jsonl``); ``gain``:
paired per-prompt tau gain of adapted over frozen (`specloop.stats.paired_gain`) and
``speed_gain`` / ``speed_gain_ci`` (95 % Student-t interval on the mean per-prompt log
ratio of tokens/s). Plus the load average before / after and torch threads.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specloop.realmodels.decoder import SpeculativeDecoder  # noqa: E402
from specloop.realmodels.online import load_checkpoint  # noqa: E402
from specloop.realmodels.streams.online_heldout import apply_snapshot, load_snapshot  # noqa: E402
from specloop.realmodels.policy import FixedDraftPolicy  # noqa: E402
from specloop.realmodels.streams.replay import ReplayDecoder, load_verify_cost  # noqa: E402
from specloop.realmodels.streams.replay_check import compare_traces  # noqa: E402
from specloop.realmodels.streams.runner import online_drafter, resolve_method  # noqa: E402
from specloop.realmodels.streams.compare import per_prompt_counts  # noqa: E402
from specloop.stats import log_ratio_t_interval, paired_gain  # noqa: E402
from specloop.realmodels.recording import open_recording, recorded_items  # noqa: E402
from specloop.record import Trace  # noqa: E402


def default_chunks(domains: list[str], chunk: int) -> list[int]:
    """The chunk holding each domain's last prompt, the last domain's excepted (it
    has no next chunk of the stream), in stream order; duplicates dropped."""
    ends = [i for i in range(len(domains) - 1) if domains[i] != domains[i + 1]]
    return list(dict.fromkeys(i // chunk for i in ends))


def _serve(decoder, item, max_new: int, position: int):
    t0 = time.perf_counter()
    result = decoder.generate(list(item.ids), max_new, stream_index=position)
    return result, time.perf_counter() - t0


def check_chunk(recording, target, make_drafters, items, positions: list[int], args) -> dict:
    """Serve ``positions`` (sub-stream positions, their ``items``) with each draft of
    ``make_drafters()`` ({"adapted", "frozen"}, built afresh for every repeat and for
    the replay, so an online draft starts each pass from the same state) by the real
    decoder and the replay."""
    policy = FixedDraftPolicy(args.num_draft_tokens)
    cost = load_verify_cost(None, recording.settings["dtype"])
    eos = sorted(int(e) for e in recording.manifest["model"]["eos_ids"])     # the replay's EOS
    names = ("adapted", "frozen")
    traces = {name: {"real": [], "replay": []} for name in names}
    rates = {name: [] for name in names}
    for repeat in range(args.repeats):
        drafters = make_drafters()
        for j, pos in enumerate(positions):
            order = list(drafters) if (repeat + j) % 2 == 0 else list(reversed(drafters))
            for name in order:
                decoder = SpeculativeDecoder(target, drafters[name], policy=policy, seed=pos, eos_token_id=eos)
                result, seconds = _serve(decoder, items[pos], args.max_new_tokens, pos)
                rates[name].append((pos, len(result.new_tokens) / seconds))
                if repeat == 0:
                    traces[name]["real"].extend(result.trace)
    for name, drafter in make_drafters().items():
        replay = ReplayDecoder(recording, target, drafter, policy=policy, verify_cost=cost,
                               recorded_index=lambda pos: items[pos].index)
        for pos in positions:
            traces[name]["replay"].extend(replay.generate(list(items[pos].ids), args.max_new_tokens,
                                                          stream_index=pos).trace)
    out = {}
    for name in names:
        real, rep = Trace(traces[name]["real"], {}), Trace(traces[name]["replay"], {})
        row = compare_traces(real, rep)
        row.pop("differences", None)
        row["tokens_per_s"] = float(np.mean([r for _, r in rates[name]]))
        row["per_prompt"] = per_prompt_counts(real)
        row["tokens_per_s_per_prompt"] = rates[name]
        out[name] = row
    log_ratio = [math.log(a / f) for (_, a), (_, f) in zip(rates["adapted"], rates["frozen"])]
    mean, half = log_ratio_t_interval(log_ratio)
    out["gain"] = paired_gain(out["frozen"]["per_prompt"], out["adapted"]["per_prompt"])
    out["speed_gain"] = math.exp(mean) - 1
    out["speed_gain_ci"] = [math.exp(mean - half) - 1, math.exp(mean + half) - 1]
    return out


def _online(inner, state: dict):
    """The run's online method around ``inner`` (a fresh learner with the run's
    settings, as `StreamRunner` builds it), starting from ``inner``'s parameters."""
    spec = resolve_method(state["method"])
    return online_drafter(inner, spec, state["config"]["online"], state["config"]["seed"])[0]


def _online_tau(run: Path, positions: list[int]) -> float:
    wanted, rounds, tokens = set(positions), 0, 0
    for record in Trace.load(run / "rounds.jsonl"):
        if int(record.stream_index) in wanted:
            rounds += 1
            tokens += int(record.tokens_per_round)
    return tokens / rounds if rounds else math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording")
    ap.add_argument("--run", required=True, help="the online method's folder (rounds.jsonl, chunk-NNN.pt)")
    ap.add_argument("--kind", required=True, help="its draft kind (hydra, medusa, eagle, eagle3)")
    ap.add_argument("--drafts", default=None, help="drafts folder the stream used (default: shipped drafts)")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--chunk", type=int, required=True)
    ap.add_argument("--chunks", default="", help="comma list of chunk indices (default: each domain's end)")
    ap.add_argument("--prompts", type=int, default=5, help="prompts of the next chunk served per check")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", "-k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--serve", choices=["frozen", "online"], default="frozen",
                    help="frozen: the state at the chunk's end, no updates; online: the run's online "
                         "method continues learning from it (round mode; updates timed on the wall clock)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "online_confirm.json")
    args = ap.parse_args(argv)
    if args.prompts < 2 or args.repeats < 1 or args.chunk < 1:
        ap.error("--prompts must be >= 2, --repeats and --chunk >= 1")
    run = Path(args.run)
    if not (run / "rounds.jsonl").is_file():
        ap.error(f"{run} has no rounds.jsonl (not an online method's stream folder)")
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.loading import load_model
    recording = open_recording(args.recording)
    items = recorded_items(recording, None, args.every)
    domains = [i.dataset for i in items]
    chunks = [int(c) for c in args.chunks.split(",") if c] or default_chunks(domains, args.chunk)
    state = load_checkpoint(run / "state.pt")
    if args.serve == "online" and state["config"]["online"]["mode"] != "round":
        ap.error("--serve online needs a round-mode run (a chunk-mode learner updates between chunks only)")
    target = load_model(recording.settings["target"], dtype=recording.settings["dtype"])
    options = {} if args.drafts is None else {"checkpoint": str(Path(args.drafts) / args.kind)}
    load_before = os.getloadavg()
    checks = []
    for c in chunks:
        first = (c + 1) * args.chunk
        positions = list(range(first, min(first + args.prompts, len(items))))
        if len(positions) < 2:
            ap.error(f"chunk {c} has fewer than 2 prompts after it in the stream")
        params = load_snapshot(run, c)["params"]

        def make_drafters(params=params):
            frozen = make_drafter(args.kind, target, train_if_missing=False, progress=False, **options)
            adapted = make_drafter(args.kind, target, train_if_missing=False, progress=False, **options)
            apply_snapshot(adapted, params)
            return {"adapted": adapted if args.serve == "frozen" else _online(adapted, state), "frozen": frozen}
        row = check_chunk(recording, target, make_drafters, items, positions, args)
        row.update(chunk=c, prompts=positions, domain=sorted({domains[p] for p in positions}),
                   tau_online_stream=_online_tau(run, positions))
        checks.append(row)
        print(f"chunk {c} -> prompts {positions[0]}..{positions[-1]} ({'/'.join(row['domain'])}): "
              f"tau real {row['adapted']['tau_real']:.3f} vs frozen {row['frozen']['tau_real']:.3f} "
              f"(replay {row['adapted']['tau_replay']:.3f} / {row['frozen']['tau_replay']:.3f}; "
              f"online in the stream {row['tau_online_stream']:.3f}); tokens/s {row['speed_gain']:+.1%} "
              f"[{row['speed_gain_ci'][0]:+.1%}, {row['speed_gain_ci'][1]:+.1%}]", file=sys.stderr)
    out = {"recording": str(args.recording), "run": str(run), "kind": args.kind, "drafts": args.drafts,
           "serve": args.serve, "method": state["method"],
           "every": args.every, "chunk": args.chunk, "max_new_tokens": args.max_new_tokens,
           "num_draft_tokens": args.num_draft_tokens, "repeats": args.repeats, "checks": checks,
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "torch_threads": torch.get_num_threads()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
