"""Decoding speed of the real-model speculative decoder against HF baselines.

Same run, same prompts (held-out HumanEval and MT-bench from `specloop.data.prompts`,
chat template applied), greedy decoding of SmolLM2-135M-Instruct (or ``--target``):

* ``hf-greedy``            plain greedy, ``model.generate`` (the baseline)
* ``hf-prompt-lookup-N``   HF prompt lookup decoding (``prompt_lookup_num_tokens=N``)
* ``hf-assisted``          HF assisted generation with a separate assistant model
                           (``--assistant``; skipped when it is the target itself
                           unless ``--self-assisted``)
* ``specloop-greedy``      our decoder with k = 0 (plain decoding through our code path)
* ``specloop-ngram-chain`` / ``specloop-ngram-tree``  n-gram drafts, chain and a trie
                           of several continuations verified in one forward
* ``specloop-ngram-learned``  n-gram chain whose length is chosen per round by
                           `strategies.lookup_length.LookupLength`: acceptance per
                           position learned from the verifier (keyed by the matched
                           n-gram size) against the verify-cost table measured at the
                           start of the same dtype's run; it keeps learning across the
                           whole run (warm-up pass included), as a server would
* ``specloop-datastore-chain`` / ``specloop-datastore-tree-vN``  REST-style retrieval
                           (`drafters.datastore`): continuations of the longest
                           matching suffix in an n-gram index of the target's warm-up
                           corpus, merged with the context's own by count into one
                           trie of at most N nodes (``--datastore-nodes``; nodes
                           scoring below ``--datastore-min-score`` are not verified)
* ``specloop-<draft>-chain`` small-LM drafts when ``--draft-model`` is given
* ``specloop-<head>-chain-k<K>`` / ``specloop-<head>-tree`` trained drafts (``--heads``,
                           default eagle3,hydra,eagle,medusa,small-lm; ``LABEL=KIND@FOLDER``
                           names a trained draft folder, rows ``specloop-LABEL-...``): one chain row
                           per k in ``--head-k`` (mean accepted length per k) and an
                           EAGLE-2 tree (``--head-tree``), each
                           with ``draft_step_s`` (seconds per draft step, from the
                           decoder's draft_time / tree depth) and
                           ``draft_step_vs_target_step`` (against one HF greedy step
                           of the same run); ``specloop-hybrid-tree`` = prompt
                           lookup, else the EAGLE-3 head

``--compile PATTERNS`` adds ``NAME-compiled`` twins of the matching specloop rows, whose
target verification forward runs through ``torch.compile`` (inductor; compiled untimed
before their first prompt, ``compile_s``; the prefill stays eager).

for each dtype (float32, bfloat16): tokens/s (new tokens / seconds, prefill
included, as HF's generate includes it), mean accepted length (tau, bonus included),
speedup vs plain greedy in the same precision (``speedup``) and vs the faster of
the two plain baselines in any precision (``speedup_vs_best_plain``), and the ratio
to the best HF prompt-lookup setting (``vs_hf_prompt_lookup``). A warm-up pass is
dropped; each method runs ``--repeats`` times over all prompts (all methods back to
back on each prompt, their order alternating per prompt) and the median per-repeat
tokens/s is reported, with the tokens/s of every (repeat, prompt) for paired
per-prompt comparisons. Also writes the
verification-time-vs-number-of-tokens table (the schema of
``specloop/sim/data/smollm2_135m_cpu_verify_cost.json``) measured through the
decoder's own verification forward (tree mask, explicit positions).

    OMP_NUM_THREADS=2 python benchmarks/decode.py --json [--quick]

Run it on a quiet machine: every number is a ratio measured in the same run.
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

RESULTS = Path(__file__).resolve().parent / "results"
# --quick without --only: HF greedy and prompt lookup, our plain decoding, the n-gram
# tree (the target row: >= 1.3x HF prompt lookup) and the learned-length chain (the best n-gram row of the
# full runs), the best trained-head chain and tree (Hydra in benchmarks/results/
# decode_heads.json) and the hybrid (prompt lookup, else EAGLE-3).
QUICK_METHODS = ("hf-prompt-lookup-*", "specloop-greedy", "specloop-ngram-tree", "specloop-ngram-learned",
                 "specloop-hydra-chain-k*", "specloop-hydra-tree", "specloop-hybrid-tree")
QUICK_HEADS = ("hydra", "eagle3")     # eagle3: the hybrid's head


def _prompts(tokenizer, datasets: list[str], limit: int) -> list[tuple[str, str, list[int]]]:
    from specloop.cli.generate_cmd import encode_prompt
    from specloop.data.prompts import load_prompts
    out = []
    for dataset in datasets:
        for prompt in load_prompts(dataset, split="heldout", limit=limit):
            out.append((dataset, prompt.id, encode_prompt(tokenizer, prompt.text)))
    return out


def _hf_runner(model, eos, setup=None, **gen_kwargs):
    """``run(ids, max_new) -> (new_ids, seconds, tau)`` over HF ``generate`` (greedy;
    tau is NaN: HF does not report it). ``setup()`` runs before each call, untimed
    (e.g. to set an assistant's generation config)."""
    import torch

    def run(ids: list[int], max_new: int) -> tuple[list[int], float, float]:
        if setup is not None:
            setup()
        inputs = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new,
                                 do_sample=False, temperature=None, top_p=None, top_k=None,
                                 eos_token_id=eos, pad_token_id=eos[0], **gen_kwargs)
        seconds = time.perf_counter() - t0
        return out[0, len(ids):].tolist(), seconds, float("nan")
    return run


