"""``specloop stream check-replay REC``: serve a recording's first prompts with each
method by the real decoder and by the replay, and compare round by round
(`specloop.realmodels.streams.replay_check`).

``--json`` prints one object: ``rounds``, ``matching_rounds``, ``tau_replay``,
``tau_real``, ``divergent_prompts`` (prompts where batch-1 greedy decoding left the
recording; of the first method), ``passed``, and per method under ``methods`` the same
keys plus ``tau_gap`` and the first ``differences``. Exit 1 when a float32 check fails
(fewer than 99 % matching rounds or tau more than 1 % apart), 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register_check", "run_check"]


def register_check(sub) -> None:
    from specloop.cli._online_flags import add_online_flags
    parser = sub.add_parser("check-replay", help="compare a replay with the real decoder round for round",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", metavar="REC", help="recording folder ('specloop stream record')")
    parser.add_argument("--method", default="hydra,opt-hydra", help="comma-separated methods (as 'specloop stream')")
    parser.add_argument("--prompts", type=int, default=10, help="the recording's first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the recording's")
    parser.add_argument("-k", "--num-draft-tokens", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=4)
    add_online_flags(parser, mode_default="round")
    parser.add_argument("--drafts", default=None, metavar="DIR", help="as 'specloop stream --drafts'")
    parser.add_argument("--cost-table", default=None, metavar="FILE", help="the replay's verify-cost JSON")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="keep both runs' records here (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run_check)


def _check(args) -> dict:
    from tqdm.auto import tqdm

    from specloop.cli._online_flags import online_flags
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.streams.replay import load_verify_cost
    from specloop.realmodels.streams.replay_check import check_replay
    from specloop.realmodels.streams.runner import StreamConfig, resolve_method
    from specloop.cli._paths import check_paths
    from specloop.realmodels.recording import open_recording
    check_paths(args, out_folders=("out",), in_folders=("recording=REC", "drafts"), in_files=("cost_table",))
    recording = open_recording(args.recording)
    methods = [resolve_method(m).name for m in args.method.split(",") if m.strip()]
    if not methods:
        raise ValueError("--method names no method")
    if args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
    recorded = int(recording.settings["max_new_tokens"])
    max_new = recorded if args.max_new_tokens is None else int(args.max_new_tokens)
    if not 1 <= max_new <= recorded:
        raise ValueError(f"--max-new-tokens must be in [1, {recorded}] (the recording's), got {max_new}")
    online = online_flags(args)
    config = StreamConfig(chunk=args.chunk, max_new_tokens=max_new, num_draft_tokens=args.num_draft_tokens,
                          online=online, seed=args.seed)
    cost = load_verify_cost(args.cost_table, recording.settings["dtype"])
    target = load_model(recording.settings["target"], dtype=recording.settings["dtype"], device=args.device)
    bar = tqdm(total=2 * len(methods) * min(args.prompts, recording.num_prompts), desc="check-replay",
               unit="prompt", disable=args.json, file=sys.stderr)
    try:
        return check_replay(recording, target, methods, config, prompts=args.prompts, verify_cost=cost,
                            drafts_dir=args.drafts, out=args.out, progress=bar.update)
    finally:
        bar.close()


def run_check(args) -> int:
    try:
        result = _check(args)
    except (ValueError, FileNotFoundError, IndexError) as err:
        print(f"specloop stream check-replay: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for name, row in result["methods"].items():
            verdict = {True: "ok", False: "FAILED", None: "reported (bfloat16)"}[row["passed"]]
            print(f"{name:<14} rounds {row['rounds']:5d}  matching {row['matching_rounds']:5d} "
                  f"({100 * row['matching_rounds'] / max(row['rounds'], 1):.2f} %)  tau real {row['tau_real']:.4f} "
                  f"replay {row['tau_replay']:.4f}  divergent prompts {len(row['divergent_prompts'])}  {verdict}")
    return 1 if result["passed"] is False else 0
