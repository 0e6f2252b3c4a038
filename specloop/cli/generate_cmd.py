"""``specloop generate``: speculative decoding of one prompt with a real target.

Streams the text, then prints mean accepted length, tokens/s and speedup over plain
autoregressive decoding of the same target (HF ``generate``, greedy or sampled
with the same settings, measured in the same run). ``--json`` prints one JSON object
with keys ``text``, ``new_tokens``, ``mean_accepted_length``, ``tokens_per_s``,
``baseline_tokens_per_s``, ``speedup``, ``identical_to_greedy`` (null unless
``--check-greedy``). Exit code 1 when ``--check-greedy`` finds a difference.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["register", "run", "encode_prompt", "check_args"]


def register(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="speculative decoding of one prompt with a real model",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m", help="target model: registry name, HF id or path")
    parser.add_argument("--draft", default="ngram",
                        help="drafter: ngram, small-lm, a registered head (eagle, medusa, ...) or a model name/path")
    parser.add_argument("--prompt", required=True, help="prompt text")
    parser.add_argument("--tree", default=None, help="tree shape, e.g. 4x2x1 or topk=4,depth=5[,v=32]")
    parser.add_argument("-k", "--num-draft-tokens", type=int, default=5, help="chain length k (default 5)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate, >= 1 (default 128)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--verify-widths", choices=["none", "auto"], default="none",
                        help="auto: pad verify blocks to the width this device runs fastest "
                             "(calibrated once; the output is unchanged)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile (inductor) the target's verification forward; compiled before "
                             "timing (minutes on a CPU), the output is unchanged")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--check-greedy", action="store_true",
                        help="also run plain greedy decoding and fail (exit 1) unless identical")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain-decoding baseline")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def encode_prompt(tokenizer, text: str, raw: bool = False) -> list[int]:
    """Token ids of ``text``; the chat template is applied when the tokenizer has one
    (unless ``raw``). Raises ValueError for an empty prompt."""
    if not text or not text.strip():
        raise ValueError("empty prompt: give --prompt some text")
    if not raw and getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)
        return list(out["input_ids"])
    return list(tokenizer.encode(text))


def _plain_decode(model, ids: list[int], max_new_tokens: int, sampling, seed: int, eos_ids) -> tuple[list[int], float]:
    """HF generate baseline: (new tokens, seconds), device synchronised."""
    import torch
    device = next(model.parameters()).device
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not sampling.greedy,
                  eos_token_id=sorted(eos_ids) or None, pad_token_id=sorted(eos_ids)[0] if eos_ids else None)
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0)
        torch.manual_seed(seed)
    else:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    inputs = torch.tensor([ids], device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def check_args(args):
    """Validate every option before any model work; returns (sampling, policy).

    Raises:
        ValueError: an empty prompt, ``--max-new-tokens`` < 1 (HF ``generate``, the
            baseline, refuses 0, so 0 is refused up front rather than after
            decoding), a bad sampling setting, ``--check-greedy`` with
            ``--temperature`` > 0, a bad ``--tree`` (including ``depth=`` deeper
            than the branching list), k < 0, a bad or missing ``--device``, an
            unknown ``--draft`` (the message lists the registered drafters).
    """
    from specloop.realmodels.registry.drafters import check_drafter_name
    from specloop.realmodels.loading import check_device
    from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
    from specloop.realmodels.sampling import SamplingConfig

    if not args.prompt or not args.prompt.strip():
        raise ValueError("empty prompt: give --prompt some text")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    if args.check_greedy and not sampling.greedy:
        raise ValueError("--check-greedy compares with plain greedy decoding: it needs --temperature 0")
    tree = parse_tree_shape(args.tree) if args.tree else None
    policy = FixedDraftPolicy(args.num_draft_tokens, tree)
    check_device(args.device)
    check_drafter_name(args.draft)
    return sampling, policy


def run(args) -> int:
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.sampling import SamplingConfig

    sampling, policy = check_args(args)
    target = load_model(args.target, dtype=args.dtype, device=args.device)
    ids = encode_prompt(target.tokenizer, args.prompt, args.raw)
    drafter = make_drafter(args.draft, target, dtype=args.dtype, device=args.device)
    decoder = SpeculativeDecoder(target, drafter, policy=policy, sampling=sampling, seed=args.seed,
                                 verify_widths=None if args.verify_widths == "none" else "auto",
                                 compile_target=args.compile)
    widths = decoder.calibrate()                       # before any timing
    compile_s = decoder.warm_up(ids)                   # likewise (0 without --compile)
    stream = _Streamer(target.tokenizer, enabled=not args.json)
    t0 = time.perf_counter()
    result = decoder.generate(ids, args.max_new_tokens, on_tokens=stream)
    seconds = time.perf_counter() - t0
    stream.close()
    new = result.new_tokens
    out = {
        "text": target.tokenizer.decode(new, skip_special_tokens=True),
        "new_tokens": len(new),
        "mean_accepted_length": result.trace.mean_accepted_length() if len(result.trace) else 0.0,
        "tokens_per_s": len(new) / seconds if seconds > 0 else 0.0,
        "baseline_tokens_per_s": None, "speedup": None, "identical_to_greedy": None,
        "acceptance_rate": result.trace.acceptance_rate() if len(result.trace) else None,
        "rounds": len(result.trace), "stop_reason": result.stop_reason,
        "target": args.target, "draft": args.draft, "tree": args.tree, "dtype": args.dtype,
        "verify_widths": {str(n): w for n, w in widths.items()},
        "compiled": bool(args.compile), "compile_s": compile_s,
    }
    status = 0
    if not args.no_baseline or args.check_greedy:
        base_sampling = SamplingConfig(0.0) if args.check_greedy else sampling
        base_tokens, base_seconds = _plain_decode(target.model, ids, args.max_new_tokens, base_sampling,
                                                  args.seed, decoder.eos_ids)
        if base_tokens and base_seconds > 0:
            out["baseline_tokens_per_s"] = len(base_tokens) / base_seconds
            out["speedup"] = out["tokens_per_s"] / out["baseline_tokens_per_s"]
        if args.check_greedy:
            out["identical_to_greedy"] = base_tokens == new
            status = 0 if out["identical_to_greedy"] else 1
    _report(out, args.json)
    return status


class _Streamer:
    """Prints committed text as rounds complete (decoding the whole sequence each
    time so multi-token characters print correctly)."""

    def __init__(self, tokenizer, enabled: bool):
        self.tokenizer, self.enabled = tokenizer, enabled
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, committed: list[int]) -> None:
        if not self.enabled:
            return
        self.tokens.extend(committed)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[self.printed:])
            sys.stdout.flush()
            self.printed = len(text)

    def close(self) -> None:
        if self.enabled:
            sys.stdout.write("\n")


def _report(out: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(out, indent=2))
        return
    line = (f"new tokens {out['new_tokens']}  mean accepted length {out['mean_accepted_length']:.2f}  "
            f"tokens/s {out['tokens_per_s']:.1f}")
    if out["baseline_tokens_per_s"] is not None:
        line += f"  baseline tokens/s {out['baseline_tokens_per_s']:.1f}  speedup {out['speedup']:.2f}x"
    if out["identical_to_greedy"] is not None:
        line += f"  identical_to_greedy {out['identical_to_greedy']}"
    print(line, file=sys.stderr)