def _spec_runner(verify_widths, target, drafter, policy, compile_target: bool = False):
    """``run(ids, max_new) -> (new_ids, seconds, tau)`` over `SpeculativeDecoder`
    (with verification-width padding ``verify_widths``: None or a {size: width}
    map); ``run.draft_seconds`` / ``run.draft_steps`` accumulate over calls.
    ``compile_target``: the compiled verification forward, compiled by the decoder's
    ``warm_up`` on the first call, untimed (``run.compile_s``); ``run.compiled_twin()``
    makes that runner from an uncompiled one, with a copy of its drafter."""
    import copy
    from specloop.realmodels.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(target, drafter, policy=policy, verify_widths=verify_widths,
                                 compile_target=compile_target)

    def run(ids: list[int], max_new: int) -> tuple[list[int], float, float]:
        if compile_target and run.compile_s is None:
            run.compile_s = decoder.warm_up(ids)
        t0 = time.perf_counter()
        result = decoder.generate(ids, max_new)
        seconds = time.perf_counter() - t0
        tau = result.trace.mean_accepted_length() if len(result.trace) else float("nan")
        run.draft_seconds += sum(r.draft_time for r in result.trace)
        run.draft_steps += sum(r.tree_depth for r in result.trace)
        return list(result.new_tokens), seconds, tau
    run.draft_seconds, run.draft_steps, run.compile_s = 0.0, 0, None
    run.compiled_twin = lambda: _spec_runner(verify_widths, target, copy.deepcopy(drafter), copy.deepcopy(policy),
                                             compile_target=True)
    return run


def head_spec(spec: str) -> tuple[str, str, str | None]:
    """A ``--heads`` entry: ``KIND`` (the draft cache, else the shipped copy) or
    ``LABEL=KIND@FOLDER`` (a ``specloop draft train --out FOLDER`` draft) -> (row label,
    kind, folder or None).

    Raises:
        ValueError: ``LABEL=`` without ``@FOLDER`` or an empty part."""
    if "=" not in spec:
        return spec, spec, None
    label, _, rest = spec.partition("=")
    kind, at, folder = rest.partition("@")
    if not (label and kind and at and folder):
        raise ValueError(f"--heads entry {spec!r}: use KIND or LABEL=KIND@FOLDER")
    return label, kind, folder


def _head_methods(target, args) -> dict:
    """Chain and EAGLE-2 tree rows for each trained draft in ``--heads`` (skipped,
    with a note on stderr, when a draft is neither saved nor shipped); a hybrid tree
    (prompt lookup, else the head) for each EAGLE-3 entry."""
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
    methods = {}
    tree = parse_tree_shape(args.head_tree)
    for label, kind, folder in map(head_spec, args.heads):
        options = dict(checkpoint=folder, train_if_missing=False, progress=False, dtype=args.current_dtype)
        try:
            drafter = make_drafter(kind, target, **options)
        except FileNotFoundError as exc:
            print(f"skipping {label}: {exc}", file=sys.stderr)
            continue
        for k in args.head_k:
            methods[f"specloop-{label}-chain-k{k}"] = _spec_runner(args.current_widths, target, drafter, FixedDraftPolicy(k))
        methods[f"specloop-{label}-tree"] = _spec_runner(args.current_widths, target, drafter, FixedDraftPolicy(tree.max_depth, tree))
        if kind == "eagle3":
            hybrid = make_drafter("hybrid", target, head="eagle3", **options)
            name = "specloop-hybrid-tree" if label == kind else f"specloop-hybrid-{label}-tree"
            methods[name] = _spec_runner(args.current_widths, target, hybrid, FixedDraftPolicy(tree.max_depth, tree))
    return methods


