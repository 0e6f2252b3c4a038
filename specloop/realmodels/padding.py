"""Verification-width padding: verify a block as a wider one when the device runs
the wider forward faster.

Some BLAS back-ends are slower for 2-3 rows than for 4 or more. Measured on this
project's CPU (AMD EPYC, PyTorch 2.13's MKL, float32): the 576 x 49152 LM head of
SmolLM2-135M takes 9.8 / 22.0 / 33.1 / 17.7 ms for 1 / 2 / 3 / 4 rows, and a whole
verification forward of 3 tokens 118 ms against 87 ms for 4 and 83 ms for 8
(``benchmarks/results/decode_heads_verify_cost.json``); bfloat16 grows smoothly.
`calibrate_verify_widths` times the target's own verification forward for each
width on the device in use and maps every block size n to the width w >= n with the
smallest time (fastest of several interleaved repeats; n itself unless w saves at
least ``min_gain``).
`pad_block` appends the w - n dummy nodes: leaves hanging off the pending token,
which no real node attends to, so the real rows' logits are those of the unpadded
block; the decoder drops the dummies' logits and cache entries. Lossless by
construction; tested token for token against plain greedy decoding.
"""
from __future__ import annotations

import time

import torch

from specloop.realmodels.kvcache import (cache_length, causal_forward, keep_positions, model_forward,
                                         new_cache)
from specloop.realmodels.tree import verify_block_inputs

__all__ = ["calibrate_verify_widths", "measure_verify_cost", "pad_block", "check_widths", "target_device",
           "device_sync", "sync_for_device"]


def check_widths(widths: dict) -> dict[int, int]:
    """Validate a {block size n: verify width w} map (ints, 1 <= n <= w).

    Raises:
        ValueError: a width smaller than its block size, or a size < 1.
    """
    out = {}
    for n, w in dict(widths).items():
        n, w = int(n), int(w)
        if n < 1 or w < n:
            raise ValueError(f"verify width {w} for blocks of {n} tokens: need 1 <= n <= width")
        out[n] = w
    return out


