"""Train Hydra heads (`specloop.realmodels.heads.hydra`) on the target feature cache.

Multi-step training (EAGLE-3's "training-time test", Li et al. 2025, Sec. 3.2,
applied to Hydra's sequential heads): for an anchor t, the heads are unrolled K steps
from the target's h_t, each head consuming the *previous head's predicted feature*
z_{i-1} (not the target's h_{t+i-1}) together with the true token x_{t+i}; gradients
flow through the whole unroll. The loss per head i is (Hydra, Ankner et al. 2024,
Sec. 4, teacher distillation; EAGLE, Li et al. 2024, eq. 3-5 for the feature term)

    L_i = CE(p_target(. | x_<=t+i) restricted to V_d, q_draft_i)
          + feature_weight * SmoothL1(z_i, h_{t+i})

and the total is sum_i head_decay^(i-1) * L_i (Medusa's geometric head weights).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from specloop.realmodels.heads.hydra import HydraHeads
from specloop.realmodels.training.head_data import (HeadBatch, distill_loss, gather_head_batch,
                                                    sample_anchors, soft_labels, top1_agreement)
from specloop.realmodels.training.head_loop import LoopConfig, run_loop

__all__ = ["HydraTrainConfig", "hydra_loss", "evaluate_heads", "train_hydra_heads", "PartSampler", "head_sampler"]


@dataclass(frozen=True)
class HydraTrainConfig:
    """Loss settings.

    Attributes:
        feature_weight: weight of the SmoothL1 feature-regression term.
        head_decay: geometric weight of head i's loss (decay^(i-1)).
        eval_positions: held-out anchors for top-1 agreement.
        train_lm_head: also train the reduced LM head (False: keep the target's
            LM-head rows frozen, as EAGLE does; less over-fitting on small data).
    """

    feature_weight: float = 1.0
    head_decay: float = 0.8
    eval_positions: int = 2048
    train_lm_head: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class PartSampler:
    """Draws `HeadBatch`es from growing `FeaturePart`s, each anchor's part chosen in
    proportion to its finished chunks (``n_done`` is re-read every ``refresh`` draws,
    so training can start while extraction still runs)."""

    def __init__(self, parts, horizon: int, batch_size: int, refresh: int = 50) -> None:
        self.parts = list(parts) if isinstance(parts, (list, tuple)) else [parts]
        self.horizon, self.batch_size, self.refresh = horizon, batch_size, refresh
        self.length = int(self.parts[0].meta["chunk_len"])
        self.done = [p.n_done for p in self.parts]
        self.draws = 0
        self.max_tokens_seen = self.tokens_available

    @property
    def tokens_available(self) -> int:
        """Tokens in the finished chunks of all parts."""
        return sum(d * int(p.meta["chunk_len"]) for d, p in zip(self.done, self.parts))

    def __call__(self, rng: np.random.Generator) -> HeadBatch:
        self.draws += 1
        if self.draws % self.refresh == 0:
            self.done = [p.n_done for p in self.parts]
            self.max_tokens_seen = max(self.max_tokens_seen, self.tokens_available)
        weights = np.asarray(self.done, dtype=np.float64)
        if weights.sum() == 0:
            raise ValueError("the feature cache has no finished chunk yet")
        which = rng.choice(len(self.parts), size=self.batch_size, p=weights / weights.sum())
        batches = []
        for j in np.unique(which):
            part = self.parts[j]
            chunks, offsets = sample_anchors(self.done[j], int(part.meta["chunk_len"]), self.horizon,
                                             int((which == j).sum()), rng)
            batches.append(gather_head_batch(part, chunks, offsets, self.horizon))
        if len(batches) == 1:
            return batches[0]
        return HeadBatch(*(torch.cat([getattr(b, f) for b in batches]) for f in
                           ("h", "tokens", "target_hidden", "topk_ids", "topk_probs")))


def head_sampler(parts, horizon: int, batch_size: int):
    """``sampler(rng) -> HeadBatch`` with ``max_tokens_seen``: a `PartSampler` over
    feature parts, or anchors of a `recording_data.RecordingSplit`."""
    from specloop.realmodels.training.recording_data import RecordingSplit
    if not isinstance(parts, RecordingSplit):
        return PartSampler(parts, horizon, batch_size)
    pools = parts.anchor_pools(horizon)

    def sampler(rng: np.random.Generator) -> HeadBatch:
        return HeadBatch(*parts.head_tensors(rng, horizon, batch_size, pools))

    sampler.max_tokens_seen = parts.positions
    return sampler


def fixed_eval_batch(part, horizon: int, positions: int, seed: int = 1234) -> HeadBatch:
    """A deterministic held-out batch of ``positions`` anchors (from the val part, a
    feature part or a `recording_data.RecordingSplit`)."""
    from specloop.realmodels.training.recording_data import RecordingSplit
    rng = np.random.default_rng(seed)
    if isinstance(part, RecordingSplit):
        return HeadBatch(*part.head_tensors(rng, horizon, positions))
    chunks, offsets = sample_anchors(part.n_done, int(part.meta["chunk_len"]), horizon, positions, rng)
    return gather_head_batch(part, chunks, offsets, horizon)


def hydra_loss(heads: HydraHeads, batch: HeadBatch, cfg: HydraTrainConfig) -> tuple[torch.Tensor, dict]:
    """Multi-step loss of a batch (see the module docstring); metrics: head-1 top-1."""
    z, logits = heads.unroll(batch.h, batch.tokens)            # (B, K, d), (B, K, V_d)
    index, weight = soft_labels(batch.topk_ids, batch.topk_probs, heads.lm_head.target_to_draft)
    total = logits.new_zeros(())
    for i in range(heads.config.num_heads):
        ce = distill_loss(logits[:, i], index[:, i], weight[:, i])
        feat = F.smooth_l1_loss(z[:, i], batch.target_hidden[:, i])
        total = total + cfg.head_decay ** i * (ce + cfg.feature_weight * feat)
    with torch.no_grad():
        acc = top1_agreement(logits[:, 0], heads.lm_head.draft_to_target, batch.topk_ids[:, 0])
    return total, {"top1": float(acc)}


@torch.no_grad()
def evaluate_heads(logits: torch.Tensor, draft_to_target: torch.Tensor, batch: HeadBatch) -> dict:
    """Held-out metrics from (B, K, V_d) logits: ``top1_head_i`` (agreement of head i's
    argmax with the target's top-1, teacher-forced tokens) and ``chain_accept_i``
    (fraction of anchors where heads 1..i all agree: a teacher-forced proxy for
    greedy chain acceptance)."""
    agree = draft_to_target[logits.argmax(-1)] == batch.topk_ids[..., 0]      # (B, K)
    out = {}
    for i in range(logits.shape[1]):
        out[f"top1_head{i + 1}"] = round(float(agree[:, i].float().mean()), 4)
    chain = agree.float().cumprod(1).mean(0)
    for i in range(logits.shape[1]):
        out[f"chain_accept{i + 1}"] = round(float(chain[i]), 4)
    return out


def train_hydra_heads(heads: HydraHeads, train_part, val_part, loop: LoopConfig,
                      cfg: HydraTrainConfig = HydraTrainConfig(), *, checkpoint=None, signature: str = "",
                      progress: bool = True) -> dict:
    """Train ``heads`` in place on a feature cache.

    Args:
        heads: `HydraHeads` (embedding = the target's).
        train_part / val_part: `FeaturePart`s (training chunks; held-out chunks).
        loop: `LoopConfig`; cfg: `HydraTrainConfig`.
        checkpoint: resumable checkpoint file (Path) or None.

    Returns:
        `run_loop`'s report plus ``train_tokens_available`` (tokens in the finished
        training chunks when training ended) and the configs.

    Raises:
        ValueError: an empty cache part, a chunk shorter than K + 1.
    """
    horizon = heads.config.num_heads
    sampler = head_sampler(train_part, horizon, loop.batch_size)
    val = fixed_eval_batch(val_part, horizon, cfg.eval_positions)
    heads.lm_head.proj.weight.requires_grad_(cfg.train_lm_head)

    def loss_fn(rng):
        return hydra_loss(heads, sampler(rng), cfg)

    def eval_fn():
        _, logits = heads.unroll(val.h, val.tokens)
        return evaluate_heads(logits, heads.lm_head.draft_to_target, val)

    report = run_loop(heads, loss_fn, eval_fn, loop, checkpoint=checkpoint, signature=signature, progress=progress, desc="hydra")
    report["train_tokens_available"] = sampler.max_tokens_seen
    report["loop_config"] = loop.to_dict()
    report["loss_config"] = cfg.to_dict()
    return report


#: Hydra heads trained by ``specloop draft train --kind hydra`` (draft depth K).
HYDRA_HEADS = 5


def train_hydra(config, *, loaded=None, progress: bool = True) -> dict:
    """``specloop draft train --kind hydra``: K = max(5, ttt_steps) heads, anchors per
    step = batch_size x (window - 1) (the EAGLE trainer's positions per step).

    Returns:
        The saved report (see `head_data.train_registered`).
    """
    from specloop.realmodels.heads.hydra import build_hydra
    from specloop.realmodels.training.head_data import train_registered
    if config.kind != "hydra":
        raise ValueError(f"train_hydra trains kind 'hydra', got {config.kind!r}")

    def build(model, d2t):
        heads = build_hydra(model, d2t, num_heads=max(HYDRA_HEADS, config.ttt_steps))
        return heads, config.batch_size * (config.window - 1)

    loss_cfg = HydraTrainConfig(eval_positions=512 if config.quick else 2048)
    hooks = {"loss": lambda heads, batch: hydra_loss(heads, batch, loss_cfg),
             "logits": lambda heads, batch: heads.unroll(batch.h, batch.tokens)[1], "evaluate": evaluate_heads,
             "prepare": lambda heads: heads.lm_head.proj.weight.requires_grad_(loss_cfg.train_lm_head)}
    return train_registered(config, "hydra", loaded, progress, build, train_hydra_heads, loss_cfg, hooks)


def _register() -> None:
    from specloop.realmodels.training.trainer import register_trainer
    register_trainer("hydra", train_hydra)


_register()