def _ngram_tree(args, nodes: int):
    """The lookup drafters' tree: ``--tree-width`` continuations of ``--tree-depth``
    tokens merged into a trie of at most ``nodes`` nodes."""
    from specloop.realmodels.policy import parse_tree_shape
    return parse_tree_shape(f"{args.tree_width}x" + "x".join(["1"] * (args.tree_depth - 1)) + f",v={nodes}")


def _methods(target, args) -> dict:
    from specloop.realmodels.decoder import eos_ids_of
    from specloop.realmodels.drafters.datastore import DatastoreDrafter
    from specloop.realmodels.registry.datastore import load_or_build_index
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.drafters.small_lm import make_small_lm_drafter
    from specloop.realmodels.policy import FixedDraftPolicy

    eos = sorted(eos_ids_of(target.model, target.tokenizer))
    methods = {"hf-greedy": _hf_runner(target.model, eos)}
    for n in args.lookup_tokens:
        methods[f"hf-prompt-lookup-{n}"] = _hf_runner(target.model, eos, prompt_lookup_num_tokens=n)
    methods["specloop-greedy"] = _spec_runner(args.current_widths, target, NGramDrafter(), FixedDraftPolicy(0))
    methods["specloop-ngram-chain"] = _spec_runner(args.current_widths, target, NGramDrafter(), FixedDraftPolicy(args.k))
    methods["specloop-ngram-tree"] = _spec_runner(args.current_widths, target, NGramDrafter(max_matches=args.tree_width),
                                                  FixedDraftPolicy(args.tree_depth, _ngram_tree(args, args.tree_nodes)))
    from specloop.strategies.lookup_length import LookupLength
    learned = NGramDrafter(length_model=LookupLength(args.current_cost["seconds"], max_length=args.learned_max_length))
    methods["specloop-ngram-learned"] = _spec_runner(args.current_widths, target, learned,
                                                     FixedDraftPolicy(args.learned_max_length))
    if args.datastore:
        index = load_or_build_index(target, args.target)
        chain = DatastoreDrafter(index, min_score=args.datastore_min_score)
        tree = DatastoreDrafter(index, min_score=args.datastore_min_score)
        methods["specloop-datastore-chain"] = _spec_runner(args.current_widths, target, chain, FixedDraftPolicy(args.k))
        for nodes in args.datastore_nodes:
            methods[f"specloop-datastore-tree-v{nodes}"] = _spec_runner(args.current_widths, target, tree, FixedDraftPolicy(
                args.tree_depth, _ngram_tree(args, nodes)))
    if args.draft_model:
        drafter = make_small_lm_drafter(target, args.draft_model, dtype=args.current_dtype)
        methods[f"specloop-{args.draft_model}-chain"] = _spec_runner(args.current_widths, target, drafter, FixedDraftPolicy(args.k))
        assistant = drafter.lm.model
        methods["hf-assisted"] = _hf_runner(target.model, eos, assistant_model=assistant)
    methods.update(_head_methods(target, args))
    return select_methods(methods, args.only, strict=not args.quick_selection)


def select_methods(methods: dict, only: list[str], strict: bool = True, option: str = "--only") -> dict:
    """The ``methods`` whose names match a pattern of ``only`` (shell patterns; all of
    them when ``only`` is empty), plus ``hf-greedy`` (every speedup's baseline).

    Raises:
        ValueError: ``strict`` and a pattern that matches no method (named as the
            command-line ``option`` it came from; ``--quick``'s own
            list is not strict: a trained head that is not shipped is skipped).
    """
    if not only:
        return methods
    from fnmatch import fnmatchcase
    missing = [pat for pat in only if not any(fnmatchcase(name, pat) for name in methods)]
    if missing and strict:
        raise ValueError(f"{option} names unknown methods {missing}; known: {sorted(methods)}")
    return {name: run for name, run in methods.items()
            if name == "hf-greedy" or any(fnmatchcase(name, pat) for pat in only)}


