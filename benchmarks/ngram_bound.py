"""How far can n-gram drafting go against HF prompt lookup? An exact bound.

Greedy verification accepts a drafted path exactly as far as it agrees with the
target's own greedy continuation, so once that continuation is known every
n-gram drafter's rounds can be replayed without the model:

* ``hf-prompt-lookup``  transformers' `PromptLookupCandidateGenerator` re-implemented
  (``--lookup-tokens`` tokens after the *earliest* match of the last 2, else 1, tokens;
  cut at the context end): one chain per round;
* ``specloop-ngram-tree``  our `NGramDrafter` trie (``--tree-width`` continuations of
  up to ``--tree-depth`` tokens, at most ``--tree-nodes`` nodes), the benchmark's tree;
* ``specloop-ngram-learned``  our `NGramDrafter` chain with a
  `strategies.lookup_length.LookupLength`: the cost-optimal prefix of the best
  continuation, per-position acceptance learned from the replayed verifier feedback
  against this dtype's measured cost table;
* ``oracle-ngram-tree``  every continuation that follows any earlier occurrence of the
  last token (a trie of all of them: the most any context n-gram drafter can
  propose), of up to ``--oracle-depth`` tokens, verified with perfect pruning: only
  the accepted path plus the bonus position enters the forward.

Per drafter: tau (tokens per round, bonus included) and, with the verification cost
c(n) of n tokens measured in this same run (`decode._verify_cost`, the decoder's own
tree-masked forward), the model-time throughput sum(tokens) / sum(c(verify size)),
reported as a ratio to HF prompt lookup. The oracle's ratio bounds every context
n-gram tree on this machine and these prompts; draft time and Python overhead only
lower it. A check replays our tree through the real decoder on each prompt and
requires the same tau (``replay_matches_decoder``). The prompts' token ids and the
greedy outputs are saved too (``greedy``), so other drafting rules can be replayed
offline.

    OMP_NUM_THREADS=2 python benchmarks/ngram_bound.py --json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import RESULTS, _ngram_tree, _prompts, _verify_cost  # noqa: E402  (same prompts, tree and cost forward)


def hf_prompt_lookup(context: np.ndarray, num_tokens: int = 10, max_ngram: int = 2, eos: tuple[int, ...] = (),
                     max_length: int | None = None) -> list[int]:
    """transformers' prompt-lookup candidates (`PromptLookupCandidateGenerator.
    get_candidates`, no logits processor): for n = max_ngram..1, the first (left-most)
    occurrence of the last n tokens with a non-empty continuation gives up to
    ``num_tokens`` tokens (cut at the context end and at ``max_length``), cut before
    the first EOS; nothing when the context is one token short of ``max_length``."""
    length = len(context)
    if max_length is not None and max_length == length + 1:
        return []
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context, n)
        for idx in np.nonzero((windows == context[length - n:]).all(axis=1))[0]:
            start = int(idx) + n
            end = min(start + num_tokens, length, max_length if max_length is not None else length)
            if start < end:
                cand = context[start:end].tolist()
                cut = next((i for i, t in enumerate(cand) if t in eos), len(cand))
                return cand[:cut]
    return []


def accepted_in_trie(tokens: list[int], parents: list[int], truth: list[int]) -> int:
    """Greedy acceptance in a trie (tokens, parents; parents before children): the
    length of the longest root path that is a prefix of ``truth``."""
    depth, node = 0, -1
    while depth < len(truth):
        nxt = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == truth[depth]), None)
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


def replay(prompt: list[int], output: list[int], propose, observe=None) -> list[tuple[int, int]]:
    """Rounds of a drafter on a known greedy output.

    Args:
        prompt / output: token ids; ``output`` is the target's greedy continuation.
        propose: ``context (int64 array) -> (tokens, parents, verify_size)``.
        observe: optional ``observe(accepted_draft_tokens)`` after each round (the
            verifier's feedback, for drafters that learn).

    Returns:
        per round (tokens emitted, verification size in tokens).
    """
    rounds, pos = [], 0
    ids = np.asarray(list(prompt) + list(output), dtype=np.int64)
    while pos < len(output):
        tokens, parents, verify = propose(ids[: len(prompt) + pos])
        accepted = accepted_in_trie(tokens, parents, list(output[pos:]))
        if observe is not None:
            observe(accepted)
        emitted = min(accepted + 1, len(output) - pos)
        rounds.append((emitted, verify))
        pos += emitted
    return rounds


def drafter_rounds(drafter, plan, prompt: list[int], output: list[int]) -> list[tuple[int, int]]:
    """`replay` of one of our drafters as the decoder drives it: ``propose`` with
    ``plan``, then ``observe`` with the accepted count (what a learning drafter
    uses of `VerifyFeedback`)."""
    from types import SimpleNamespace

    import torch

    def propose(context):
        prop = drafter.propose(SimpleNamespace(plan=plan, ids=torch.from_numpy(context), max_tokens=10 ** 6))
        return prop.tokens.tolist(), prop.parents.tolist(), prop.size + 1
    return replay(prompt, output, propose, lambda accepted: drafter.observe(SimpleNamespace(num_accepted=accepted)))


def static_rounds(prompts, outputs, args, eos: tuple[int, ...]) -> dict:
    """Rounds per prompt of HF prompt lookup, our n-gram tree (the `NGramDrafter`
    itself, with decode.py's tree) and the oracle tree; none of them learns, so the
    rounds do not depend on the cost table."""
    from specloop.realmodels.drafters.ngram import NGramDrafter, build_trie, find_continuations
    from specloop.strategies.base import DraftPlan
    tree_plan = DraftPlan(args.tree_depth, _ngram_tree(args, args.tree_nodes))
    out = {"hf-prompt-lookup": [], "specloop-ngram-tree": [], "oracle-ngram-tree": []}
    for (_, _, ids), output in zip(prompts, outputs):
        max_length = len(ids) + args.max_new_tokens          # HF's max_length

        def hf(context):
            cand = hf_prompt_lookup(context, args.lookup_tokens, 2, eos, max_length)
            return cand, list(range(-1, len(cand) - 1)), len(cand) + 1

        def oracle(context):
            conts = find_continuations(context, args.oracle_depth, len(context), 1, 1)
            tokens, parents = build_trie(conts, 10 ** 9)
            return tokens, parents, None            # perfect pruning: verify size = accepted path + 1
        out["hf-prompt-lookup"].append(replay(ids, output, hf))
        tree = NGramDrafter(max_ngram=args.max_ngram, max_matches=args.tree_width)
        out["specloop-ngram-tree"].append(drafter_rounds(tree, tree_plan, ids, output))
        out["oracle-ngram-tree"].append(replay(ids, output, oracle))
    return out


def learned_rounds(prompts, outputs, args, verify_seconds) -> list[list[tuple[int, int]]]:
    """Replay `NGramDrafter` with a `LookupLength` on ``verify_seconds`` (chains of
    at most ``--learned-max-length`` tokens), one drafter for the whole prompt list
    in order: it learns from every round's accepted length, as in the decoder."""
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.strategies.base import DraftPlan
    from specloop.strategies.lookup_length import LookupLength
    drafter = NGramDrafter(max_ngram=args.max_ngram,
                           length_model=LookupLength(verify_seconds, max_length=args.learned_max_length))
    plan = DraftPlan(num_draft_tokens=args.learned_max_length)
    return [drafter_rounds(drafter, plan, ids, o) for (_, _, ids), o in zip(prompts, outputs)]


def summarise(rounds: list[tuple[int, int | None]], cost: dict) -> dict:
    seconds = np.asarray(cost["seconds"])
    verify = [v if v is not None else e for e, v in rounds]   # oracle: accepted path + bonus = emitted
    tokens = sum(e for e, _ in rounds)
    model_seconds = float(sum(seconds[min(v, len(seconds)) - 1] for v in verify))
    return {"rounds": len(rounds), "tokens": tokens, "mean_accepted_length": tokens / len(rounds),
            "mean_verify_size": float(np.mean(verify)), "model_seconds": model_seconds,
            "model_tokens_per_s": tokens / model_seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--datasets", default="humaneval,mt-bench")
    parser.add_argument("--prompts", type=int, default=5, help="held-out prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--lookup-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens")
    parser.add_argument("--max-ngram", type=int, default=3)
    parser.add_argument("--tree-width", type=int, default=4)
    parser.add_argument("--tree-depth", type=int, default=8)
    parser.add_argument("--tree-nodes", type=int, default=24)
    parser.add_argument("--oracle-depth", type=int, default=16)
    parser.add_argument("--learned-max-length", type=int, default=10)
    parser.add_argument("--cache-len", type=int, default=200)
    parser.add_argument("--max-verify", type=int, default=32)
    parser.add_argument("--verify-repeats", type=int, default=5)
    parser.add_argument("--check", type=int, default=3, help="prompts replayed through the real decoder")
    parser.add_argument("--out", type=Path, default=RESULTS / "ngram_bound.json")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import torch
    from specloop.realmodels.decoder import SpeculativeDecoder, eos_ids_of
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.policy import FixedDraftPolicy
    target = load_model(args.target, dtype="float32")
    prompts = _prompts(target.tokenizer, args.datasets.split(","), args.prompts)
    eos = sorted(eos_ids_of(target.model, target.tokenizer))
    outputs = []
    for _, _, ids in prompts:                      # the target's greedy continuation (HF generate)
        with torch.inference_mode():
            out = target.model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                        temperature=None, top_p=None, top_k=None, eos_token_id=eos,
                                        pad_token_id=eos[0])
        outputs.append(out[0, len(ids):].tolist())
    per_drafter = static_rounds(prompts, outputs, args, tuple(eos))
    checks = []
    for (_, pid, ids), rounds in list(zip(prompts, per_drafter["specloop-ngram-tree"]))[: args.check]:
        decoder = SpeculativeDecoder(target, NGramDrafter(max_ngram=args.max_ngram, max_matches=args.tree_width),
                                     policy=FixedDraftPolicy(args.tree_depth, _ngram_tree(args, args.tree_nodes)))
        trace = decoder.generate(ids, args.max_new_tokens).trace
        checks.append({"prompt": pid, "decoder": [int(r.tokens_per_round) for r in trace],
                       "replay": [e for e, _ in rounds]})
    result = {"meta": {"target": args.target, "prompts": [p for _, p, _ in prompts], **{
        k: getattr(args, k) for k in ("max_new_tokens", "lookup_tokens", "max_ngram", "tree_width", "tree_depth",
                                      "tree_nodes", "oracle_depth", "cache_len")},
        "torch": torch.__version__, "machine": platform.machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "replay_matches_decoder": all(c["decoder"] == c["replay"] for c in checks), "checks": checks,
        "greedy": [{"prompt": pid, "prompt_ids": list(map(int, ids)), "output_ids": o}
                   for (_, pid, ids), o in zip(prompts, outputs)],
        "results": {}}
    for dtype in args.dtypes.split(","):
        model = load_model(args.target, dtype=dtype)
        cost = _verify_cost(model, args)
        runs = {**per_drafter, "specloop-ngram-learned": learned_rounds(prompts, outputs, args, cost["seconds"])}
        rows = {name: summarise([r for rounds in per for r in rounds], cost) for name, per in runs.items()}
        base = rows["hf-prompt-lookup"]["model_tokens_per_s"]
        for row in rows.values():
            row["vs_hf_prompt_lookup"] = row["model_tokens_per_s"] / base
        result["results"][dtype] = {"verify_cost": cost, "drafters": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k not in ("checks", "greedy")}, indent=1, default=str))
    else:
        for dtype, res in result["results"].items():
            for name, row in res["drafters"].items():
                print(f"{dtype:9s} {name:22s} tau {row['mean_accepted_length']:.3f} "
                      f"verify {row['mean_verify_size']:.2f} vs HF PLD {row['vs_hf_prompt_lookup']:.3f}")
        print("replay matches decoder:", result["replay_matches_decoder"])
    return 0 if result["replay_matches_decoder"] else 1


if __name__ == "__main__":
    sys.exit(main())
