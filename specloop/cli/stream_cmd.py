"""``specloop stream``: serve a real prompt stream with frozen and online-adapted
drafts (OnlineSpec Table 1 rows) and report per-chunk mean accepted length and
tokens/s, with speedups over plain greedy decoding of the same target measured in
the same run.

Writes a resumable results folder (``--out``): per method ``<method>/rounds.jsonl``
(one round record per line), ``<method>/state.pt`` (after every prompt: progress,
draft parameters, learner state, replay buffer), ``<method>/chunks.json``; plus
``summary.json`` and ``stream.png`` (mean accepted length and tokens/s per chunk,
methods side by side). Run again with the same arguments to continue a killed run.

``--json`` prints one object: ``methods`` maps each method name to
``mean_accepted_length``, ``speedup`` (tokens/s without training time over the
greedy baseline's), ``speedup_with_training`` (update time included),
``per_chunk`` (mean accepted length per chunk), ``per_chunk_tokens_per_s``,
``per_domain`` (mean accepted length per dataset) and, for an online method whose
frozen draft ran too, ``vs_frozen`` (paired per-prompt gain in mean accepted length
with a 95 % interval and a Wilcoxon p-value, overall and per dataset;
`specloop.stats.paired_gain`); plus ``baseline_tokens_per_s``,
``stream`` (dataset of each prompt) and ``config``.
Exit code 1 when a method cannot run (e.g. its draft is not trained).

``specloop stream record --target T --datasets D1,D2 --prompts N --max-new-tokens M
--out REC`` records the target's side of a stream once (greedy continuations, the
features the heads read, top-m p_target at every position) for exact replays: see
`specloop.realmodels.recording` for the format. Resumable; a recording made with
other settings is refused (exit 2).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register", "run", "plot_stream"]

DEFAULT_METHODS = "hydra,osd-hydra,opt-hydra,ens-hydra"


def register(subparsers) -> None:
    from specloop.cli._online_flags import add_online_flags
    parser = subparsers.add_parser("stream", help="online draft adaptation over a real prompt stream",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m", help="target model (registry name, HF id or path)")
    parser.add_argument("--method", default=DEFAULT_METHODS,
                        help=f"comma-separated methods (default {DEFAULT_METHODS}); e.g. vanilla-sd, osd, "
                             "hydra, osd-hydra, opt-hydra, eagle, ens-eagle, eagle3, ens-eagle3, optens-hydra, suffix; "
                             "<method>+suffix (hydra+suffix, opt-hydra+suffix, ...): the suffix tree where it is "
                             "confident, else that head")
    parser.add_argument("--datasets", default="humaneval,mt-bench,ifbench",
                        help="comma-separated datasets, in domain order (of the --split split); a dataset may be a prompt "
                             "file (.jsonl, .json, .csv, .parquet: rows with 'prompt' or chat 'messages', optional "
                             "'id', 'domain'; every 4th row held out) or a dataset in the local Hugging Face cache "
                             "(owner/name[:split])")
    parser.add_argument("--split", choices=["heldout", "warmup", "all"], default="heldout",
                        help="the datasets' split (default heldout); 'all' serves every row of a prompt file "
                             "(ignored with --replay: the recording's split)")
    parser.add_argument("--order", choices=["shift", "interleave"], default="shift",
                        help="shift: dataset after dataset (domain shift); interleave: round-robin")
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts in the stream (split over datasets; default 12; with --replay: the "
                             "recording's first N, default all)")
    parser.add_argument("--chunk", type=int, default=4, help="prompts per chunk")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="tokens per prompt (default 96; with --replay the recording's)")
    parser.add_argument("-k", "--num-draft-tokens", type=int, default=4, help="chain length k per round")
    add_online_flags(parser, mode_default="chunk", background=True)
    parser.add_argument("--drafts", default=None, metavar="DIR",
                        help="read each method's draft from DIR/<kind> (as 'specloop draft train --out DIR/<kind>' "
                             "writes) instead of the draft cache or the shipped copy, e.g. drafts trained with "
                             "--corpus-mix on other domains")
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="keep the last N prompt tokens")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/stream", help="results folder (resumable)")
    parser.add_argument("--replay", default=None, metavar="REC",
                        help="replay every method against a recording ('specloop stream record'): exact greedy "
                             "rounds, real draft forwards / updates, the target's verification priced from "
                             "--cost-table; the stream, target and dtype are the recording's")
    parser.add_argument("--cost-table", default=None, metavar="FILE",
                        help="verify-cost JSON for --replay (benchmarks/verify_cost.py; default the shipped "
                             "SmolLM2-135M CPU table)")
    parser.add_argument("--snapshot-chunks", action="store_true",
                        help="online methods also save their draft's trainable parameters at the end of every "
                             "chunk (<method>/chunk-NNN.pt, for benchmarks/online_heldout.py); records unchanged")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)
    sub = parser.add_subparsers(dest="stream_action", metavar="ACTION")
    sub.required = False
    from specloop.cli.stream_check_cmd import register_check
    from specloop.cli.stream_record_cmd import register_record
    register_record(sub)
    register_check(sub)
    from specloop.cli.stream_scale_cmd import register_scale
    register_scale(sub)


def _check_args(args) -> None:
    for name in ("prompts", "chunk", "max_new_tokens", "num_draft_tokens", "batch_size", "epochs", "update_every"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def _stream_run(args):
    """The typed `specloop.realmodels.streams.results.StreamRun` of the parsed flags."""
    from specloop.realmodels.streams.runner import StreamConfig
    from specloop.cli._online_flags import online_flags
    from specloop.realmodels.streams.results import StreamRun
    online = online_flags(args)
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = 96 if args.replay is None else _recorded_max_new_tokens(args.replay)
    config = StreamConfig(chunk=args.chunk, max_new_tokens=max_new_tokens,
                          num_draft_tokens=args.num_draft_tokens, online=online, seed=args.seed)
    return StreamRun(methods=tuple(args.method.split(",")), config=config, out=Path(args.out), target=args.target,
                     datasets=args.datasets, order=args.order,
                     prompts=args.prompts if args.prompts is not None or args.replay else 12, raw=args.raw,
                     max_prompt_tokens=args.max_prompt_tokens, dtype=args.dtype, device=args.device,
                     drafts=args.drafts, replay=args.replay, cost_table=args.cost_table,
                     snapshot_chunks=bool(getattr(args, "snapshot_chunks", False)), split=args.split)


def _recorded_max_new_tokens(folder) -> int:
    from specloop.realmodels.recording import open_recording
    return int(open_recording(folder).settings["max_new_tokens"])


def run(args) -> int:
    from tqdm.auto import tqdm

    from specloop.cli._paths import check_paths
    from specloop.realmodels.streams.results import serve_stream
    _check_args(args)
    check_paths(args, out_folders=("out",), in_folders=("drafts", "replay"), in_files=("cost_table",))
    stream = _stream_run(args)
    bar = None

    def progress(name: str, served: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="stream", unit="prompt", disable=args.json, file=sys.stderr)
        if served:
            bar.update(served)
        else:
            bar.set_postfix_str(name)

    try:
        result = serve_stream(stream, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    for name, why in result["failed"].items():
        print(f"specloop stream: {name}: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_table(result)
    return 1 if result["failed"] else 0


def _result(summaries: dict, failures: dict, items, config, args) -> dict:
    """`specloop.realmodels.streams.results.stream_result` with the parsed flags' target, datasets, order, drafts."""
    from specloop.realmodels.streams.results import stream_result
    return stream_result(summaries, failures, items, config, target=args.target, datasets=args.datasets,
                         order=args.order, drafts=getattr(args, "drafts", None),
                         split=getattr(args, "split", "heldout"))


