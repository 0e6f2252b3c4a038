"""The optimisation loop shared by the Medusa / Hydra / small-LM trainers: AdamW with
linear warm-up and cosine decay, gradient clipping, a wall-clock budget, tqdm
progress, periodic held-out evaluation and a resumable checkpoint.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

__all__ = ["LoopConfig", "run_loop"]


@dataclass(frozen=True)
class LoopConfig:
    """Optimisation settings.

    Attributes:
        steps: optimizer steps (upper bound; ``max_seconds`` may stop earlier).
        batch_size: anchors (positions or windows) per step.
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        warmup: linear warm-up steps.
        grad_clip: max global gradient norm.
        max_seconds: wall-clock budget in seconds (None = unlimited).
        eval_every: steps between held-out evaluations (0 = only at the end).
        checkpoint_every: steps between checkpoints (0 = none).
        seed: seed of the anchor sampler's np.random.Generator and of torch.
        autocast: run the training forward/backward under CPU bfloat16 autocast
            (about 2x faster here with avx512_bf16; losses are computed in float32).

    Raises:
        ValueError: non-positive steps / batch_size / lr.
    """

    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 50
    grad_clip: float = 1.0
    max_seconds: float | None = None
    eval_every: int = 0
    checkpoint_every: int = 0
    seed: int = 0
    autocast: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"steps, batch_size and lr must be positive: {self}")

    def to_dict(self) -> dict:
        return asdict(self)


def _lr_at(step: int, cfg: LoopConfig, time_frac: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to 0.1 x lr over the steps or over the
    wall-clock budget (``time_frac`` = elapsed / ``max_seconds``), whichever ends first."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = max((step - cfg.warmup) / max(1, cfg.steps - cfg.warmup), time_frac)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _save_checkpoint(path: Path, model, opt, step: int, history: list, seconds: float, rng,
                     signature: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "history": history,
                "seconds": seconds, "rng": rng.bit_generator.state, "signature": signature}, tmp)
    os.replace(tmp, path)


def run_loop(model: torch.nn.Module, loss_fn: Callable[[np.random.Generator], tuple[torch.Tensor, dict]],
             eval_fn: Callable[[], dict], cfg: LoopConfig, *, checkpoint: Path | None = None,
             signature: str = "", progress: bool = True, desc: str = "train") -> dict:
    """Train ``model`` in place.

    Args:
        model: the draft (its ``parameters()`` with requires_grad are optimised).
        loss_fn: ``loss_fn(rng) -> (loss, metrics)``: draws a batch with ``rng`` and
            returns a scalar loss and float metrics for the progress bar.
        eval_fn: ``eval_fn() -> dict`` of held-out metrics (called under no_grad).
        cfg: `LoopConfig`.
        checkpoint: a file to resume from / write to (None = no checkpoint).
        signature: identifies the run (configs, data); a checkpoint with another
            signature is ignored and overwritten.

    Returns:
        dict with ``steps`` (done), ``seconds`` (training wall time, s),
        ``positions`` (anchors seen = steps x batch_size), ``history`` (list of
        held-out evaluations, each with its ``step``), ``final`` (last evaluation).
    """
    from tqdm.auto import tqdm
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    step, history, spent = 0, [], 0.0
    state = torch.load(checkpoint, weights_only=False) if checkpoint is not None and checkpoint.is_file() else None
    if state is not None and state.get("signature") == signature:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, history, spent = state["step"], state["history"], state["seconds"]
        rng.bit_generator.state = state["rng"]
    bar = tqdm(total=cfg.steps, initial=step, desc=desc, disable=not progress, unit="step")
    t0 = time.perf_counter() - spent
    model.train()
    while step < cfg.steps:
        if cfg.max_seconds is not None and time.perf_counter() - t0 >= cfg.max_seconds:
            break
        elapsed = time.perf_counter() - t0
        time_frac = 0.0 if cfg.max_seconds is None else elapsed / cfg.max_seconds
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg, time_frac)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast):
            loss, metrics = loss_fn(rng)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", **{k: f"{v:.3f}" for k, v in metrics.items()})
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            history.append(_evaluate(model, eval_fn, step))
            bar.write(f"[{desc}] step {step}: {history[-1]}")
        if checkpoint is not None and cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            _save_checkpoint(checkpoint, model, opt, step, history, time.perf_counter() - t0, rng, signature)
    bar.close()
    seconds = time.perf_counter() - t0
    history.append(_evaluate(model, eval_fn, step))
    if checkpoint is not None:
        _save_checkpoint(checkpoint, model, opt, step, history, seconds, rng, signature)
    model.eval()
    return {"steps": step, "seconds": seconds, "positions": step * cfg.batch_size,
            "history": history, "final": history[-1]}


def _evaluate(model: torch.nn.Module, eval_fn, step: int) -> dict:
    model.eval()
    with torch.no_grad():
        out = {"step": step, **eval_fn()}
    model.train()
    return out
