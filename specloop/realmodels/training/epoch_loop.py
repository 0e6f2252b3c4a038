"""Epoch training in resumable pieces: the long draft-head runs on the target's own answers.

A run is ``epochs`` passes over a fixed list of items (EAGLE windows or Medusa / Hydra
anchors of a `recording_data.RecordingSplit`), each epoch in its own order: epoch e is
the permutation ``np.random.default_rng([seed, e])`` of the items, step i of the epoch
takes items ``perm[i B : (i + 1) B]`` (the last batch of an epoch may be shorter). The
order is a pure function of (seed, epoch, step), so the data position is the step.

The learning rate is a pure function of the step too (linear warm-up, cosine decay to
0.1 x over all the run's steps), so the "scheduler state" is the step. Every piece
(``checkpoint_every_steps`` steps or ``checkpoint_every_minutes`` minutes, whichever
comes first) the checkpoint -- head weights, AdamW state, step, epoch, data position,
the torch / numpy / python RNG states, seconds spent, the run's settings -- is written
to ``*.tmp``, fsynced and renamed over the old one. A ``budget_minutes`` session stops
at a piece boundary: before a step that would end past the budget (judged from the mean
step time so far) it writes the checkpoint and returns. Rerunning with the same settings
resumes from the checkpoint and, in float32 on one thread, reaches the weights of an
uninterrupted run bit for bit; other settings are refused in one line.
"""
from __future__ import annotations

import functools
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

__all__ = ["EpochPlan", "PieceSettings", "run_epochs", "read_checkpoint", "CHECKPOINT_NAME",
           "parse_checkpoint_every"]

CHECKPOINT_NAME = "resume-checkpoint.pt"


@dataclass(frozen=True)
class EpochPlan:
    """The data order of an epoch run.

    Attributes:
        items: items per epoch (windows or anchors). batch_size: items per step.
        epochs: passes over the items. seed: seeds each epoch's permutation.

    Raises:
        ValueError: a non-positive field.
    """

    items: int
    batch_size: int
    epochs: int
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.items, self.batch_size, self.epochs) < 1:
            raise ValueError(f"an epoch run needs items, batch_size and epochs >= 1: {self}")

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.items / self.batch_size)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def batch(self, step: int) -> np.ndarray:
        """int64 item indices of global step ``step`` (0-based)."""
        epoch, i = divmod(int(step), self.steps_per_epoch)
        return _permutation(self.items, self.seed, epoch)[i * self.batch_size:(i + 1) * self.batch_size]


