"""Does ``torch.compile`` (inductor, CPU) speed up the target's verification forward?
(the question asked: "try torch.compile on the target's verify forward and on the heads,
keep it only where it measurably helps; state compile time and whether it recompiles per
width").

The forward timed is exactly the decoder's (`specloop.realmodels.kvcache.model_forward`
with the tree mask and position ids of `specloop.realmodels.tree.verify_block_inputs`,
on a transformers ``DynamicCache``): a chain block of ``w`` tokens (the pending token and
``w - 1`` drafted ones; ``w = 1`` is the plain path, no mask) on top of a ``--cache-len``
token cache, cropped back after every forward. For each dtype, the eager forward and the
same model's ``forward`` compiled by ``torch.compile(backend="inductor", dynamic=...)``
are timed in interleaved repeats (eager, compiled, eager, ... per width, widths in
alternating order), median per width; the ratio ``compiled_over_eager`` < 1 means the
compiled forward is faster.

Compile cost and recompilation: the first compiled call at each width is timed on its own
(``first_call_s``), and dynamo's graph count is read before and after, so a width that
compiles a new graph shows ``new_graphs`` > 0. The decoder's cache grows every round, so
the compiled forward is also called at ``--cache-len + 1 .. + 3`` (``cache_growth``):
a graph per cache length would make compile useless for decoding.

Exactness: every width's compiled logits against the eager ones (max absolute difference,
and whether each position's argmax, i.e. the greedy token, is the same).

Heads (``--heads eagle3``): the shipped head's tree draft step (`EagleHead.step_nodes`, the
call `EagleDrafter._tree` makes once per depth) in the target's dtype, eager against
compiled, for a frontier of ``--head-frontier`` nodes over a ``--cache-len`` cache at the
node counts of depths 1..``--head-depths`` (each depth adds ``frontier`` earlier nodes), the
same interleaved medians, first-call seconds, new graphs and logit differences.

JSON: ``meta`` (torch, threads, load average before / after each dtype), and per dtype
``target`` rows per width (``sizes``) with ``eager_ms``, ``compiled_ms``, ``compiled_over_eager``,
``first_call_s``, ``new_graphs``, ``max_abs_logit_diff``, ``argmax_equal``; plus
``cache_growth`` and ``compile_s_total``; per head the same row keys per ``earlier_nodes``.

    OMP_NUM_THREADS=2 python benchmarks/compile_verify.py --json [--dtypes float32,bfloat16]
        [--widths 1,2,4,8,16] [--cache-len 200] [--repeats 20] [--dynamic true|false|auto]
        [--heads eagle3] [--head-frontier 4] [--head-depths 4]
        [--out benchmarks/results/compile_verify.json]
Measure on a quiet machine, one job at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specloop.realmodels.kvcache import crop, model_forward, new_cache  # noqa: E402
from specloop.realmodels.loading import load_model  # noqa: E402
from specloop.realmodels.tree import verify_block_inputs  # noqa: E402


def _graphs() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"].get("unique_graphs", 0))


class VerifyBench:
    """The decoder's verify forward over a fixed ``cache_len``-token cache, eager or compiled."""

    def __init__(self, model, cache_len: int, max_width: int, seed: int = 0):
        self.model, self.cache_len = model, int(cache_len)
        gen = torch.Generator().manual_seed(seed)
        vocab = int(model.config.vocab_size)
        self.prompt = torch.randint(0, vocab, (self.cache_len + 8,), generator=gen)
        self.block = torch.randint(0, vocab, (max_width,), generator=gen)
        self.dtype = next(model.parameters()).dtype
        self.eager = model.forward                       # the bound method, before any swap
        self.compiled = None
        self.cache = new_cache()
        model_forward(model, self.cache, self.prompt[: self.cache_len], None,
                      torch.arange(self.cache_len)[None])

    def compile(self, dynamic) -> None:
        self.compiled = torch.compile(self.eager, backend="inductor", dynamic=dynamic)

    def _grow(self, extra: int) -> None:
        """Cache of ``cache_len + extra`` tokens (crop, then feed the prompt's next tokens)."""
        crop(self.cache, self.cache_len)
        if extra:
            self.model.forward = self.eager
            model_forward(self.model, self.cache, self.prompt[self.cache_len: self.cache_len + extra], None,
                          torch.arange(self.cache_len, self.cache_len + extra)[None])

    def forward(self, width: int, compiled: bool, extra: int = 0) -> tuple[float, torch.Tensor]:
        """(seconds, float32 logits (width, V)) of one verify forward over ``width`` tokens."""
        self._grow(extra)
        length = self.cache_len + extra
        parents = torch.arange(-1, width - 2, dtype=torch.long)   # a chain of width - 1 drafted nodes
        mask, positions = verify_block_inputs(parents, length, self.dtype, "cpu")
        self.model.forward = self.compiled if compiled else self.eager
        try:
            t0 = time.perf_counter()
            out = model_forward(self.model, self.cache, self.block[:width], mask, positions)
            seconds = time.perf_counter() - t0
        finally:
            self.model.forward = self.eager
        logits = out.logits[0].float()
        crop(self.cache, self.cache_len)
        return seconds, logits


