"""Cost of the ``suffix`` drafter's own work: microseconds per committed
token to update, per proposal to draft, per token to move an output into the global
structure, against one target forward of SmolLM2-135M on this CPU.

The stream is synthetic (no model): requests whose prompts and outputs reuse spans of
a pool of 20 shared "templates" (as agentic and repeated workloads do), the rest
Zipf-distributed tokens of a 49,152-token vocabulary (SmolLM2's). A round is
verified against the request's true output exactly as greedy verification would
(the accepted path is the longest drafted path that the output continues), so the
drafter sees the same proposals, feedback and updates as in the decoder, without
the target's forward. Times are wall-clock ``time.perf_counter`` per call.

Usage: python benchmarks/suffix_cost.py [--requests 200] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.drafters.suffix import SuffixDrafter, shipped_verify_cost
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan, TreePlan

VOCAB = 49152


def synthetic_stream(requests: int, prompt_len: int, output_len: int, seed: int = 0):
    """(prompt, output) token lists; 70 % of each made of spans of 20 shared templates
    of 300 tokens (each template token recurs about once per 10 requests)."""
    rng = np.random.default_rng(seed)
    templates = [rng.zipf(1.3, size=300) % VOCAB for _ in range(20)]

    def text(length: int) -> list[int]:
        out: list[int] = []
        while len(out) < length:
            if rng.random() < 0.7:
                tpl = templates[int(rng.integers(20))]
                start = int(rng.integers(0, 250))
                out.extend(tpl[start: start + int(rng.integers(10, 60))].tolist())
            else:
                out.extend((rng.zipf(1.3, size=int(rng.integers(3, 20))) % VOCAB).tolist())
        return out[:length]
    return [(text(prompt_len), text(output_len)) for _ in range(requests)]


def greedy_accept(proposal, truth: list[int]) -> tuple[int, ...]:
    """Accepted nodes of ``proposal`` if the target's greedy output is ``truth``."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(proposal.tokens.tolist(), proposal.parents.tolist())):
        children.setdefault(par, {}).setdefault(tok, i)
    path, parent = [], -1
    for tok in truth:
        node = children.get(parent, {}).get(tok)
        if node is None:
            break
        path.append(node)
        parent = node
    return tuple(path)


def run(plan: DraftPlan, stream, dtype: str) -> dict:
    drafter = SuffixDrafter(dtype=dtype)
    propose_us, observe_us, end_us, reset_us = [], [], [], []
    committed_total, rounds, drafted = 0, 0, 0
    generator = torch.Generator()
    for prompt, output in stream:
        t0 = time.perf_counter()
        drafter.reset(torch.tensor(prompt))
        reset_us.append((time.perf_counter() - t0) * 1e6 / len(prompt))
        ids = list(prompt)
        pos = 0
        while pos < len(output):
            request = DraftRequest(torch.tensor(ids), plan, len(output) - pos, SamplingConfig(0.0), generator)
            t0 = time.perf_counter()
            proposal = drafter.propose(request)
            propose_us.append((time.perf_counter() - t0) * 1e6)
            accepted = greedy_accept(proposal, output[pos:])
            n = min(len(accepted) + 1, len(output) - pos)
            committed = output[pos: pos + n]
            finished = pos + n >= len(output)
            feedback = SimpleNamespace(proposal=proposal, accepted_nodes=accepted, finished=False,
                                       committed_tokens=torch.tensor(committed))
            t0 = time.perf_counter()
            drafter.observe(feedback)
            observe_us.append((time.perf_counter() - t0) * 1e6 / n)
            ids.extend(committed)
            pos += n
            committed_total += n
            rounds += 1
            drafted += proposal.size
            if finished:
                t0 = time.perf_counter()
                drafter.end_request()
                end_us.append((time.perf_counter() - t0) * 1e6 / (len(output) + drafter.prompt_tail))
    forward_s = float(shipped_verify_cost(dtype)[0])
    prop_mean = statistics.fmean(propose_us)
    return {
        "observe_us_per_committed_token_median": statistics.median(observe_us),
        "observe_us_per_committed_token_mean": statistics.fmean(observe_us),
        "global_insert_us_per_token_mean": statistics.fmean(end_us),
        "reset_us_per_prompt_token_mean": statistics.fmean(reset_us),
        "propose_us_median": statistics.median(propose_us),
        "propose_us_mean": prop_mean,
        "propose_us_p99": float(np.percentile(propose_us, 99)),
        "target_forward_s": forward_s,
        "propose_percent_of_target_forward": 100.0 * prop_mean * 1e-6 / forward_s,
        "mean_accepted_length": committed_total / rounds,
        "drafted_tokens_per_round": drafted / rounds,
        "rounds": rounds,
        "global_nodes": drafter.cache.trie.num_nodes,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.prompt_len < 1 or args.output_len < 1:
        print("suffix_cost: --requests, --prompt-len and --output-len must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    stream = synthetic_stream(args.requests, args.prompt_len, args.output_len)
    plans = {"chain_k8": DraftPlan(8), "tree_topk4_depth8_v32": DraftPlan(8, TreePlan(top_k=4, max_depth=8,
                                                                                      verify_size=32))}
    results = {name: run(plan, stream, args.dtype) for name, plan in plans.items()}
    out = {"meta": {"requests": args.requests, "prompt_len": args.prompt_len, "output_len": args.output_len,
                    "dtype_cost_table": args.dtype, "stream": "synthetic, 70% spans of 20 shared templates of 300 tokens",
                    "machine": platform.machine(), "python": platform.python_version(),
                    "clock": "wall-clock perf_counter per call, microseconds",
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
           "results": results}
    text = json.dumps(out, indent=1)
    if args.json is not None:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
