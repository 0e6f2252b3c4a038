"""What int8 row-wise storage of the shipped heads costs in mean accepted length.

For every shipped head of the embedded SmolLM2-135M-Instruct target, greedy float32
chain decoding (k = ``--draft-length``) of ``--prompts`` held-out prompts (every
1200 / N-th prompt of ``data/answers/sharegpt-heldout-1200``, so all three domains) x
``--max-new-tokens`` tokens, once with the head as given (``--reference``: a folder of
float16 shipped files, default the package's own when they are float16) and once with
the same head written in int8 row-wise storage (`specloop.realmodels.heads.compact`),
loaded back to float32. Reports tau (tokens per round) of each, the relative change,
the bytes of each file, and how many prompts decoded with identical rounds. Greedy
float32 is deterministic, so the difference is the storage's, not noise.

    python benchmarks/heads_compact_tau.py [--prompts 16] [--max-new-tokens 64]
        [--draft-length 4] [--group-size 64] [--kinds eagle,hydra] [--reference DIR] [--out benchmarks/results/heads_compact_tau.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELDOUT = REPO / "data" / "answers" / "sharegpt-heldout-1200"
KINDS = ("eagle", "eagle3", "hydra", "medusa", "small-lm")
TARGET = "smollm2-135m"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "heads_compact_tau.json"


def _prompts(count: int) -> list[list[int]]:
    from specloop.realmodels.answers.answer_set import open_answer_set
    step = max(1, 1200 // count)
    wanted = {i * step for i in range(count)}
    found = {r["stream_index"]: [int(t) for t in r["prompt"]] for r in open_answer_set(HELDOUT).records()
             if r["stream_index"] in wanted}
    return [found[i] for i in sorted(found)]


def _write_int8(src: Path, folder: Path, group_size: int) -> Path:
    from safetensors.torch import load_file, save_file
    from specloop.realmodels.heads.compact import compact_tensors, expand_tensors
    folder.mkdir(parents=True, exist_ok=True)
    packed, metadata = compact_tensors(expand_tensors(load_file(str(src)), None), group_size=group_size)
    save_file(packed, str(folder / "draft.safetensors"), metadata=metadata)
    shutil.copyfile(src.with_suffix(".json"), folder / "draft.json")
    return folder / "draft.safetensors"


def _copy(src: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, folder / "draft.safetensors")
    shutil.copyfile(src.with_suffix(".json"), folder / "draft.json")
    return folder / "draft.safetensors"


def _per_prompt(target, drafter, prompts, args) -> list[dict]:
    from specloop.realmodels.heads.acceptance import acceptance_profile
    return [acceptance_profile(target, drafter, [p], max_new_tokens=args.max_new_tokens,
                               draft_length=args.draft_length) for p in prompts]


def _summary(rows: list[dict]) -> dict:
    rounds = sum(r["rounds"] for r in rows)
    tokens = sum(r["new_tokens"] for r in rows)
    return {"tau": round(tokens / rounds, 5), "rounds": rounds, "new_tokens": tokens}


def run(args) -> dict:
    from specloop.realmodels.heads.common import pretrained_path
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.registry.drafters import make_drafter
    target = load_model(TARGET, dtype="float32")
    prompts = _prompts(args.prompts)
    heads = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            src = (Path(args.reference) / pretrained_path(TARGET, kind).name) if args.reference \
                else pretrained_path(TARGET, kind)
            files = {"float16": _copy(src, Path(tmp) / kind / "f16"),
                     "int8": _write_int8(src, Path(tmp) / kind / "int8", args.group_size)}
            rows = {}
            for name, file in files.items():
                drafter = make_drafter(kind, target, checkpoint=str(file.parent), train_if_missing=False,
                                       progress=False)
                rows[name] = _per_prompt(target, drafter, prompts, args)
            f16, i8 = _summary(rows["float16"]), _summary(rows["int8"])
            heads[kind] = {"float16": {**f16, "bytes": files["float16"].stat().st_size},
                           "int8": {**i8, "bytes": files["int8"].stat().st_size},
                           "tau_change": round(i8["tau"] / f16["tau"] - 1.0, 5),
                           "prompts_same_rounds": sum(a["rounds"] == b["rounds"] and a["per_position"] == b["per_position"]
                                                      for a, b in zip(rows["float16"], rows["int8"]))}
            print(f"{kind}: tau {f16['tau']:.4f} -> {i8['tau']:.4f} ({heads[kind]['tau_change']:+.3%})", flush=True)
    return {"benchmark": "heads_compact_tau", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "settings": {"target": TARGET, "dtype": "float32", "prompts": len(prompts),
                         "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length,
                         "group_size": args.group_size,
                         "prompt_stream_indices_step": max(1, 1200 // args.prompts)},
            "load_average": round(os.getloadavg()[0], 2), "heads": heads,
            "max_abs_tau_change": max(abs(h["tau_change"]) for h in heads.values()),
            "target_max_abs_tau_change": 0.005}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64, help="columns per int8 scale (0: one per row)")
    parser.add_argument("--kinds", type=lambda t: tuple(t.split(",")), default=KINDS)
    parser.add_argument("--reference", default=None, help="folder of float16 <target>-<kind>.safetensors + .json")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    result = run(args)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"max |tau change| {result['max_abs_tau_change']:.3%} (target {result['target_max_abs_tau_change']:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