class HeadBench:
    """`EagleHead.step_nodes` for ``frontier`` nodes over a ``cache_len`` head cache, eager or compiled."""

    def __init__(self, head, cache_len: int, frontier: int, seed: int = 0):
        from specloop.realmodels.heads.eagle import KVCache
        c, p = head.config, next(head.parameters())
        gen = torch.Generator().manual_seed(seed)

        def randn(*shape):
            return torch.randn(*shape, generator=gen).to(p.dtype)
        self.head, self.frontier, self.cache_len = head, int(frontier), int(cache_len)
        self.cache = KVCache(randn(c.num_kv_heads, cache_len, c.head_dim), randn(c.num_kv_heads, cache_len, c.head_dim))
        self.parent_h = randn(frontier, c.hidden_size)
        self.tokens = torch.randint(0, c.target_vocab_size, (frontier,), generator=gen)
        self.node_kv = randn(2, c.num_kv_heads, 64, c.head_dim)
        self.eager, self.compiled = head.step_nodes, None

    def compile(self, dynamic) -> None:
        self.compiled = torch.compile(self.eager, backend="inductor", dynamic=dynamic)

    def forward(self, earlier: int, compiled: bool, extra: int = 0) -> tuple[float, torch.Tensor]:
        """(seconds, float32 draft logits (frontier, V_draft)) of one step over ``earlier`` drafted nodes."""
        from specloop.realmodels.heads.eagle import KVCache
        n = self.frontier
        cache = KVCache(self.cache.k, self.cache.v) if not extra else \
            KVCache(torch.cat([self.cache.k, self.cache.k[:, :extra]], 1), torch.cat([self.cache.v, self.cache.v[:, :extra]], 1))
        positions = torch.full((n,), cache.length + earlier // n, dtype=torch.long)
        mask = (torch.arange(earlier)[None, :] % n) == torch.arange(n)[:, None]     # one ancestor chain per node
        fn = self.compiled if compiled else self.eager
        with torch.inference_mode():
            t0 = time.perf_counter()
            _, logits, _, _ = fn(cache, self.parent_h, self.tokens, positions, self.node_kv[0, :, :earlier],
                                 self.node_kv[1, :, :earlier], mask)
            seconds = time.perf_counter() - t0
        return seconds, logits.float()


def measure_head(kind: str, target, args) -> dict:
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    drafter = load_eagle_drafter(target, kind, train_if_missing=False, dtype=next(target.model.parameters()).dtype)
    bench = HeadBench(drafter.head, args.cache_len, args.head_frontier, seed=args.seed)
    sizes = [args.head_frontier * d for d in range(args.head_depths)]     # earlier nodes at depths 1..D
    return _compare(bench, sizes, args)


def _compare(bench, sizes: list[int], args) -> dict:
    """Eager against compiled at each size of ``bench.forward`` (module docstring's protocol)."""
    load_before = os.getloadavg()
    for _ in range(3):                                   # eager warm-up
        for w in sizes:
            bench.forward(w, False)
    bench.compile(args.dynamic)
    rows, t_compile = {}, 0.0
    for w in sizes:                                      # first call per size: compile (or reuse)
        before = _graphs()
        seconds, logits_c = bench.forward(w, True)
        _, logits_e = bench.forward(w, False)
        t_compile += seconds
        rows[w] = {"first_call_s": seconds, "new_graphs": _graphs() - before,
                   "max_abs_logit_diff": float((logits_c - logits_e).abs().max()),
                   "argmax_equal": bool(torch.equal(logits_c.argmax(-1), logits_e.argmax(-1)))}
    growth = []
    for extra in (1, 2, 3):                              # the decoder's cache grows every round
        before = _graphs()
        seconds, _ = bench.forward(sizes[-1], True, extra=extra)
        growth.append({"cache_len": args.cache_len + extra, "size": sizes[-1],
                       "first_call_s": seconds, "new_graphs": _graphs() - before})
    for w in sizes:                                      # compiled warm-up after compilation
        bench.forward(w, True)
    samples = {w: {"eager": [], "compiled": []} for w in sizes}
    for r in range(args.repeats):
        for w in (sizes if r % 2 == 0 else list(reversed(sizes))):
            for mode in (("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")):
                samples[w][mode].append(bench.forward(w, mode == "compiled")[0])
    for w in sizes:
        eager, compiled = statistics.median(samples[w]["eager"]), statistics.median(samples[w]["compiled"])
        rows[w].update({"eager_ms": 1e3 * eager, "compiled_ms": 1e3 * compiled,
                        "compiled_over_eager": compiled / eager})
    return {"sizes": {str(w): rows[w] for w in sizes}, "cache_growth": growth,
            "compile_s_total": t_compile, "load_avg_before": load_before, "load_avg_after": os.getloadavg()}


def measure_dtype(dtype: str, args) -> dict:
    target = load_model(args.target, dtype=dtype)
    out = {"target": _compare(VerifyBench(target.model, args.cache_len, max(args.widths), seed=args.seed),
                              args.widths, args)}
    for kind in args.heads:
        torch._dynamo.reset()
        out[kind] = measure_head(kind, target, args)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--widths", default="1,2,4,8,16", help="verified tokens per forward (comma list)")
    parser.add_argument("--cache-len", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dynamic", default="true", choices=("true", "false", "auto"),
                        help="torch.compile's dynamic= (auto: None, dynamo decides after a recompile)")
    parser.add_argument("--heads", default="eagle3", help="EAGLE-family heads to time too (comma list, '' = none)")
    parser.add_argument("--head-frontier", type=int, default=4, help="tree nodes per draft step (the tree's top-k)")
    parser.add_argument("--head-depths", type=int, default=4, help="draft steps timed (depths 1..D)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compile_verify.json")
    args = parser.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    try:
        args.widths = sorted({int(w) for w in args.widths.split(",") if w})
    except ValueError:
        parser.error(f"--widths must be integers, got {args.widths!r}")
    args.heads = [h for h in args.heads.split(",") if h]
    if not args.widths or args.widths[0] < 1 or min(args.cache_len, args.repeats, args.head_frontier,
                                                    args.head_depths) < 1:
        parser.error("widths, --cache-len, --repeats, --head-frontier and --head-depths must be >= 1")
    if any(h not in ("eagle", "eagle3") for h in args.heads):
        parser.error(f"--heads: eagle / eagle3, got {args.heads}")
    if any(d not in ("float32", "bfloat16") for d in args.dtypes):
        parser.error(f"--dtypes: float32 / bfloat16, got {args.dtypes}")
    args.dynamic = {"true": True, "false": False, "auto": None}[args.dynamic]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results = {}
    for dtype in args.dtypes:
        torch._dynamo.reset()
        results[dtype] = measure_dtype(dtype, args)
        for part, res in results[dtype].items():
            print(f"[{dtype} {part}] compiled / eager: " + ", ".join(
                f"{w}: {r['compiled_over_eager']:.3f}" for w, r in res["sizes"].items()), file=sys.stderr)
    out = {"meta": {"target": args.target, "cache_len": args.cache_len, "repeats": args.repeats,
                    "dynamic": args.dynamic, "backend": "inductor", "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "machine": platform.machine(), "cpu_count": os.cpu_count(), "started": started,
                    "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")},
           "dtypes": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
