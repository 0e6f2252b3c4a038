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
`specloop.realmodels.stream_compare.paired_gain`); plus ``baseline_tokens_per_s``,
``stream`` (dataset of each prompt) and ``config``.
Exit code 1 when a method cannot run (e.g. its draft is not trained).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register", "run", "plot_stream"]

DEFAULT_METHODS = "hydra,osd-hydra,opt-hydra,ens-hydra"


def register(subparsers) -> None:
    from specloop.strategies.precondition import PRECONDITIONERS
    parser = subparsers.add_parser("stream", help="online draft adaptation over a real prompt stream",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m", help="target model (registry name, HF id or path)")
    parser.add_argument("--method", default=DEFAULT_METHODS,
                        help=f"comma-separated methods (default {DEFAULT_METHODS}); e.g. vanilla-sd, osd, "
                             "hydra, osd-hydra, opt-hydra, eagle, ens-eagle, eagle3, ens-eagle3, optens-hydra")
    parser.add_argument("--datasets", default="humaneval,mt-bench,ifbench",
                        help="comma-separated datasets, in domain order")
    parser.add_argument("--order", choices=["shift", "interleave"], default="shift",
                        help="shift: dataset after dataset (domain shift); interleave: round-robin")
    parser.add_argument("--prompts", type=int, default=12, help="prompts in the stream (split over datasets)")
    parser.add_argument("--chunk", type=int, default=4, help="prompts per chunk")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("-k", "--num-draft-tokens", type=int, default=4, help="chain length k per round")
    parser.add_argument("--mode", choices=["round", "chunk"], default="chunk",
                        help="chunk (default, the paper's App. B set-up): epochs over each chunk's samples after the chunk; round: a micro-update from a replay buffer every round")
    parser.add_argument("--lr", type=float, default=None, help="learner step size (default per learner)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--update-every", type=int, default=1, help="rounds between micro-updates (round mode)")
    parser.add_argument("--epochs", type=int, default=2, help="passes per chunk (chunk mode)")
    parser.add_argument("--precondition", choices=PRECONDITIONERS, default="none",
                        help="rms: divide the learner's gradients by their running RMS (adaptive OGD, "
                             "Adam-like per-element steps of size --lr); none: raw gradients")
    parser.add_argument("--background", action="store_true", help="update on a worker thread (App. B.2)")
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
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def _check_args(args) -> None:
    for name in ("prompts", "chunk", "max_new_tokens", "num_draft_tokens", "batch_size", "epochs", "update_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def run(args) -> int:
    from specloop.data.streams import build_stream
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.stream import BASELINE, StreamConfig, StreamRunner, resolve_method
    _check_args(args)
    specs = [resolve_method(m) for m in args.method.split(",") if m.strip()]
    if not specs:
        raise ValueError("--method names no method")
    target = load_model(args.target, dtype=args.dtype, device=args.device)
    items = build_stream(args.datasets, args.prompts, target.tokenizer, order=args.order,
                         chat_template=not args.raw, max_prompt_tokens=args.max_prompt_tokens)
    online = {"mode": args.mode, "lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs,
              "update_every": args.update_every, "precondition": args.precondition,
              "background": args.background}
    config = StreamConfig(chunk=args.chunk, max_new_tokens=args.max_new_tokens,
                          num_draft_tokens=args.num_draft_tokens, online=online, seed=args.seed)
    out = Path(args.out)
    runner = StreamRunner(target, [list(i.ids) for i in items], out, config, drafts_dir=args.drafts)
    names = [BASELINE] + [s.name for s in specs if s.name != BASELINE]
    summaries, failures = {}, {}
    from tqdm.auto import tqdm
    with tqdm(total=len(names) * len(items), desc="stream", unit="prompt", disable=args.json,
              file=sys.stderr) as bar:
        for name in names:
            bar.set_postfix_str(name)
            try:
                summaries[name] = runner.run_method(name, progress=bar.update)
            except (FileNotFoundError, ValueError) as exc:
                if name == BASELINE:
                    raise
                failures[name] = str(exc)
                print(f"specloop stream: {name}: {exc}", file=sys.stderr)
    result = _result(summaries, failures, items, config, args)
    (out / "summary.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    plot_stream(result, out / "stream.png")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_table(result)
    return 1 if failures else 0


def _vs_frozen(name: str, summaries: dict, domains: list[str]) -> dict | None:
    """Paired per-prompt gain of an online method over the frozen method with the
    same draft, overall and per dataset (None for a frozen method or when its frozen
    counterpart did not run)."""
    from specloop.realmodels.stream import METHODS, resolve_method
    from specloop.realmodels.stream_compare import paired_gain
    spec = resolve_method(name)
    frozen = next((m.name for m in METHODS.values() if m.drafter == spec.drafter and m.learner is None), None)
    if spec.learner is None or frozen not in summaries:
        return None
    a, b = summaries[frozen].get("prompts", []), summaries[name].get("prompts", [])
    per_domain = {d: paired_gain([p for p in a if domains[p["index"]] == d], [p for p in b if domains[p["index"]] == d])
                  for d in dict.fromkeys(domains)}
    return {"frozen": frozen, **paired_gain(a, b), "per_domain": per_domain}


def _result(summaries: dict, failures: dict, items, config, args) -> dict:
    from specloop.realmodels.stream import BASELINE, resolve_method
    from specloop.realmodels.stream_compare import domain_accepted_length
    domains = [i.dataset for i in items]
    base = summaries[BASELINE]
    base_tps = base["tokens_per_s"]
    methods = {}
    for name, s in summaries.items():
        if name == BASELINE:
            continue
        methods[name] = {
            "label": resolve_method(name).label,
            "mean_accepted_length": s["mean_accepted_length"],
            "speedup": s["tokens_per_s"] / base_tps,
            "speedup_with_training": s["tokens_per_s_with_training"] / base_tps,
            "tokens_per_s": s["tokens_per_s"], "tokens_per_s_with_training": s["tokens_per_s_with_training"],
            "update_seconds": s["update_seconds"],
            "per_chunk": [c["mean_accepted_length"] for c in s["chunks"]],
            "per_chunk_tokens_per_s": [c["tokens_per_s"] for c in s["chunks"]],
            "per_chunk_tokens_per_s_with_training": [c["tokens_per_s_with_training"] for c in s["chunks"]],
            "per_domain": domain_accepted_length(s.get("prompts", []), domains)}
        vs = _vs_frozen(name, summaries, domains)
        if vs is not None:
            methods[name]["vs_frozen"] = vs
    return {"target": args.target, "methods": methods, "failed": failures,
            "baseline_tokens_per_s": base_tps,
            "baseline_per_chunk_tokens_per_s": [c["tokens_per_s"] for c in base["chunks"]],
            "stream": domains,
            "config": {"datasets": args.datasets, "order": args.order, "prompts": len(items),
                       "drafts": getattr(args, "drafts", None),
                       "chunk": config.chunk, "max_new_tokens": config.max_new_tokens,
                       "num_draft_tokens": config.num_draft_tokens, **config.online}}


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
    """Two panels: mean accepted length and tokens/s per chunk, one line per method
    (online solid, frozen dashed; greedy baseline dotted on the tokens/s panel)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from specloop.realmodels.stream import resolve_method
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
    for i, (name, m) in enumerate(result["methods"].items()):
        style = "-" if resolve_method(name).learner else "--"
        chunks = list(range(len(m["per_chunk"])))
        axes[0].plot(chunks, m["per_chunk"], style, marker="o", ms=4, color=f"C{i}", label=m["label"])
        axes[1].plot(chunks, m["per_chunk_tokens_per_s"], style, marker="o", ms=4, color=f"C{i}",
                     label=m["label"])
    base = result["baseline_per_chunk_tokens_per_s"]
    axes[1].plot(range(len(base)), base, ":", color="k", label="greedy (no draft)")
    axes[0].set(xlabel="chunk (stream order)", ylabel="mean accepted length (tokens/round)")
    axes[1].set(xlabel="chunk (stream order)", ylabel="tokens/s (training excluded)")
    chunk = int(result["config"]["chunk"])
    stream = result.get("stream", [])
    ticks = list(range(len(base)))
    labels = [f"{c}\n{'+'.join(dict.fromkeys(stream[c * chunk:(c + 1) * chunk]))}" for c in ticks]
    for ax in axes:
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['target']}: {result['config']['datasets']} ({result['config']['order']})", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