@functools.lru_cache(maxsize=2)
def _permutation(items: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(items)


@dataclass(frozen=True)
class PieceSettings:
    """When to checkpoint and stop (none of these changes the result).

    Attributes:
        checkpoint_every_steps: steps per piece (0 = by time only).
        checkpoint_every_minutes: minutes per piece (0 = by steps only).
        budget_minutes: stop at the piece boundary before this many minutes of
            training in this session (None = run to the end).
    """

    checkpoint_every_steps: int = 0
    checkpoint_every_minutes: float = 10.0
    budget_minutes: float | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_every_steps < 0 or not self.checkpoint_every_minutes >= 0:
            raise ValueError(f"checkpoint intervals must be >= 0: {self}")
        if self.checkpoint_every_steps == 0 and self.checkpoint_every_minutes == 0:
            raise ValueError("checkpoint every 0 steps and 0 minutes: give one of them")
        if self.budget_minutes is not None and not self.budget_minutes > 0:
            raise ValueError(f"budget_minutes must be > 0, got {self.budget_minutes}")


def parse_checkpoint_every(text: str) -> tuple[int, float]:
    """``"500"`` -> (500 steps, 0 minutes); ``"10m"`` -> (0 steps, 10.0 minutes).

    Raises:
        ValueError: anything else, or a value <= 0."""
    text = str(text).strip().lower()
    try:
        value = float(text[:-1]) if text.endswith("m") else int(text)
    except ValueError:
        raise ValueError(f"--checkpoint-every {text!r}: give steps (500) or minutes (10m)") from None
    if not value > 0:
        raise ValueError(f"--checkpoint-every must be > 0, got {text!r}")
    return (0, float(value)) if text.endswith("m") else (int(value), 0.0)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0.1 x ``peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def read_checkpoint(path: Path) -> dict | None:
    """The checkpoint at ``path`` (None when there is none)."""
    path = Path(path)
    return torch.load(path, weights_only=False) if path.is_file() else None


def _check_signature(path: Path, state: dict, signature: dict) -> None:
    theirs = state.get("signature", {})
    differ = sorted(k for k in set(theirs) | set(signature) if theirs.get(k) != signature.get(k))
    if differ:
        shown = "; ".join(f"{k}: checkpoint {theirs.get(k)!r}, now {signature.get(k)!r}" for k in differ[:4])
        raise ValueError(f"{path} was written by a run with other settings ({shown}); rerun with its settings "
                         "or delete it to start over")


def _save(path: Path, model, opt, step: int, plan: EpochPlan, seconds: float, sessions: int,
          signature: dict) -> None:
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
             "epoch": step // plan.steps_per_epoch, "data_position": step % plan.steps_per_epoch,
             "scheduler": {"kind": "warmup-cosine", "step": step}, "total_steps": plan.total_steps,
             "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
             "seconds": seconds, "sessions": sessions, "signature": signature,
             "complete": step >= plan.total_steps}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def run_epochs(model: torch.nn.Module, params, step_fn: Callable[[np.ndarray], tuple[torch.Tensor, dict]],
               plan: EpochPlan, *, lr: float, warmup: int, checkpoint: Path, signature: dict,
               pieces: PieceSettings = PieceSettings(), weight_decay: float = 0.0, grad_clip: float = 1.0,
               autocast: bool = False, progress: bool = True, desc: str = "train") -> dict:
    """Train ``model`` in place for ``plan``, resuming from ``checkpoint`` if it exists.

    Args:
        model: the draft (its state is checkpointed). params: the tensors optimised (AdamW).
        step_fn: ``step_fn(item indices int64 (b,)) -> (scalar loss, float metrics)``.
        plan: `EpochPlan`. lr / warmup: peak rate and warm-up steps (`lr_at`).
        checkpoint: the checkpoint file. signature: JSON-able settings that decide the
            result (a checkpoint with others is refused).
        pieces: `PieceSettings`.

    Returns:
        dict: ``step`` (done), ``total_steps``, ``complete``, ``epochs_done`` (float),
        ``seconds`` (training seconds over all sessions), ``session_seconds``,
        ``session_steps``, ``sessions``, ``resumed_from`` (step).

    Raises:
        ValueError: a checkpoint written with another signature or plan.
    """
    from tqdm.auto import tqdm
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    signature = {**signature, "plan": [plan.items, plan.batch_size, plan.epochs, plan.seed]}
    step, spent, sessions = 0, 0.0, 0
    state = read_checkpoint(checkpoint)
    if state is not None:
        _check_signature(checkpoint, state, signature)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, spent, sessions = int(state["step"]), float(state["seconds"]), int(state["sessions"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
    start, sessions = step, sessions + 1
    bar = tqdm(total=plan.total_steps, initial=step, desc=desc, disable=not progress, unit="step")
    t0 = last_save = time.perf_counter()
    since_save = 0
    model.train()
    while step < plan.total_steps:
        now = time.perf_counter()
        if pieces.budget_minutes is not None and step > start:
            per_step = (now - t0) / (step - start)
            if now - t0 + per_step > 60.0 * pieces.budget_minutes:
                break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, plan.total_steps, lr, warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, metrics = step_fn(plan.batch(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        step, since_save = step + 1, since_save + 1
        bar.update(1)
        if step % 10 == 0 or step == plan.total_steps:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", epoch=f"{step / plan.steps_per_epoch:.2f}",
                            **{k: f"{v:.3f}" for k, v in metrics.items()})
        due = (pieces.checkpoint_every_steps and since_save >= pieces.checkpoint_every_steps) or \
              (pieces.checkpoint_every_minutes and time.perf_counter() - last_save >= 60 * pieces.checkpoint_every_minutes)
        if due and step < plan.total_steps:
            _save(checkpoint, model, opt, step, plan, spent + time.perf_counter() - t0, sessions, signature)
            last_save, since_save = time.perf_counter(), 0
    bar.close()
    session = time.perf_counter() - t0
    _save(checkpoint, model, opt, step, plan, spent + session, sessions, signature)
    model.eval()
    return {"step": step, "total_steps": plan.total_steps, "complete": step >= plan.total_steps,
            "epochs_done": step / plan.steps_per_epoch, "seconds": spent + session, "session_seconds": session,
            "session_steps": step - start, "sessions": sessions, "resumed_from": start}


#: `TrainConfig` fields that never change an epoch run's result (free to differ on resume)
NOT_IN_SIGNATURE = ("budget_minutes", "checkpoint_every_steps", "checkpoint_every_minutes", "eval_recordings",
                    "out_dir", "quick", "time_limit_s", "steps", "feature_root", "tokens", "dtype", "corpus_mix")
REPORT_NAME = "train_report.json"


def epoch_signature(config, module_config: dict, loss_config: dict | None = None) -> dict:
    """What must match for a checkpoint to resume: the `TrainConfig` fields that decide
    the result (not `NOT_IN_SIGNATURE`), the head's architecture and its loss settings."""
    values = {k: v for k, v in config.to_dict().items() if k not in NOT_IN_SIGNATURE}
    values["recordings"] = [str(Path(r).resolve()) for r in values.get("recordings", ())]
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    return {**values, "architecture": module_config,
            "loss": {k: v for k, v in (loss_config or {}).items() if not k.startswith("eval")}}


def pieces_of(config) -> PieceSettings:
    """The `PieceSettings` of a `TrainConfig`."""
    return PieceSettings(int(config.checkpoint_every_steps), float(config.checkpoint_every_minutes),
                         config.budget_minutes)


def write_train_report(folder: Path, report: dict) -> Path:
    """Write ``report`` as ``folder/train_report.json`` atomically; returns the path."""
    import json
    folder.mkdir(parents=True, exist_ok=True)
    path, tmp = folder / REPORT_NAME, folder / (REPORT_NAME + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, path)
    return path


def epoch_report(loop: dict, plan: EpochPlan, positions: int, kind: str) -> dict:
    """The training part of an epoch run's report: ``positions`` (label positions per
    epoch), ``items_per_epoch``, ``batch_size``, ``epochs``, ``epochs_done``, ``steps``,
    ``total_steps``, ``seconds``, ``sessions``, ``complete``, ``positions_trained``
    (label positions x epochs done) and ``positions_per_s``."""
    trained = int(round(loop["epochs_done"] * positions))
    return {"kind": kind, "positions": int(positions), "items_per_epoch": plan.items, "batch_size": plan.batch_size,
            "epochs": plan.epochs, "epochs_done": loop["epochs_done"], "steps": loop["step"],
            "total_steps": loop["total_steps"], "seconds": loop["seconds"], "sessions": loop["sessions"],
            "complete": loop["complete"], "positions_trained": trained,
            "positions_per_s": trained / loop["seconds"] if loop["seconds"] else None,
            "session_seconds": loop["session_seconds"], "session_steps": loop["session_steps"],
            "resumed_from_step": loop["resumed_from"]}