def _print_table(result: dict) -> None:
    print(f"greedy baseline: {result['baseline_tokens_per_s']:.2f} tokens/s")
    print(f"{'method':<16} {'tau':>6} {'speedup':>8} {'w/ train':>9}  {'tau vs frozen (paired, 95% CI)':<32} "
          "per-chunk tau")
    for name, m in result["methods"].items():
        chunks = " ".join(f"{t:.2f}" for t in m["per_chunk"])
        vs = m.get("vs_frozen")
        gain = "" if vs is None else (f"{100 * vs['gain']:+.1f}% [{100 * vs['gain_ci'][0]:+.1f}, "
                                      f"{100 * vs['gain_ci'][1]:+.1f}] p={vs['wilcoxon_p']:.2g}")
        print(f"{name:<16} {m['mean_accepted_length']:6.3f} {m['speedup']:8.3f} "
              f"{m['speedup_with_training']:9.3f}  {gain:<32} {chunks}")
    for name, why in result["failed"].items():
        print(f"{name:<16} FAILED: {why}")


def plot_stream(result: dict, path: str | Path) -> Path:
    """`specloop.realmodels.streams.results.plot_stream` (the figure of ``stream.png``)."""
    from specloop.realmodels.streams.results import plot_stream as plot
    return plot(result, path)
