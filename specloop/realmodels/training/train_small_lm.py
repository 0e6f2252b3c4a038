"""Distil a small LM draft (`specloop.realmodels.heads.small_lm`) from the target on
the feature cache: teacher-forced windows of real text, soft labels = the target's
cached top-K next-token distributions restricted to the reduced vocabulary
(Hinton et al. 2015 distillation; the token-level KD of DistillSpec, Zhou et al.
2024, with forward KL).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from specloop.realmodels.heads.small_lm import SmallLMDraft
from specloop.realmodels.training.head_data import distill_loss, gather_windows, soft_labels
from specloop.realmodels.training.head_loop import LoopConfig, run_loop

__all__ = ["SmallLMTrainConfig", "small_lm_loss", "train_small_lm_draft"]


@dataclass(frozen=True)
class SmallLMTrainConfig:
    """Settings: ``window`` (tokens per training sequence, <= chunk_len),
    ``eval_windows`` (held-out windows for top-1 agreement)."""

    window: int = 128
    eval_windows: int = 16

    def to_dict(self) -> dict:
        return asdict(self)


def _windows(part, n_chunks: int, width: int, count: int, rng: np.random.Generator):
    length = int(part.meta["chunk_len"])
    if n_chunks < 1:
        raise ValueError("the feature cache has no finished chunk yet")
    if width > length:
        raise ValueError(f"window {width} longer than the cache's chunk_len {length}")
    chunks = np.sort(rng.integers(0, n_chunks, size=count))
    starts = rng.integers(0, length - width + 1, size=count)
    return gather_windows(part, chunks, starts, width)


def small_lm_loss(draft: SmallLMDraft, tokens: torch.Tensor, topk_ids: torch.Tensor,
                  topk_probs: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Distillation loss over every position of (B, W) windows; metric: top-1 agreement."""
    logits, _ = draft(tokens)
    index, weight = soft_labels(topk_ids, topk_probs, draft.lm_head.target_to_draft)
    loss = distill_loss(logits, index, weight)
    with torch.no_grad():   # positions without label weight (a recording's padding) do not count
        pred = draft.lm_head.draft_to_target[logits.argmax(-1)]
        labelled = topk_probs.sum(-1) > 0
        acc = ((pred == topk_ids[..., 0]) & labelled).sum() / labelled.sum().clamp_min(1)
    return loss, {"top1": float(acc)}


def train_small_lm_draft(draft: SmallLMDraft, train_part, val_part, loop: LoopConfig,
                         cfg: SmallLMTrainConfig = SmallLMTrainConfig(), *, checkpoint=None, signature: str = "",
                         progress: bool = True) -> dict:
    """Train ``draft`` in place (``loop.batch_size`` windows of ``cfg.window``
    tokens per step).

    Returns:
        `run_loop`'s report (``positions`` counts windows; ``train_positions`` the
        teacher-forced token positions seen), ``train_tokens_available``, configs.

    Raises:
        ValueError: empty cache parts, a window longer than a chunk.
    """
    from specloop.realmodels.training.recording_data import RecordingSplit
    if isinstance(train_part, RecordingSplit):
        return _train_on_recording(draft, train_part, val_part, loop, cfg, checkpoint, signature, progress)
    parts = list(train_part) if isinstance(train_part, (list, tuple)) else [train_part]
    state = {"done": [p.n_done for p in parts], "draws": 0}
    state["seen"] = sum(state["done"])
    val = _windows(val_part, val_part.n_done, cfg.window, cfg.eval_windows, np.random.default_rng(1234))

    def loss_fn(rng):
        state["draws"] += 1
        if state["draws"] % 50 == 0:
            state["done"] = [p.n_done for p in parts]
            state["seen"] = max(state["seen"], sum(state["done"]))
        weights = np.asarray(state["done"], dtype=np.float64)
        j = int(rng.choice(len(parts), p=weights / weights.sum())) if weights.sum() > 0 else 0
        return small_lm_loss(draft, *_windows(parts[j], state["done"][j], cfg.window, loop.batch_size, rng))

    def eval_fn():
        loss, metrics = small_lm_loss(draft, *val)
        return {"top1": round(metrics["top1"], 4), "loss": round(float(loss), 4)}

    report = run_loop(draft, loss_fn, eval_fn, loop, checkpoint=checkpoint, signature=signature, progress=progress, desc="small-lm")
    report["train_positions"] = report["positions"] * cfg.window
    report["train_tokens_available"] = state["seen"] * int(parts[0].meta["chunk_len"])
    report["loop_config"] = loop.to_dict()
    report["loss_config"] = cfg.to_dict()
    return report


def _train_on_recording(draft, train, val_split, loop: LoopConfig, cfg: SmallLMTrainConfig, checkpoint,
                        signature: str, progress: bool) -> dict:
    """`train_small_lm_draft` on `recording_data.RecordingSplit` s (windows inside one
    prompt each; unlabelled positions carry no loss)."""
    val = val_split.lm_windows(cfg.window, cfg.eval_windows, np.random.default_rng(1234))

    def loss_fn(rng):
        return small_lm_loss(draft, *train.lm_windows(cfg.window, loop.batch_size, rng))

    def eval_fn():
        loss, metrics = small_lm_loss(draft, *val)
        return {"top1": round(metrics["top1"], 4), "loss": round(float(loss), 4)}

    report = run_loop(draft, loss_fn, eval_fn, loop, checkpoint=checkpoint, signature=signature, progress=progress,
                      desc="small-lm")
    report["train_positions"] = report["positions"] * cfg.window
    report["train_tokens_available"] = train.positions
    report["loop_config"] = loop.to_dict()
    report["loss_config"] = cfg.to_dict()
    return report


#: Decoder layers of the distilled small LM (of the target's 30 for SmolLM2-135M): 2 keeps the
#: float16 draft under the 25 MB shipping limit (4 layers would be 38 MB) and its step cheap.
SMALL_LM_LAYERS = 2


def train_small_lm(config, *, loaded=None, progress: bool = True) -> dict:
    """``specloop draft train --kind small-lm``: a `SMALL_LM_LAYERS`-layer draft
    initialised from the target, ``batch_size`` windows of ``window`` tokens per step.

    Returns:
        The saved report (see `head_data.train_registered`).
    """
    from specloop.realmodels.training.head_data import train_registered
    if config.kind != "small-lm":
        raise ValueError(f"train_small_lm trains kind 'small-lm', got {config.kind!r}")

    def build(model, d2t):
        layers = min(SMALL_LM_LAYERS, int(model.config.num_hidden_layers))
        return SmallLMDraft.from_target(model, d2t, num_layers=layers), config.batch_size

    loss_cfg = SmallLMTrainConfig(window=config.window, eval_windows=4 if config.quick else 32)
    return train_registered(config, "small-lm", loaded, progress, build, train_small_lm_draft, loss_cfg)


def _register() -> None:
    from specloop.realmodels.training.trainer import register_trainer
    register_trainer("small-lm", train_small_lm)


_register()
