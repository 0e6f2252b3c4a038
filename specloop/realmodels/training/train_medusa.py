"""Train Medusa heads (`specloop.realmodels.heads.medusa`) on the target feature cache.

Loss (Medusa, Cai et al. 2024, eq. 2 with Medusa-2's self-distillation, Sec. 2.3.2):
for an anchor t, head i (i = 1..K) is trained against the target's distribution of
x_{t+1+i}, i.e. p_target(. | x_<=t+i) from the cache (teacher forcing on real text),
restricted to the reduced vocabulary; the total is sum_i head_decay^(i-1) * CE_i
(Medusa's lambda_k = 0.8^k).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from specloop.realmodels.heads.medusa import MedusaHeads
from specloop.realmodels.training.head_data import HeadBatch, distill_loss, soft_labels, top1_agreement
from specloop.realmodels.training.head_loop import LoopConfig, run_loop
from specloop.realmodels.training.train_hydra import evaluate_heads, fixed_eval_batch, head_sampler

__all__ = ["MedusaTrainConfig", "medusa_loss", "train_medusa_heads"]


@dataclass(frozen=True)
class MedusaTrainConfig:
    """Loss settings: ``head_decay`` (weight decay^(i-1) of head i), ``eval_positions``."""

    head_decay: float = 0.8
    eval_positions: int = 2048

    def to_dict(self) -> dict:
        return asdict(self)


def medusa_loss(heads: MedusaHeads, batch: HeadBatch, cfg: MedusaTrainConfig) -> tuple[torch.Tensor, dict]:
    """Weighted distillation loss of all heads; metrics: head-1 top-1 agreement."""
    logits = heads(batch.h)                                   # (B, K, V_d)
    index, weight = soft_labels(batch.topk_ids, batch.topk_probs, heads.lm_head.target_to_draft)
    total = logits.new_zeros(())
    for i in range(heads.config.num_heads):
        total = total + cfg.head_decay ** i * distill_loss(logits[:, i], index[:, i], weight[:, i])
    with torch.no_grad():
        acc = top1_agreement(logits[:, 0], heads.lm_head.draft_to_target, batch.topk_ids[:, 0])
    return total, {"top1": float(acc)}


def train_medusa_heads(heads: MedusaHeads, train_part, val_part, loop: LoopConfig,
                       cfg: MedusaTrainConfig = MedusaTrainConfig(), *, checkpoint=None, signature: str = "",
                       progress: bool = True) -> dict:
    """Train ``heads`` in place; same arguments and report as
    `specloop.realmodels.training.train_hydra.train_hydra_heads`."""
    horizon = heads.config.num_heads
    sampler = head_sampler(train_part, horizon, loop.batch_size)
    val = fixed_eval_batch(val_part, horizon, cfg.eval_positions)

    def loss_fn(rng):
        return medusa_loss(heads, sampler(rng), cfg)

    def eval_fn():
        return evaluate_heads(heads(val.h), heads.lm_head.draft_to_target, val)

    report = run_loop(heads, loss_fn, eval_fn, loop, checkpoint=checkpoint, signature=signature, progress=progress, desc="medusa")
    report["train_tokens_available"] = sampler.max_tokens_seen
    report["loop_config"] = loop.to_dict()
    report["loss_config"] = cfg.to_dict()
    return report


#: Medusa heads trained by ``specloop draft train --kind medusa`` (Medusa uses 5).
MEDUSA_HEADS = 5


def train_medusa(config, *, loaded=None, progress: bool = True) -> dict:
    """``specloop draft train --kind medusa``: K = max(5, ttt_steps) heads, anchors
    per step = batch_size x (window - 1).

    Returns:
        The saved report (see `head_data.train_registered`).
    """
    from specloop.realmodels.heads.medusa import build_medusa
    from specloop.realmodels.training.head_data import train_registered
    if config.kind != "medusa":
        raise ValueError(f"train_medusa trains kind 'medusa', got {config.kind!r}")

    def build(model, d2t):
        heads = build_medusa(model, d2t, num_heads=max(MEDUSA_HEADS, config.ttt_steps))
        return heads, config.batch_size * (config.window - 1)

    loss_cfg = MedusaTrainConfig(eval_positions=512 if config.quick else 2048)
    hooks = {"loss": lambda heads, batch: medusa_loss(heads, batch, loss_cfg), "logits": lambda heads, batch: heads(batch.h),
             "evaluate": evaluate_heads, "prepare": lambda heads: None}
    return train_registered(config, "medusa", loaded, progress, build, train_medusa_heads, loss_cfg, hooks)


def _register() -> None:
    from specloop.realmodels.training.trainer import register_trainer
    register_trainer("medusa", train_medusa)


_register()