def _bench_dtype(dtype: str, prompts, args) -> dict:
    from specloop.realmodels.loading import load_model
    target = load_model(args.target, dtype=dtype)
    args.current_dtype = dtype
    args.current_widths = None
    if args.verify_widths == "auto":
        from specloop.realmodels.padding import calibrate_verify_widths
        args.current_widths = calibrate_verify_widths(target.model)
        print(f"[{dtype}] verify widths {args.current_widths}", file=sys.stderr)
    args.widths_used[dtype] = {str(n): w for n, w in (args.current_widths or {}).items()}
    args.current_cost = _verify_cost(target, args)      # also read by specloop-ngram-learned
    methods = _methods(target, args)
    if args.compile:                    # compiled twins of the selected specloop rows
        ours = {n: r for n, r in methods.items() if n.startswith("specloop-")}
        twins = select_methods(ours, args.compile, option="--compile")
        methods.update({f"{name}-compiled": run.compiled_twin() for name, run in twins.items()})
    for name, run in methods.items():  # warm-up, dropped
        run(prompts[0][2], min(8, args.max_new_tokens))
    per_repeat = {name: [] for name in methods}
    per_prompt = {name: [] for name in methods}     # [repeat][prompt] tokens/s: paired comparisons
    tau = {name: [] for name in methods}
    tokens = {name: 0 for name in methods}
    for repeat in range(args.repeats):
        sums = {name: [0, 0.0, [], []] for name in methods}      # tokens, seconds, taus, tokens/s per prompt
        for i, (_, _, ids) in enumerate(prompts):
            # every method on this prompt back to back, order alternating per prompt: load drift on a
            # shared machine hits the methods of a pair alike (the paired per-prompt comparisons)
            for name in (list(methods) if (repeat + i) % 2 == 0 else list(reversed(methods))):
                new_ids, seconds, t = methods[name](ids, args.max_new_tokens)
                acc = sums[name]
                acc[0] += len(new_ids)
                acc[1] += seconds
                acc[2].append(t)
                acc[3].append(len(new_ids) / seconds)
        for name, (total_tokens, total_seconds, taus, rates) in sums.items():
            per_repeat[name].append(total_tokens / total_seconds)
            per_prompt[name].append(rates)
            tau[name].append(statistics.fmean(taus))
            tokens[name] = total_tokens
            print(f"[{dtype}] repeat {repeat} {name}: {total_tokens / total_seconds:.2f} tok/s", file=sys.stderr)
    out = {}
    target_step = 1.0 / statistics.median(per_repeat["hf-greedy"])
    for name in methods:
        out[name] = {"tokens_per_s": statistics.median(per_repeat[name]),
                     "tokens_per_s_all": per_repeat[name],
                     "tokens_per_s_per_prompt": per_prompt[name],
                     "mean_accepted_length": statistics.median(tau[name]),
                     "new_tokens": tokens[name]}
        if getattr(methods[name], "compile_s", None) is not None:
            out[name]["compile_s"] = methods[name].compile_s
        steps = getattr(methods[name], "draft_steps", 0)
        if steps and name.startswith("specloop-") and not name.startswith("specloop-greedy"):
            step_s = methods[name].draft_seconds / steps
            out[name].update(draft_step_s=step_s, draft_step_vs_target_step=step_s / target_step)
    out["verify_cost"] = args.current_cost
    return out


def _verify_cost(target, args) -> dict:
    """Median seconds of the decoder's verification forward over n tokens (chain
    mask) on a ``--cache-len`` cache, n = 1..``--max-verify``."""
    import torch
    from specloop.realmodels.kvcache import causal_forward, crop, model_forward, new_cache
    from specloop.realmodels.tree import verify_block_inputs
    model = target.model
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (args.cache_len,), generator=gen)
    block = torch.randint(0, target.vocab_size, (args.max_verify,), generator=gen)
    cache = new_cache()
    causal_forward(model, cache, prompt)
    ns = list(range(1, args.max_verify + 1))
    samples = {n: [] for n in ns}
    for repeat in range(args.verify_repeats + 1):
        for n in (ns if repeat % 2 == 0 else ns[::-1]):
            mask, pos = verify_block_inputs(torch.arange(-1, n - 2), args.cache_len, dtype, "cpu")
            t0 = time.perf_counter()
            model_forward(model, cache, block[:n], mask, pos)
            seconds = time.perf_counter() - t0
            crop(cache, args.cache_len)
            if repeat > 0:  # repeat 0 is warm-up
                samples[n].append(seconds)
    return {"num_tokens": ns, "seconds": [statistics.median(samples[n]) for n in ns],
            "seconds_min": [min(samples[n]) for n in ns], "seconds_max": [max(samples[n]) for n in ns]}


