"""Where a real decoder round's seconds go.

    python benchmarks/round_profile.py --json [--out benchmarks/results/round_profile.json]
        [--drafters ngram,eagle3,hydra,...] [--dtypes float32,bfloat16] [--prompts 4]
        [--max-new-tokens 48]

For every drafter, chain and tree plan and dtype, the prompts are decoded by profiled
`DecodeSession`s (``profile=True``): each round's seconds in the phases of
`specloop.realmodels.session.PHASES` -- ``draft`` (the drafter's ``propose``: its
forwards and its own tree building), ``tree_selection`` (the decoder's clip and the
hooks), ``mask_positions`` (block padding, tree mask, position ids), ``target_forward``
(the verification forward and its finiteness check), ``acceptance``, ``cache_surgery``
(target KV cache pruning, EOS / length cut), ``feedback`` (building the feedback and the
drafter's ``observe``: its own cache surgery and any online update) and ``record``. The
phases before ``record`` partition the round's wall clock (`tests/realmodels/
test_round_profile.py`). ``draft_module_forward`` is the time inside the draft's
torch modules (forward hooks on their leaf modules; functional ops such as attention
between them are not counted, so it is a lower bound of the draft's compute).

JSON per row: ``phases_s`` (mean seconds per round), ``round_s``, ``overhead_fraction`` =
1 - (draft + target_forward) / round (what is spent outside the draft's proposal and the
target's forward), ``overhead_fraction_strict`` = 1 - (draft_module_forward +
target_forward) / round, ``mean_accepted_length``, ``rounds``; plus the machine's load
average before and after. Measure on a quiet machine: one job at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specloop.data.prompts import load_prompts  # noqa: E402
from specloop.realmodels.decoder import SpeculativeDecoder  # noqa: E402
from specloop.realmodels.registry.drafters import make_drafter  # noqa: E402
from specloop.realmodels.loading import load_model  # noqa: E402
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape  # noqa: E402
from specloop.realmodels.session import PHASES  # noqa: E402
from specloop.strategies.engine import drive_round  # noqa: E402

TREES = {"eagle": "topk=4,depth=4,v=12", "eagle3": "topk=4,depth=4,v=12", "hybrid": "topk=4,depth=4,v=12"}
DEFAULT_TREE = "3x2x1"


class ModuleTimer:
    """Seconds inside the leaf modules of the drafter's torch modules (outermost call)."""

    def __init__(self, drafter, exclude: torch.nn.Module):
        self.seconds, self._depth, self._t0, self._handles = 0.0, 0, 0.0, []
        for module in _modules_of(drafter, exclude):
            for leaf in module.modules():
                if not any(True for _ in leaf.children()):
                    self._handles.append(leaf.register_forward_pre_hook(self._enter))
                    self._handles.append(leaf.register_forward_hook(self._leave))

    def _enter(self, *_):
        if self._depth == 0:
            self._t0 = time.perf_counter()
        self._depth += 1

    def _leave(self, *_):
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._t0

    def close(self):
        for h in self._handles:
            h.remove()


def _modules_of(drafter, exclude) -> list[torch.nn.Module]:
    seen, out = {id(exclude)}, []
    stack = [drafter]
    for _ in range(3):                          # the drafter, its parts, their parts
        nxt = []
        for obj in stack:
            for value in getattr(obj, "__dict__", {}).values():
                if isinstance(value, torch.nn.Module):
                    if id(value) not in seen:
                        seen.add(id(value))
                        out.append(value)
                elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.Tensor)):
                    nxt.append(value)
        stack = nxt
    return out


def profile_row(target, drafter, policy, prompts, max_new_tokens) -> dict:
    decoder = SpeculativeDecoder(target, drafter, policy=policy)
    timer = ModuleTimer(drafter, target.model)
    phases, rounds, tokens = {p: 0.0 for p in PHASES}, 0, 0
    module_s = 0.0
    for i, prompt in enumerate(prompts):
        session = decoder.session(prompt, max_new_tokens, stream_index=i, profile=True)
        timer.seconds = 0.0
        while not session.done:
            drive_round(policy, session)
        if i == 0:                              # the first prompt warms up
            continue
        module_s += timer.seconds
        for row in session.phase_log:
            for p in PHASES:
                phases[p] += row[p]
        rounds += len(session.trace)
        tokens += session.trace.total_tokens
    timer.close()
    mean = {p: v / max(rounds, 1) for p, v in phases.items()}
    round_s = sum(v for p, v in mean.items() if p != "record")
    module_mean = module_s / max(rounds, 1)
    return {"phases_s": mean, "round_s": round_s, "draft_module_forward_s": module_mean,
            "overhead_fraction": 1 - (mean["draft"] + mean["target_forward"]) / round_s,
            "overhead_fraction_strict": 1 - (min(module_mean, mean["draft"]) + mean["target_forward"]) / round_s,
            "mean_accepted_length": tokens / max(rounds, 1), "rounds": rounds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafters", default="ngram,small-lm,eagle,eagle3,medusa,hydra,hybrid")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per row (the first warms up)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "round_profile.json"))
    ap.add_argument("--json", action="store_true", help="print the JSON")
    args = ap.parse_args(argv)
    if args.prompts < 2 or args.max_new_tokens < 2:
        ap.error("--prompts and --max-new-tokens must be >= 2")
    load_before = os.getloadavg()
    rows = []
    for dtype in args.dtypes.split(","):
        target = load_model("smollm2-135m", dtype=dtype)
        prompts = [target.tokenizer.apply_chat_template([{"role": "user", "content": p.text}],
                                                        add_generation_prompt=True, tokenize=True, return_dict=False)
                   for p in load_prompts("humaneval", "heldout", limit=args.prompts)]
        for name in args.drafters.split(","):
            try:
                drafter = make_drafter(name, target, train_if_missing=False, progress=False, dtype=dtype)
            except (FileNotFoundError, ValueError) as exc:
                print(f"skip {name}: {exc}", file=sys.stderr)
                continue
            for plan in ("chain", "tree"):
                policy = FixedDraftPolicy(4) if plan == "chain" else \
                    FixedDraftPolicy(4, parse_tree_shape(TREES.get(name, DEFAULT_TREE)))
                row = profile_row(target, drafter, policy, prompts, args.max_new_tokens)
                row.update(drafter=name, plan=plan, dtype=dtype)
                rows.append(row)
                print(f"{dtype:9s} {name:10s} {plan:5s} round {1e3 * row['round_s']:6.1f} ms  "
                      f"overhead {row['overhead_fraction']:.3f} (strict {row['overhead_fraction_strict']:.3f})  "
                      f"tau {row['mean_accepted_length']:.2f}", file=sys.stderr)
    out = {"rows": rows, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "torch_threads": torch.get_num_threads(),
           "overhead_fraction_max": max((r["overhead_fraction"] for r in rows), default=float("nan"))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