def pad_block(tokens: torch.Tensor, parents: torch.Tensor, width: int, filler: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafted ``tokens`` / ``parents`` (int64 (m,)) padded with dummy leaves so the
    verify block [pending, nodes...] has ``width`` tokens.

    The dummies are token ``filler`` with parent -1 (children of the pending token):
    each sees the cache, the pending token and itself; no real node sees them.

    Raises:
        ValueError: width smaller than the block (m + 1).
    """
    pad = int(width) - int(tokens.shape[0]) - 1
    if pad < 0:
        raise ValueError(f"verify width {width} is smaller than the block ({tokens.shape[0] + 1} tokens)")
    if pad == 0:
        return tokens, parents
    return (torch.cat([tokens.long(), torch.full((pad,), int(filler), dtype=torch.long, device=tokens.device)]),
            torch.cat([parents.long(), torch.full((pad,), -1, dtype=torch.long, device=parents.device)]))


def _time_widths(model, cache, max_width: int, repeats: int, sync) -> dict[int, float]:
    """Fastest of ``repeats`` timed verification forwards (a chain) per width
    1..max_width, the widths interleaved within each repeat so that drift in the
    machine's speed falls on all of them alike; one untimed warm-up pass first
    (`model_forward` runs under inference mode)."""
    param = next(model.parameters())
    context = cache_length(cache)
    best = {w: float("inf") for w in range(1, max_width + 1)}
    for rep in range(repeats + 1):
        for w in best:
            mask, positions = verify_block_inputs(torch.arange(-1, w - 2, dtype=torch.long), context,
                                                  param.dtype, param.device)
            sync()
            start = time.perf_counter()
            model_forward(model, cache, torch.zeros(w, dtype=torch.long), mask, positions, False)
            sync()
            if rep:
                best[w] = min(best[w], time.perf_counter() - start)
            keep_positions(cache, torch.arange(context))
    return best


def target_device(target) -> torch.device | None:
    """The device of ``target``'s weights (a `LoadedModel` or a module), or None for
    anything without parameters (e.g. no target)."""
    model = getattr(target, "model", target)
    param = next(iter(model.parameters()), None) if isinstance(model, torch.nn.Module) else None
    return None if param is None else param.device


def device_sync(target):
    """A callable that waits for ``target``'s device (``torch.cuda.synchronize`` on CUDA,
    ``torch.mps.synchronize`` on MPS), or None where work is synchronous (the CPU)."""
    return sync_for_device(target_device(target))


def sync_for_device(device: torch.device | None):
    """`device_sync` for a device itself (None: no device)."""
    kind = None if device is None else device.type
    if kind == "cuda":
        return torch.cuda.synchronize
    if kind == "mps":
        return torch.mps.synchronize
    return None


def _sync_of(model):
    return device_sync(model) or (lambda: None)


def measure_verify_cost(model, *, max_width: int, context: int = 64, repeats: int = 3) -> list[float]:
    """Seconds of the target's verification forward for 1..``max_width`` tokens, measured
    on the model's own device and dtype (a table like the shipped CPU one, for a target
    elsewhere: drafters that prune by verify cost must not use another machine's table).

    Args:
        model: the target causal LM.
        max_width: widest block timed (tokens, >= 1).
        context: cache length the forwards run over (tokens, >= 1).
        repeats: timed forwards per width (the fastest counts, one warm-up pass before,
            device synchronised around each).

    Returns:
        ``max_width`` floats, entry n - 1 the seconds of an n-token verification, made
        non-decreasing (running maximum: timing noise must not make a wider block look
        cheaper to a drafter that prunes by cost).

    Raises:
        ValueError: max_width, context or repeats < 1.
    """
    if min(int(max_width), int(context), int(repeats)) < 1:
        raise ValueError(f"need max_width, context, repeats >= 1, got {max_width}, {context}, {repeats}")
    cache = new_cache()
    causal_forward(model, cache, torch.zeros(int(context), dtype=torch.long))
    seconds = _time_widths(model, cache, int(max_width), int(repeats), _sync_of(model))
    table, floor = [], 0.0
    for w in range(1, int(max_width) + 1):
        floor = max(floor, seconds[w])
        table.append(floor)
    return table


def calibrate_verify_widths(model, *, max_width: int = 8, context: int = 64, repeats: int = 5,
                            min_gain: float = 0.1) -> dict[int, int]:
    """Measure the target's verification forward for widths 1..``max_width`` (over a
    ``context``-token cache) and return {n: w} for the block sizes n worth padding.

    Args:
        model: the target causal LM (its device and dtype are used).
        max_width: widest block timed (tokens, >= 1).
        context: cache length the forwards run over (tokens, >= 1).
        repeats: timed forwards per width (the fastest counts; widths interleaved,
            one warm-up pass before).
        min_gain: pad n to w only if time(w) <= (1 - min_gain) * time(n).

    Returns:
        {n: w} with w > n (sizes not listed are verified as they are); costs
        max_width * (repeats + 1) forwards.

    Raises:
        ValueError: max_width, context or repeats < 1, or min_gain outside [0, 1).
    """
    if min(int(max_width), int(context), int(repeats)) < 1 or not 0.0 <= float(min_gain) < 1.0:
        raise ValueError(f"need max_width, context, repeats >= 1 and 0 <= min_gain < 1, got "
                         f"{max_width}, {context}, {repeats}, {min_gain}")
    cache = new_cache()
    causal_forward(model, cache, torch.zeros(int(context), dtype=torch.long))
    seconds = _time_widths(model, cache, int(max_width), int(repeats), _sync_of(model))
    widths = {}
    for n in seconds:
        best = min(range(n, int(max_width) + 1), key=lambda w: (seconds[w], w))
        if best > n and seconds[best] <= (1.0 - float(min_gain)) * seconds[n]:
            widths[n] = best
    return widths
