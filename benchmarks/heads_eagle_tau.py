"""Mean accepted length per k of trained EAGLE / EAGLE-3 heads under greedy chain
decoding, computed from the target's own greedy continuations of held-out prompts.

For greedy verification a chain drafted at committed length m is accepted up to its
first token that differs from the target's argmax; on the accepted path the draft
tokens equal the target's greedy tokens, so one teacher-forced pass of the head
(training-time-test unrolling, `EagleHead.forward_ttt`, which equals incremental
drafting — tested) over the greedy continuation gives every round's outcome. Rounds
are replayed from the start of the response: n_t = accepted + 1 and m += n_t.
Cheap (one target forward per prompt instead of one decode per k), exact for greedy.

    python benchmarks/heads_eagle_tau.py --json out.json [--prompts 6] [--max-new-tokens 64]
"""
from __future__ import annotations

import argparse
import json

import torch

from specloop.data.prompts import load_prompts
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.loading import load_model


@torch.no_grad()
def accepted_lengths(drafter, features: torch.Tensor, seq: torch.Tensor, start: int, ks) -> dict[int, list[int]]:
    """n_t per round for each k, replaying greedy chain rounds over ``seq`` from
    ``start`` = the prompt length (the decoder's first round drafts seq[start]).
    Step s drafts seq[m+s-1] from head position m+s-3 (`EagleDrafter`'s layout)."""
    head = drafter.head
    steps = max(ks)
    t = seq.shape[0]
    outs = head.forward_ttt(features[None, : t - 1], seq[None, 1:t], steps)
    preds = [drafter.vocab.d2t[lg[0].argmax(-1)] for _, lg in outs]   # step s at position p predicts p+2
    result = {}
    for k in ks:
        m, rounds = start, []
        while m < t - 1:
            acc = 0
            for s in range(1, k + 1):
                p = m + s - 3                # committed seq[:m], pending seq[m-1]: the root is position m-2
                if p + 2 >= t or int(preds[s - 1][p]) != int(seq[p + 2]):
                    break
                acc += 1
            n = min(acc + 1, t - m)
            rounds.append(n)
            m += n
        result[k] = rounds
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafts", nargs="+", default=["eagle", "eagle3"])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    target = load_model(args.target, dtype="float32")
    tok, model = target.tokenizer, target.model
    ks = [1, 2, 3, 4, 5, 6]
    drafters = {name: make_drafter(name, target, train_if_missing=False, progress=False) for name in args.drafts}
    rounds = {name: {k: [] for k in ks} for name in args.drafts}
    for i in range(args.prompts):
        text = load_prompts(("humaneval", "mt-bench")[i % 2], "heldout")[i // 2].text
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        x = torch.tensor([ids])
        with torch.no_grad():
            seq = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                 do_sample=False)[0]
            hidden = model(seq[None], output_hidden_states=True).hidden_states
        for name, drafter in drafters.items():
            feats = torch.cat([hidden[layer][0] for layer in drafter.head.config.feature_layers], -1)
            for k, r in accepted_lengths(drafter, feats, seq, len(ids), ks).items():
                rounds[name][k].extend(r)
    out = {"target": args.target, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
           "mean_accepted_length": {name: {str(k): sum(r[k]) / len(r[k]) for k in ks} for name, r in rounds.items()},
           "heldout_top1": {name: getattr(d, "train_report", {}).get("heldout_top1") for name, d in drafters.items()}}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