def _paired_ratio(row: dict, reference: dict) -> dict | None:
    """Geometric mean over (repeat, prompt) pairs of ``row``'s tokens/s over
    ``reference``'s on the same prompt and repeat, with its 95 % Student-t interval
    on the mean log ratio (`specloop.report.verdicts.ratio_estimate`); None when the
    per-prompt rates are missing or of different shapes."""
    from specloop.report.verdicts import ratio_estimate
    mine, theirs = row.get("tokens_per_s_per_prompt"), reference.get("tokens_per_s_per_prompt")
    if not mine or not theirs or [len(r) for r in mine] != [len(r) for r in theirs]:
        return None
    pairs = [a / b for ra, rb in zip(mine, theirs) for a, b in zip(ra, rb)]
    est = ratio_estimate(pairs, "per-prompt tokens/s ratio, paired by prompt and repeat")
    return {"ratio": est.effect, "ci": list(est.interval), "pairs": est.n}


def _ratios(results: dict) -> None:
    """Adds to every row ``speedup`` (tokens/s over HF greedy's, same dtype),
    ``speedup_vs_best_plain``, ``vs_hf_prompt_lookup`` (over the best HF prompt-lookup
    row) and, from the per-prompt rates, ``speedup_paired`` / ``vs_hf_prompt_lookup_paired``
    (`_paired_ratio`: geometric mean of per-prompt ratios with a 95 % interval)."""
    best_plain = max(results[d]["hf-greedy"]["tokens_per_s"] for d in results)
    for dtype, table in results.items():
        base = table["hf-greedy"]["tokens_per_s"]
        lookups = {k: v for k, v in table.items() if k.startswith("hf-prompt-lookup")}
        best_name = max(lookups, key=lambda k: lookups[k]["tokens_per_s"]) if lookups else None
        best_lookup = lookups[best_name]["tokens_per_s"] if best_name else float("nan")
        for name, row in table.items():
            if name == "verify_cost":
                continue
            row["speedup"] = row["tokens_per_s"] / base
            row["speedup_vs_best_plain"] = row["tokens_per_s"] / best_plain
            row["vs_hf_prompt_lookup"] = row["tokens_per_s"] / best_lookup
            row["speedup_paired"] = _paired_ratio(row, table["hf-greedy"])
            row["vs_hf_prompt_lookup_paired"] = None if best_name is None else _paired_ratio(row, lookups[best_name])


