"""Trained heads on a held-out recorded stream: tau for chain k = 2..6 and the dynamic
tree, per-depth acceptance and priced speed, before / after retraining.

The stream is a `specloop stream record` recording of held-out prompts (default
``/work/recordings/sharegpt3x400``: 1200 held-out ShareGPT first turns, code / writing /
chat, SmolLM2-135M float32 greedy, 128 new tokens); every ``--every``-th prompt is
served. Each head is replayed with `specloop.realmodels.streams.replay.ReplayDecoder`, which is
exact for greedy decoding (`specloop stream check-replay` checks it against the real
decoder round for round), so a row costs the head's forwards only, not the target's.

Rows, per head and plan (``chain-k<K>`` for each ``--ks``, ``tree`` = the EAGLE-2 dynamic
tree ``--tree``): tau (``mean_accepted_length``, bonus included), verified nodes per
round, per domain tau, and priced tokens/s with its ratio to priced greedy in each dtype
(drafting measured here on one thread, verification priced from the shipped SmolLM2 CPU
cost tables, `benchmarks/stream_sources.round_summary`). For the deepest chain the
per-depth acceptance ``acceptance_by_depth[s-1]`` = P(step s accepted | steps < s
accepted) over the rounds that drafted step s: on the accepted path a greedy head's
inputs are the target's own tokens, so this is the held-out top-1 of draft step s along
the stream; ``vocab_coverage_of_stream_tokens`` per domain is the fraction of the served
continuations' tokens inside the head's reduced vocabulary, the ceiling on that
acceptance. A head folder's training report (positions, seconds, held-out top-1 per
step on its own validation split) is copied beside its rows.

Heads: ``--head LABEL=KIND`` (the draft cache, else the copy shipped in the package) or
``--head LABEL=KIND@FOLDER`` (a `specloop draft train --out FOLDER` draft). Each finished
(head, plan) cell is written to ``--out`` at once; a rerun with the same settings skips
the cells already there (a file written with other settings is refused, exit 2).

    python benchmarks/heads_recording_tau.py --head shipped=eagle3 --head warm=eagle3@DIR \
        [--recording DIR] [--every 20] [--ks 2,3,4,5,6] [--tree topk=4,depth=5,v=16] --out FILE
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_RECORDING = "/work/recordings/sharegpt3x400"
COLUMNS = ("stream_index", "tokens", "verified", "nodes", "draft", "update", "accepted")


def parse_head(spec: str) -> tuple[str, str, str | None]:
    """``LABEL=KIND[@FOLDER]`` -> (label, kind, folder or None).

    Raises:
        ValueError: no label, or a kind that is not a trained-head kind."""
    label, sep, rest = spec.partition("=")
    kind, _, folder = rest.partition("@")
    if not sep or not label or kind not in ("eagle", "eagle3", "medusa", "hydra", "small-lm"):
        raise ValueError(f"--head {spec!r}: use LABEL=KIND[@FOLDER] with KIND one of eagle, eagle3, medusa, "
                         "hydra, small-lm")
    return label, kind, folder or None


def plans(ks: list[int], tree: str) -> dict:
    """Plan name -> `FixedDraftPolicy` (chains of each k, then the tree)."""
    from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
    out = {f"chain-k{k}": FixedDraftPolicy(k) for k in ks}
    shape = parse_tree_shape(tree)
    out["tree"] = FixedDraftPolicy(shape.max_depth, shape)
    return out


def replay_rows(rec, target, drafter, policy, items, seed: int = 0) -> dict:
    """Per-round columns (`COLUMNS`) of ``items`` replayed in order with one drafter."""
    from specloop.realmodels.streams.replay import ReplayDecoder
    cols = {k: [] for k in COLUMNS}
    for item in items:
        decoder = ReplayDecoder(rec, target, drafter, policy=policy, seed=seed + item.index)
        result = decoder.generate(list(item.ids), rec.prompt(item.index)["new_tokens"], stream_index=item.index)
        for r in result.trace:
            for key, value in zip(COLUMNS, (r.stream_index, r.tokens_per_round, r.verified_tokens,
                                            r.num_draft_tokens, r.draft_time, r.update_time, r.accepted_tokens)):
                cols[key].append(value)
    return {k: np.asarray(v) for k, v in cols.items()}


def acceptance_by_depth(cols: dict, depth: int) -> list[float]:
    """P(step s accepted | steps < s accepted) for s = 1..depth over chain rounds that
    drafted step s (``nodes >= s``); NaN where no round reached step s."""
    out = []
    for s in range(1, depth + 1):
        reached = (cols["nodes"] >= s) & (cols["accepted"] >= s - 1)
        out.append(float((cols["accepted"][reached] >= s).mean()) if reached.any() else float("nan"))
    return out


def cell(cols: dict, domain_of: dict, costs: dict, chain_depth: int | None) -> dict:
    """The row of one (head, plan): `round_summary` over all rounds, tau per domain and,
    for a chain, the per-depth acceptance."""
    try:
        from benchmarks.stream_sources import round_summary
    except ImportError:                 # run as a script from benchmarks/
        from stream_sources import round_summary
    row = round_summary(cols, np.ones(len(cols["tokens"]), dtype=bool), costs)
    domains = np.asarray([domain_of[int(i)] for i in cols["stream_index"]])
    row["tau_per_domain"] = {d: float(cols["tokens"][domains == d].sum() / (domains == d).sum())
                             for d in sorted(set(domains.tolist()))}
    if chain_depth:
        row["acceptance_by_depth"] = acceptance_by_depth(cols, chain_depth)
    return row


def vocab_coverage(drafter, rec, items) -> dict:
    """Per domain, the fraction of the served prompts' recorded greedy continuation
    tokens inside the head's reduced draft vocabulary: the ceiling on every draft step's
    greedy acceptance (a token outside it can never be drafted). {} for a head without one."""
    vocab = getattr(drafter, "vocab", None)
    d2t = getattr(vocab, "d2t", None)
    if d2t is None:
        d2t = getattr(vocab, "draft_to_target", None)
    if d2t is None:
        return {}
    inside = np.zeros(int(rec.manifest["model"]["vocab_size"]), dtype=bool)     # the target's vocabulary
    inside[np.asarray(d2t.cpu(), dtype=np.int64)] = True
    hits: dict[str, list[int]] = {}
    for item in items:
        record = rec.prompt(item.index)
        tokens = np.asarray(record["tokens"][record["prompt_length"]:], dtype=np.int64)
        got = hits.setdefault(item.dataset, [0, 0])
        got[0] += int(inside[tokens].sum())
        got[1] += int(tokens.size)
    return {d: h / n for d, (h, n) in sorted(hits.items()) if n}


def training_report(kind: str, folder: str | None, target_name: str) -> dict:
    """The head's saved training report (what ``specloop draft train`` wrote), or {}."""
    from specloop.realmodels.heads.common import find_draft
    path = find_draft(target_name, kind, folder)
    if path is None:
        return {}
    data = json.loads(path.with_suffix(".json").read_text())
    keep = ("heldout_top1_per_step", "positions_seen", "positions_seen_total", "train_seconds",
            "train_seconds_total", "optimizer_steps", "draft_vocab_size")
    report = {k: data[k] for k in keep if k in data}
    config = data.get("train_config", {})
    report.update(init_from=config.get("init_from"), recording_data=config.get("recording_data"),
                  file=str(path))
    return report


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", action="append", required=True, help="LABEL=KIND[@FOLDER], repeatable")
    parser.add_argument("--recording", default=DEFAULT_RECORDING)
    parser.add_argument("--every", type=int, default=20, help="serve every N-th recorded prompt")
    parser.add_argument("--ks", default="2,3,4,5,6", help="chain draft lengths")
    parser.add_argument("--tree", default="topk=4,depth=5,v=16", help="EAGLE-2 dynamic tree (decode.py's head tree)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--out", required=True, help="JSON file, written after every cell")
    args = parser.parse_args(argv)
    try:
        args.heads = [parse_head(h) for h in args.head]
        args.ks = [int(k) for k in args.ks.split(",") if k]
    except ValueError as exc:
        parser.error(str(exc))
    if args.every < 1 or not args.ks or min(args.ks) < 1 or len({h[0] for h in args.heads}) != len(args.heads):
        parser.error("--every and every k must be >= 1, and head labels distinct")
    return args


