"""How far apart two *real decoder* runs of an online method drift when they differ only
in float32 rounding -- the floor under any replay's round-for-round match.

The decoder's greedy output never depends on how the verification block is padded
(`SpeculativeDecoder(verify_widths=...)`, lossless), but the target's hidden states
(the features an online head learns from) do, at the level of float32 rounding: a
block padded to another width runs other GEMM shapes. A frozen draft is insensitive
to that; an online learner integrates it over hundreds of updates. This script serves
the recording's first prompts with one method twice by the real decoder -- once
unpadded, once with every block padded to a wider width -- and compares the two runs
round by round exactly as ``specloop stream check-replay`` compares the decoder with
the replay (`specloop.realmodels.streams.replay_check.compare_traces`), plus the position-keyed
match (rounds starting at the same token position of the same prompt).

    OMP_NUM_THREADS=1 python benchmarks/online_chaos.py --recording REC --prompts 10 \
        --method opt-hydra --out benchmarks/results/online_chaos.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path


def position_keyed_match(a, b) -> tuple[int, int]:
    """(rounds of ``a``, rounds of ``a`` whose (prompt, start position) round in ``b``
    drafted, accepted and committed the same numbers of tokens)."""
    def keyed(trace):
        position, out = collections.defaultdict(int), {}
        for r in trace:
            out[(r.stream_index, position[r.stream_index])] = (r.num_draft_tokens, r.accepted_tokens,
                                                               r.tokens_per_round)
            position[r.stream_index] += r.tokens_per_round
        return out
    ka, kb = keyed(a), keyed(b)
    return len(ka), sum(1 for k, v in ka.items() if kb.get(k) == v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recording", required=True)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--method", default="opt-hydra")
    parser.add_argument("--mode", default="round")
    parser.add_argument("--work", default="/tmp/online_chaos")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "online_chaos.json"))
    args = parser.parse_args()

    from specloop.realmodels.loading import load_model
    from specloop.realmodels.streams.replay_check import compare_traces
    from specloop.realmodels.streams.runner import StreamConfig, StreamRunner
    from specloop.realmodels.recording import open_recording, recorded_items
    from specloop.record import Trace
    recording = open_recording(args.recording)
    items = recorded_items(recording, args.prompts)
    target = load_model(recording.settings["target"], dtype=recording.settings["dtype"])
    config = StreamConfig(chunk=4, max_new_tokens=int(recording.settings["max_new_tokens"]), num_draft_tokens=4,
                          online={"mode": args.mode}, seed=0)
    padded = {n: n + 3 for n in range(1, 33)}            # every block verified 3 positions wider

    class PaddedRunner(StreamRunner):
        def _decoder(self, drafter, index):
            decoder = super()._decoder(drafter, index)
            decoder.verify_widths = padded
            return decoder

    load_before, t0, traces = os.getloadavg(), time.perf_counter(), {}
    for name, cls in (("unpadded", StreamRunner), ("padded", PaddedRunner)):
        runner = cls(target, [list(i.ids) for i in items], Path(args.work) / name, config)
        runner.run_method(args.method)
        traces[name] = Trace.load(Path(args.work) / name / args.method / "rounds.jsonl")
    row = compare_traces(traces["unpadded"], traces["padded"])
    rounds, keyed = position_keyed_match(traces["unpadded"], traces["padded"])
    from specloop.realmodels.online import load_checkpoint
    outputs = {name: load_checkpoint(Path(args.work) / name / args.method / "state.pt")["outputs"]
               for name in traces}
    result = {"meta": {"date": datetime.now(timezone.utc).isoformat(), "recording": args.recording,
                       "prompts": len(items), "method": args.method, "mode": args.mode,
                       "torch_threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
                       "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                       "wall_s": time.perf_counter() - t0},
              "decoder_vs_decoder": {**{k: row[k] for k in ("rounds", "matching_rounds", "tau_real", "tau_replay",
                                                            "tau_gap")},
                                     "matching_fraction": row["matching_rounds"] / max(row["rounds"], 1),
                                     "position_keyed_matching": keyed,
                                     "position_keyed_fraction": keyed / max(rounds, 1),
                                     "first_differences": row["differences"][:5],
                                     "outputs_equal": outputs["unpadded"] == outputs["padded"]}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["decoder_vs_decoder"], indent=1))


if __name__ == "__main__":
    main()