def apply_quick(args: argparse.Namespace) -> argparse.Namespace:
    """``--quick``: 2 prompts per dataset, 1 repeat, 48 tokens, and, unless ``--only``
    is given, only `QUICK_METHODS` (no datastore index, only the `QUICK_HEADS`
    loaded); every other method is timed in the full run."""
    args.quick_selection = False
    if args.quick:
        args.prompts, args.repeats, args.max_new_tokens, args.verify_repeats = 2, 1, 48, 2
        args.quick_selection = not args.only
        if args.quick_selection:
            args.only = ",".join(QUICK_METHODS)
            args.datastore = False
            args.heads = ",".join(h for h in str(args.heads).split(",") if h in QUICK_HEADS)
    return args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    parser.add_argument("--quick", action="store_true",
                        help="2 prompts per dataset, 1 repeat, 48 tokens; without --only: only the compared "
                             "rows (QUICK_METHODS), no datastore rows")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft-model", default=None, help="small-LM draft (and HF assistant) model name")
    parser.add_argument("--datasets", default="humaneval,mt-bench")
    parser.add_argument("--prompts", type=int, default=5, help="held-out prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--k", type=int, default=6, help="chain length for specloop chains")
    parser.add_argument("--tree-width", type=int, default=4, help="n-gram continuations in the tree")
    parser.add_argument("--tree-depth", type=int, default=8)
    parser.add_argument("--tree-nodes", type=int, default=24, help="verify size cap of the n-gram tree")
    parser.add_argument("--learned-max-length", type=int, default=10,
                        help="longest chain specloop-ngram-learned may verify (tokens)")
    parser.add_argument("--datastore", action=argparse.BooleanOptionalAction, default=True,
                        help="run the n-gram datastore drafter rows (index cached under ~/.cache/specloop)")
    parser.add_argument("--datastore-nodes", default="8,16",
                        help="node budgets (verification sizes) of the datastore trees, one row each")
    parser.add_argument("--datastore-min-score", type=float, default=0.0,
                        help="datastore nodes scoring below this are not verified")
    parser.add_argument("--lookup-tokens", default="3,10", help="HF prompt_lookup_num_tokens settings")
    parser.add_argument("--heads", default="eagle3,hydra,eagle,medusa,small-lm",
                        help="trained drafts to add as rows: KIND or LABEL=KIND@FOLDER (a trained draft folder), "
                             "comma list (empty = none)")
    parser.add_argument("--head-k", default="4",
                        help="chain lengths of the trained-draft chain rows, one row per k (comma list)")
    parser.add_argument("--head-tree", default="topk=4,depth=5,v=16", help="EAGLE-2 tree of the trained-draft rows")
    parser.add_argument("--only", default="", help="comma list of method names or shell patterns (specloop-*-tree) to run; "
                             "hf-greedy always runs")
    parser.add_argument("--compile", default="",
                        help="comma list of specloop method names or shell patterns to run a second time with "
                             "the target's verification forward compiled (rows NAME-compiled; compiled untimed "
                             "before the first prompt, seconds in compile_s)")
    parser.add_argument("--verify-widths", choices=["none", "auto"], default="none",
                        help="auto: pad specloop verify blocks to the width this device runs "
                             "fastest (specloop.realmodels.padding, calibrated once per dtype)")
    parser.add_argument("--cache-len", type=int, default=200)
    parser.add_argument("--max-verify", type=int, default=32)
    parser.add_argument("--verify-repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "decode.json")
    parser.add_argument("--verify-out", type=Path, default=RESULTS / "decode_verify_cost.json")
    args = apply_quick(parser.parse_args(argv))
    args.lookup_tokens = [int(x) for x in str(args.lookup_tokens).split(",") if x]
    args.datastore_nodes = [int(x) for x in str(args.datastore_nodes).split(",") if x]
    args.heads = [x for x in str(args.heads).split(",") if x]
    try:
        [head_spec(h) for h in args.heads]
    except ValueError as exc:
        parser.error(str(exc))
    args.head_k = [int(x) for x in str(args.head_k).split(",") if x]
    args.only = [x for x in str(args.only).split(",") if x]
    args.compile = [x for x in str(args.compile).split(",") if x]
    import torch
    import transformers
    from specloop.realmodels.loading import load_model

    tokenizer = load_model(args.target).tokenizer
    prompts = _prompts(tokenizer, args.datasets.split(","), args.prompts)
    load_before = os.getloadavg()
    args.widths_used = {}
    results = {dtype: _bench_dtype(dtype, prompts, args) for dtype in args.dtypes.split(",")}
    verify = {dtype: results[dtype].pop("verify_cost") for dtype in results}
    _ratios(results)
    meta = {"target": args.target, "draft_model": args.draft_model, "datasets": args.datasets,
            "prompts": [f"{d}/{i}" for d, i, _ in prompts], "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "k": args.k, "tree": [args.tree_width, args.tree_depth, args.tree_nodes],
            "datastore": {"enabled": args.datastore, "nodes": args.datastore_nodes,
                          "min_score": args.datastore_min_score},
            "heads": args.heads, "head_k": args.head_k, "head_tree": args.head_tree, "only": args.only,
            "verify_widths": args.verify_widths, "verify_widths_used": args.widths_used,
            "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out = {"meta": meta, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    verify_meta = dict(meta, model=args.target, device="cpu", cache_len=args.cache_len,
                       source="benchmarks/decode.py (decoder verification forward, 4D float mask)")
    args.verify_out.write_text(json.dumps({"meta": verify_meta, "tables": verify}, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
    for dtype, table in results.items():
        for name, row in table.items():
            print(f"{dtype:9s} {name:28s} {row['tokens_per_s']:7.2f} tok/s  tau {row['mean_accepted_length']:.2f}  "
                  f"speedup {row['speedup']:.2f}  vs-lookup {row['vs_hf_prompt_lookup']:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