def _settings(args) -> dict:
    return {"recording": str(args.recording), "every": args.every, "ks": args.ks, "tree": args.tree,
            "target": args.target}


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    import torch
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.streams.replay import load_verify_cost
    from specloop.realmodels.recording import open_recording, recorded_items
    out = Path(args.out)
    done = json.loads(out.read_text()) if out.is_file() else {"settings": _settings(args), "heads": {}}
    if done.get("settings") != _settings(args):
        print(f"heads_recording_tau: {out} was written with other settings {done.get('settings')}", file=sys.stderr)
        return 2
    try:
        rec = open_recording(args.recording)
        items = recorded_items(rec, every=args.every)
    except (FileNotFoundError, ValueError) as exc:
        print(f"heads_recording_tau: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    domain_of = {it.index: it.dataset for it in items}
    costs = {d: load_verify_cost(None, d) for d in ("float32", "bfloat16")}
    target = load_model(args.target, dtype="float32")
    done["meta"] = {"prompts": len(items), "load_avg_start": os.getloadavg(), "torch_threads": 1,
                    "recording_settings": rec.settings, "pricing": "tau exact (greedy float32 recording); "
                    "tokens/s = tokens / (measured drafting + verify seconds from the shipped cost table)"}
    for label, kind, folder in args.heads:
        head = done["heads"].setdefault(label, {"kind": kind, "folder": folder, "rows": {}})
        head["training"] = training_report(kind, folder, args.target)
        drafter = make_drafter(kind, target, checkpoint=folder, train_if_missing=False, progress=False)
        head["vocab_coverage_of_stream_tokens"] = vocab_coverage(drafter, rec, items)
        for name, policy in plans(args.ks, args.tree).items():
            if name in head["rows"]:
                continue
            t0 = time.perf_counter()
            cols = replay_rows(rec, target, drafter, policy, items)
            row = cell(cols, domain_of, costs, int(name.removeprefix("chain-k")) if name.startswith("chain") else None)
            row["seconds"] = time.perf_counter() - t0
            row["load_avg"] = os.getloadavg()
            head["rows"][name] = row
            out.write_text(json.dumps(done, indent=1))
            print(f"[{label}] {name}: tau {row['mean_accepted_length']:.3f} "
                  f"({row['seconds']:.0f} s, load {row['load_avg'][0]:.2f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
