"""Two draft heads of one kind, paired prompt by prompt on the same held-out recording.

Each head drafts every prompt of a greedy recording (``specloop stream record``, e.g.
rebuilt from ``data/answers/sharegpt-heldout-1200``) through the exact greedy replay
(`specloop.realmodels.streams.replay.ReplayDecoder`, the engine ``draft train``'s
``heldout_tau`` uses), with one plan (``--plan``: ``tree`` = the dynamic tree top-k 4,
depth 5, 16 verified, or ``chain-k<K>``). Per prompt: rounds and tokens of each head;
then `specloop.stats.paired_gain` of head B over head A: the geometric-mean per-prompt
tau ratio - 1 with its Student-t 95 % interval, the pooled gain, better / worse / ties and
the Wilcoxon signed-rank p-value. ``verdict`` says whether B beats A (interval above 0),
loses (below) or is undecided.

    python benchmarks/heads_paired_tau.py --kind eagle3 --recording REC \
        --a shipped --b ~/.cache/specloop/trained-heads/eagle3-answers-2ep [--plan tree] \
        [--every 12] [--prompts 100] [--out benchmarks/results/heads_paired_tau_eagle3.json]

``shipped`` names the package's own head of that kind (copied to a temporary folder, so a
trained copy in the draft cache is never picked up instead).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

TARGET = "smollm2-135m"
TREE = "topk=4,depth=5,v=16"


def _folder(spec: str, kind: str, tmp: Path) -> Path:
    if spec != "shipped":
        return Path(spec).expanduser()
    from specloop.realmodels.heads.common import pretrained_path
    src = pretrained_path(TARGET, kind)
    out = tmp / "shipped"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out / "draft.safetensors")
    shutil.copyfile(src.with_suffix(".json"), out / "draft.json")
    return out


def _policy(plan: str):
    from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
    if plan == "tree":
        shape = parse_tree_shape(TREE)
        return FixedDraftPolicy(shape.max_depth, shape)
    if plan.startswith("chain-k"):
        return FixedDraftPolicy(int(plan[len("chain-k"):]))
    raise ValueError(f"--plan must be 'tree' or 'chain-k<K>', got {plan!r}")


def _per_prompt(folder: Path, kind: str, target, rec, items, policy) -> list[dict]:
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.streams.replay import ReplayDecoder
    drafter = make_drafter(kind, target, checkpoint=str(folder), train_if_missing=False, progress=False)
    rows = []
    for item in items:
        decoder = ReplayDecoder(rec, target, drafter, policy=policy, seed=item.index)
        result = decoder.generate(list(item.ids), rec.prompt(item.index)["new_tokens"], stream_index=item.index)
        counts = [r.tokens_per_round for r in result.trace]
        rows.append({"index": int(item.index), "rounds": len(counts), "tokens": int(sum(counts))})
    return rows


def run(args) -> dict:
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.recording import open_recording, recorded_items
    from specloop.stats import paired_gain
    target = load_model(TARGET, dtype="float32")
    rec = open_recording(args.recording)
    items = recorded_items(rec)[:: args.every]
    items = items[: args.prompts] if args.prompts else items
    policy = _policy(args.plan)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in (("a", args.a), ("b", args.b)):
            t0 = time.perf_counter()
            rows = _per_prompt(_folder(spec, args.kind, Path(tmp)), args.kind, target, rec, items, policy)
            rounds, tokens = sum(r["rounds"] for r in rows), sum(r["tokens"] for r in rows)
            out[name] = {"head": spec, "tau": tokens / rounds, "rounds": rounds, "tokens": tokens,
                         "seconds": round(time.perf_counter() - t0, 1), "per_prompt": rows}
            print(f"{name} ({spec}): tau {tokens / rounds:.4f}", flush=True)
    gain = paired_gain(out["a"]["per_prompt"], out["b"]["per_prompt"])
    low, high = gain["gain_ci"]
    verdict = "b beats a" if low > 0 else "a beats b" if high < 0 else "undecided"
    return {"benchmark": "heads_paired_tau", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "settings": {"target": TARGET, "kind": args.kind, "recording": str(args.recording),
                         "every": args.every, "prompts": len(items), "plan": args.plan, "tree_shape": TREE if args.plan == "tree" else None},
            "load_average": round(os.getloadavg()[0], 2), "a": out["a"], "b": out["b"],
            "b_over_a": gain, "verdict": verdict}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", required=True, choices=("eagle", "eagle3", "hydra", "medusa", "small-lm"))
    parser.add_argument("--recording", required=True, type=Path)
    parser.add_argument("--a", default="shipped", help="head A: a draft folder or 'shipped'")
    parser.add_argument("--b", required=True, help="head B: a draft folder or 'shipped'")
    parser.add_argument("--plan", default="tree")
    parser.add_argument("--every", type=int, default=1, help="every N-th recorded prompt (all domains of a stream)")
    parser.add_argument("--prompts", type=int, default=100, help="at most this many (0: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    g = result["b_over_a"]
    print(f"b over a: {g['gain']:+.1%} [{g['gain_ci'][0]:+.1%}, {g['gain_ci'][1]:+.1%}] "
          f"({g['better']} better, {g['worse']} worse) -> {result['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
