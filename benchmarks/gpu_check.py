"""GPU readiness check on models built on the device (no download, no shipped artefact).

    python benchmarks/gpu_check.py --out gpu_check.json            # CUDA, about 5-8 minutes
    python benchmarks/gpu_check.py --device cpu --tiny --out x.json  # CPU smoke mode (tested)

Sections (each runs even when an earlier one failed; failures are listed in the JSON):

* ``lossless``: a tiny random Llama (float32) on the device; every drafter that needs
  no shipped artefact (ngram, suffix, hedge, hydra, medusa, eagle, eagle3, a separate
  small LM, the distilled small LM; heads randomly initialised) with a chain, a static
  tree and an EAGLE-2 tree: greedy output == plain greedy, token for token.
* ``sampling``: temperature 1, the first generated token over many seeds against the
  target's exact distribution (chi-square p-value), for a Hydra chain (q_draft rows)
  and an EAGLE-2 tree (point masses).
* ``real_shape``: a random-weight Llama-3-8B-shaped model in bfloat16 built on the
  device (``--tiny``: a small one): after a warm-up, per drafter and plan: rounds,
  seconds per round, stream syncs per round (CUDA's sync debug mode counts them;
  None on CPU), round overhead = round seconds - verify forward seconds; and the
  verify forward's seconds against block width.

Writes one JSON (``--out``); exit 0 when every section passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import traceback
import warnings

import torch

V_TINY = 64
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7]


def _llama(device, dtype, *, vocab, hidden, layers, heads, kv_heads, inter, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                         tie_word_embeddings=False, attn_implementation="sdpa", bos_token_id=0,
                         eos_token_id=vocab - 1)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _loaded(model):
    from specloop.realmodels.loading import LoadedModel
    return LoadedModel(model=model, tokenizer=None, name="random", source="gpu_check")


def _plans():
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.strategies.base import TreePlan
    return {"chain5": FixedDraftPolicy(5), "tree321": FixedDraftPolicy(3, TreePlan(branching=(3, 2, 1))),
            "eagle2_k4d4v12": FixedDraftPolicy(4, TreePlan(top_k=4, max_depth=4, verify_size=12))}


def make_drafter(kind: str, model):
    """A drafter of ``kind`` for ``model`` on its device, needing no saved artefact."""
    from specloop.realmodels.loading import LoadedModel
    vocab = int(model.config.vocab_size)
    device = next(model.parameters()).device
    d2t = torch.arange(0, vocab, 2, device="cpu")
    target = LoadedModel(model=model, tokenizer=None, name="random", source="gpu_check")
    if kind in ("ngram", "suffix", "hedge"):
        from specloop.realmodels.registry.drafters import make_drafter as registry
        return registry({"hedge": "hedge:suffix,ngram"}.get(kind, kind), target)
    if kind in ("eagle", "eagle3"):
        from specloop.realmodels.heads.common import ReducedVocab
        from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
        from specloop.realmodels.heads.eagle_drafter import EagleDrafter
        cfg = EagleConfig.from_target(model.config, kind, int(d2t.numel()))
        lm = model.get_output_embeddings().weight.detach()
        head = EagleHead(cfg, model.get_input_embeddings().weight.detach().float(),
                         lm[d2t.to(device)].float()).to(device)
        return EagleDrafter(head, ReducedVocab(d2t, vocab), name=kind)
    if kind in ("hydra", "medusa"):
        from specloop.realmodels.heads import head_drafting
        from specloop.realmodels.heads.hydra import build_hydra
        from specloop.realmodels.heads.medusa import build_medusa
        build = build_hydra if kind == "hydra" else build_medusa
        cls = head_drafting.HydraDrafter if kind == "hydra" else head_drafting.MedusaDrafter
        return cls(build(model, d2t, num_heads=4).to(device))
    if kind == "small-lm":
        from specloop.realmodels.drafters.small_lm import SmallLMDrafter
        draft = _llama(device, next(model.parameters()).dtype, vocab=vocab, hidden=64, layers=1, heads=2,
                       kv_heads=1, inter=128, seed=1)
        return SmallLMDrafter(draft)
    if kind == "distilled":
        from specloop.realmodels.heads.small_lm import SmallLMDraft, SmallLMDraftDrafter
        return SmallLMDraftDrafter(SmallLMDraft.from_target(model, d2t, num_layers=1).to(device))
    raise ValueError(f"unknown drafter {kind!r}")


KINDS = ("ngram", "suffix", "hedge", "hydra", "medusa", "eagle", "eagle3", "small-lm", "distilled")


def plain_greedy(model, prompt, n):
    device = next(model.parameters()).device
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq], device=device)).logits[0, -1].argmax()))
    return seq[len(prompt):]


def section_lossless(device, tiny):
    from specloop.realmodels.decoder import SpeculativeDecoder
    model = _llama(device, torch.float32, vocab=V_TINY, hidden=32, layers=2, heads=2, kv_heads=1, inter=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    n = 16 if tiny else 48
    reference = plain_greedy(model, PROMPT, n)
    rows, failed = [], []
    for kind in KINDS:
        for plan_name, policy in _plans().items():
            row = {"drafter": kind, "plan": plan_name}
            try:
                decoder = SpeculativeDecoder(_loaded(model), make_drafter(kind, model), policy=policy, eos_token_id=-1)
                out = decoder.generate(PROMPT, max_new_tokens=n)
                row["identical_to_greedy"] = out.new_tokens == reference
            except Exception as exc:               # record and go on: one broken drafter is a finding
                row["error"] = f"{type(exc).__name__}: {exc}"
            if not row.get("identical_to_greedy"):
                failed.append(f"{kind}/{plan_name}")
            rows.append(row)
    return {"rows": rows, "failed": failed, "ok": not failed}


def section_sampling(device, tiny):
    from scipy.stats import chisquare
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.sampling import SamplingConfig
    vocab = 16
    model = _llama(device, torch.float32, vocab=vocab, hidden=32, layers=2, heads=2, kv_heads=1, inter=64, seed=3)
    with torch.inference_mode():
        p = torch.softmax(model(torch.tensor([PROMPT[:4]], device=device)).logits[0, -1].double(), -1).cpu()
    runs = 60 if tiny else 600
    out, failed = {}, []
    for kind, plan in (("hydra", "chain5"), ("eagle", "eagle2_k4d4v12"), ("ngram", "tree321")):
        counts = torch.zeros(vocab, dtype=torch.float64)
        drafter = make_drafter(kind, model)
        for seed in range(runs):
            decoder = SpeculativeDecoder(_loaded(model), drafter, policy=_plans()[plan], sampling=SamplingConfig(1.0),
                                         seed=seed, eos_token_id=-1)
            counts[decoder.generate(PROMPT[:4], max_new_tokens=3).new_tokens[0]] += 1
        expected = p * runs
        big = expected >= 5                       # pool the rare tokens into one cell
        if int(big.sum()) < 2:                    # at least two cells: the likeliest token and the rest
            big = torch.zeros(vocab, dtype=torch.bool)
            big[int(p.argmax())] = True
        obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
        exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
        keep = exp > 0
        pvalue = float(chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue)
        out[f"{kind}/{plan}"] = {"runs": runs, "cells": int(keep.sum()), "chi2_pvalue": pvalue}
        if not pvalue >= 1e-3:                    # NaN fails too
            failed.append(f"{kind}/{plan}")
    return {"rows": out, "failed": failed, "ok": not failed}


def _sync_counter(device):
    """A context manager counting CUDA stream syncs (sync debug mode warnings), or None."""
    if device.type != "cuda":
        return None

    class Count:
        def __enter__(self):
            self._w = warnings.catch_warnings(record=True)
            self.records = self._w.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            return self

        def __exit__(self, *exc):
            torch.cuda.set_sync_debug_mode(0)
            self._w.__exit__(*exc)
            self.count = sum("synchroniz" in str(r.message) for r in self.records)
    return Count


def _verify_seconds(model, context: int, widths, repeats: int) -> dict[int, float]:
    from specloop.realmodels.kvcache import causal_forward, crop, model_forward, new_cache
    from specloop.realmodels.tree import verify_block_inputs
    device = next(model.parameters()).device
    cache = new_cache()
    causal_forward(model, cache, torch.randint(0, model.config.vocab_size, (context,)))
    out = {}
    for w in widths:
        parents = torch.arange(-1, w - 2, device="cpu")
        mask, positions = verify_block_inputs(parents, context, next(model.parameters()).dtype, device)
        ids = torch.zeros(w, dtype=torch.long, device=device)
        best = math.inf
        for _ in range(repeats + 1):                 # the first is the warm-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model_forward(model, cache, ids, mask, positions)
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
            crop(cache, context)
        out[w] = best
    return out


def section_real_shape(device, tiny):
    from specloop.realmodels.decoder import SpeculativeDecoder
    if tiny:
        shape = dict(vocab=1024, hidden=128, layers=2, heads=4, kv_heads=2, inter=256)
    else:                                            # Llama-3-8B
        shape = dict(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, inter=14336)
    model = _llama(device, torch.bfloat16, **shape)
    n = 16 if tiny else 64
    counter = _sync_counter(device)
    prompt = (PROMPT * 20)[:200]
    rows = []
    widths = (1, 2, 4, 8, 12, 16)
    verify = _verify_seconds(model, len(prompt), widths, 2 if tiny else 5)
    for kind in ("ngram", "hydra", "eagle", "eagle3", "distilled"):
        for plan_name, policy in _plans().items():
            row = {"drafter": kind, "plan": plan_name}
            try:
                drafter = make_drafter(kind, model)
                decoder = SpeculativeDecoder(_loaded(model), drafter, policy=policy, eos_token_id=-1)
                decoder.generate(prompt, max_new_tokens=4)                   # warm-up
                if counter is not None:
                    with counter() as c:
                        result = decoder.generate(prompt, max_new_tokens=n)
                    row["syncs_per_round"] = c.count / max(1, len(result.trace))
                else:
                    result = decoder.generate(prompt, max_new_tokens=n)
                    row["syncs_per_round"] = None
                trace = result.trace.rounds if hasattr(result.trace, "rounds") else list(result.trace)
                rounds = len(trace)
                secs = sum(r.draft_time + r.verify_time + r.update_time for r in trace)
                verified = [r.verified_tokens for r in trace]
                forward = sum(verify.get(w, verify[max(widths)]) for w in
                              (min((x for x in widths if x >= v), default=max(widths)) for v in verified))
                row.update(rounds=rounds, tokens=len(result.new_tokens), seconds_per_round=secs / max(1, rounds),
                           round_overhead_s=(secs - forward) / max(1, rounds))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
    failed = [f"{r['drafter']}/{r['plan']}" for r in rows if "error" in r]
    return {"shape": shape, "dtype": "bfloat16", "verify_seconds_by_width": {str(k): v for k, v in verify.items()},
            "rows": rows, "failed": failed, "ok": not failed}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="small sizes and few runs (smoke mode)")
    parser.add_argument("--out", default="gpu_check.json", help="the JSON written")
    parser.add_argument("--sections", default="lossless,sampling,real_shape")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "gpu_check: no CUDA device (torch.cuda.is_available() is False)\n")
    sections = {"lossless": section_lossless, "sampling": section_sampling, "real_shape": section_real_shape}
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "tiny": args.tiny, "sections": {}}
    t0 = time.perf_counter()
    for name in args.sections.split(","):
        start = time.perf_counter()
        try:
            result = sections[name](device, args.tiny)
        except Exception as exc:                     # a failing section is reported, the others still run
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        result["seconds"] = time.perf_counter() - start
        report["sections"][name] = result
        print(f"gpu_check: {name}: {'ok' if result['ok'] else 'FAILED'} ({result['seconds']:.1f} s)", flush=True)
    report["seconds"] = time.perf_counter() - t0
    report["ok"] = all(s["ok"] for s in report["sections"].values())
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
