"""Logits processing shared by target and draft: temperature, top-k, top-p.

The same `SamplingConfig` is applied to the target's logits (giving p_target) and
to the draft's logits (giving q_draft), so that speculative sampling compares the
two distributions the user asked for (Leviathan et al. 2023, Sec. 2.3;
Chen et al. 2023, Alg. 2). ``temperature == 0`` means greedy decoding: the
distributions are one-hot at the argmax (ties broken towards the lowest id, as
``torch.argmax`` does).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

__all__ = ["SamplingConfig", "processed_probs", "check_finite", "check_logits_sum", "sample_from", "draft_index"]


@dataclass(frozen=True)
class SamplingConfig:
    """How next-token distributions are formed from logits.

    Attributes:
        temperature: > 0 for sampling, 0 for greedy (float).
        top_k: keep the k most likely tokens (None or 0 = all).
        top_p: keep the smallest set with cumulative probability >= top_p
            (nucleus; None or 1.0 = all), applied after top-k, as transformers does.

    Raises:
        ValueError: temperature not a finite real number >= 0, top_k not an
            integer >= 0 (2.5 and True are refused), top_p not a real number in (0, 1].
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, numbers.Integral) or isinstance(self.top_k, bool)
                                       or self.top_k < 0):
            raise ValueError(f"top_k must be an integer >= 0 (or None), got {self.top_k!r}")
        if self.top_p is not None and (not _is_real(self.top_p) or not (0.0 < float(self.top_p) <= 1.0)):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _is_real(value) -> bool:
    """A real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_finite(logits: torch.Tensor, who: str) -> None:
    """Raise ValueError if ``logits`` hold NaN (or +inf), naming the model (one
    device read)."""
    if bool((torch.isnan(logits) | torch.isposinf(logits)).any()):
        raise ValueError(f"{who} produced NaN/inf logits (shape {tuple(logits.shape)}); "
                         "check the model weights and dtype")


def check_logits_sum(total: float, logits: torch.Tensor) -> None:
    """Raise ValueError when ``total`` (the sum of ``logits``) is NaN or +inf: one cheap
    reduction instead of two full isnan / isposinf passes, since the sum is NaN or +inf
    iff some logit is NaN or +inf (-inf alone, a masked token, is allowed)."""
    if total != total or total == float("inf"):
        check_finite(logits, "target model")


def processed_probs(logits: torch.Tensor, config: SamplingConfig, check: bool = True) -> torch.Tensor:
    """Turn logits into the distribution tokens are drawn from.

    Args:
        logits: float tensor (..., V).
        config: the `SamplingConfig` (same one for p_target and q_draft).
        check: raise on NaN logits here (a device read); False leaves the check to
            the caller (a drafter on an accelerator checks all its steps' logits
            once, with `check_finite`, before returning its proposal).

    Returns:
        float32 tensor (..., V), rows summing to 1: one-hot at the argmax when
        greedy, otherwise softmax(logits / T) restricted to top-k then top-p and
        renormalised.

    Raises:
        ValueError: NaN logits.
    """
    if check:
        check_finite(logits, "model")
    logits = logits.float()
    if config.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    scores = logits / config.temperature
    vocab = scores.shape[-1]
    if config.top_k and config.top_k < vocab:
        kth = torch.topk(scores, int(config.top_k), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        remove_sorted = cum <= (1.0 - config.top_p)
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.softmax(-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a (V,) distribution with an owned Generator
    (inverse CDF on one uniform, so the stream of uniforms is the only randomness)."""
    u = torch.rand((), generator=generator, device=generator.device, dtype=torch.float64)
    cdf = probs.detach().double().to(generator.device).cumsum(-1)
    # side="right": the first bin whose cdf exceeds u * total, never a zero bin
    idx = int(torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True).item())
    return min(idx, probs.shape[-1] - 1)


def draft_index(probs: torch.Tensor, config: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """int64 (1,) on ``probs``' device: the index drafted from a (V,) row of
    `processed_probs` -- its argmax when ``config`` is greedy (nothing read back to the
    host), else one `sample_from` draw with ``generator`` (which reads the row)."""
    if config.greedy:
        return probs.argmax().reshape(1)
    return torch.full((1,), sample_from(probs, generator), dtype=torch.long, device=probs.device)
