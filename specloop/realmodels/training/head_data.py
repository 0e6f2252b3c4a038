"""Batches and losses for training Medusa / Hydra / small-LM drafts on the target
feature cache (`specloop.realmodels.training.features`), by teacher forcing.

Position convention (same as the cache): at chunk position i the cache holds the
token x_i, the target's last-layer feature h_i and the target's top-K distribution
of x_{i+1}. A head sample anchored at offset t with horizon K uses h_t, the tokens
x_{t+1..t+K} (what heads 1..K condition on), the target's features h_{t+1..t+K}
(Hydra's feature-regression targets) and the target's distributions at t+1..t+K
(the soft labels of heads 1..K: head i drafts x_{t+1+i}).

Loss (distillation, Hinton et al. 2015; the soft-label form Medusa-2 / Hydra use):
cross-entropy of the draft's reduced-vocabulary distribution against the target's
top-K probabilities, restricted to the reduced vocabulary and renormalised there
(FR-Spec, Zhao et al. 2025: tokens outside the reduced vocabulary can never be
drafted, so their mass carries no gradient signal).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["HeadBatch", "sample_anchors", "gather_head_batch", "gather_windows", "soft_labels",
           "distill_loss", "top1_agreement"]


@dataclass(frozen=True)
class HeadBatch:
    """A training batch for K heads (B anchors).

    Attributes:
        h: float32 (B, d): h_t.
        tokens: int64 (B, K): x_{t+1} .. x_{t+K}.
        target_hidden: float32 (B, K, d): h_{t+1} .. h_{t+K}.
        topk_ids: int64 (B, K, top_k): the target's top ids at t+1 .. t+K.
        topk_probs: float32 (B, K, top_k): their probabilities.
    """

    h: torch.Tensor
    tokens: torch.Tensor
    target_hidden: torch.Tensor
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor


def sample_anchors(n_chunks: int, chunk_len: int, horizon: int, batch_size: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Uniform anchors (chunk, offset) with offset + horizon < chunk_len.

    Returns:
        (chunks, offsets): two int64 arrays (batch_size,), chunks sorted (memmap locality).

    Raises:
        ValueError: no chunk, or a chunk too short for the horizon.
    """
    if n_chunks < 1:
        raise ValueError("the feature cache has no finished chunk yet")
    if chunk_len - horizon < 1:
        raise ValueError(f"chunk_len {chunk_len} too short for horizon {horizon}")
    chunks = np.sort(rng.integers(0, n_chunks, size=batch_size))
    offsets = rng.integers(0, chunk_len - horizon, size=batch_size)
    return chunks, offsets


def gather_head_batch(part, chunks: np.ndarray, offsets: np.ndarray, horizon: int) -> HeadBatch:
    """Read a `HeadBatch` from a `FeaturePart` (memmaps) at the given anchors."""
    hidden, tokens = part.hidden(-1), part.array("tokens")
    top_ids, top_probs = part.array("topk_ids"), part.array("topk_probs")
    rows = chunks[:, None]
    cols = offsets[:, None] + np.arange(1, horizon + 1)[None, :]
    h = torch.from_numpy(np.asarray(hidden[chunks, offsets], dtype=np.float32))
    return HeadBatch(
        h=h,
        tokens=torch.from_numpy(np.asarray(tokens[rows, cols], dtype=np.int64)),
        target_hidden=torch.from_numpy(np.asarray(hidden[rows, cols], dtype=np.float32)),
        topk_ids=torch.from_numpy(np.asarray(top_ids[rows, cols], dtype=np.int64)),
        topk_probs=torch.from_numpy(np.asarray(top_probs[rows, cols], dtype=np.float32)),
    )


def gather_windows(part, chunks: np.ndarray, starts: np.ndarray, width: int) -> tuple[torch.Tensor, ...]:
    """Token windows for a small-LM draft: (tokens (B, W) int64, topk_ids (B, W, K)
    int64, topk_probs (B, W, K) float32) from positions start .. start+W-1."""
    rows = chunks[:, None]
    cols = starts[:, None] + np.arange(width)[None, :]
    return (torch.from_numpy(np.asarray(part.array("tokens")[rows, cols], dtype=np.int64)),
            torch.from_numpy(np.asarray(part.array("topk_ids")[rows, cols], dtype=np.int64)),
            torch.from_numpy(np.asarray(part.array("topk_probs")[rows, cols], dtype=np.float32)))


def soft_labels(topk_ids: torch.Tensor, topk_probs: torch.Tensor,
                target_to_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Map the target's top-K (ids, probs) into the reduced vocabulary.

    Returns:
        (index, weight): int64 and float32 (..., K): draft-vocabulary rows (0 where the
        id is outside it) and weights renormalised to sum to 1 over the ids inside it
        (all zero when none is inside: such a position contributes no loss).
    """
    index = target_to_draft[topk_ids]
    inside = index >= 0
    weight = torch.where(inside, topk_probs, torch.zeros_like(topk_probs))
    weight = weight / weight.sum(-1, keepdim=True).clamp_min(1e-12)
    return index.clamp_min(0), weight


def distill_loss(logits: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -sum_j w_j log q_draft(index_j); logits (..., V_d)."""
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, index)
    per_pos = -(weight * logq).sum(-1)
    has_label = (weight.sum(-1) > 0).float()
    return (per_pos * has_label).sum() / has_label.sum().clamp_min(1.0)


def top1_agreement(logits: torch.Tensor, draft_to_target: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Fraction (float tensor (...) averaged over the batch axis 0) of positions where
    the draft's argmax (mapped to target ids) equals the target's top-1 id."""
    pred = draft_to_target[logits.argmax(-1)]
    return (pred == topk_ids[..., 0]).float().mean(0)
