"""`OnlineConfig`: the settings of online adaptation in the real decoder
(`specloop.realmodels.online`; OnlineSpec App. B)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from specloop.realmodels.online.learners import DEFAULT_LR, PRECONDITIONERS
from specloop.strategies.registry import ENSEMBLE_LOSSES, resolve_learner

__all__ = ["OnlineConfig"]


@dataclass(frozen=True)
class OnlineConfig:
    """Online-adaptation settings.

    Attributes:
        learner: a learner name of `specloop.strategies.registry` ("ogd",
            "optimistic", "ensemble", "optimistic-ensemble", "osd") or an alias ("opt",
            "ens", "opt-ens"); stored as the canonical name.
        lr: base step size (None = `DEFAULT_LR` of the learner).
        mode: "round" (micro-updates from the replay buffer) or "chunk" (update at
            `end_chunk`, ``epochs`` passes).
        update_every: rounds between micro-updates (round mode), >= 1.
        batch_size: samples per learner step, >= 1.
        buffer_size: replay-buffer capacity (samples), >= 1.
        epochs: passes over a chunk's samples (chunk mode), >= 1.
        num_learners, meta_lr: ensemble N and epsilon (App. B: 3 and 10).
        background: run updates on a worker thread (App. B.2). The worker trains a
            private copy of the draft's parameters (`online.workspace`) and never writes
            what the decoder reads; the decoder copies the newest trained values into
            the draft between rounds (lossless and race-free by construction).
        publish_every: background mode: learner steps between publications of the
            trained copy to the decoder (>= 1; the rest are published when the adapter
            waits: chunk ends, checkpoints, close).
        top_m: target tokens kept per verified position.
        osd_interval: OSD distils every this many learner steps (round mode;
            chunk mode distils every step, i.e. every mini-batch).
        precondition: "none" (the learner sees raw gradients) or "rms" (adaptive
            OGD, the `specloop.strategies.precondition.Preconditioned` wrapper: every
            gradient the learner sees -- played point and oracle points -- is divided
            elementwise by sqrt(v) + 1e-8, v the bias-corrected running mean of squared
            played-point gradients with decay ``rms_decay``; RMSProp / Adam's
            second-moment scaling without momentum, so ``lr`` is the per-element step,
            the paper's EAGLE / EAGLE-3 set-up uses Adam at 3e-5..4e-4, App. B.10).
        rms_decay: beta_2 of the running mean, in (0, 1).
        ensemble_losses: how an ensemble's base learners get f_t
            (`specloop.strategies.ensemble`): "exact" (each base learner's own loss and
            gradient, N evaluations a round, the paper) or "linearised" (the Ader /
            Sword++ surrogate from the played point's gradient, one evaluation a round).
        stacked_oracle: evaluate an exact ensemble's N base learners in one call, their
            weights stacked on a leading axis (`torch.func.vmap`); the same numbers, faster
            on an accelerator, slower on a CPU at one thread (`online.functional`).
        seed: seeds the replay sampling and the learner.
    """

    learner: str = "ogd"
    lr: float | None = None
    mode: str = "round"
    update_every: int = 1
    batch_size: int = 4
    buffer_size: int = 256
    epochs: int = 2
    num_learners: int = 3
    meta_lr: float = 10.0
    background: bool = False
    publish_every: int = 1
    top_m: int = 32
    osd_interval: int = 8
    precondition: str = "none"
    rms_decay: float = 0.95
    ensemble_losses: str = "exact"
    stacked_oracle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "learner", resolve_learner(self.learner))   # ValueError lists the names
        if self.mode not in ("round", "chunk"):
            raise ValueError(f"mode must be 'round' or 'chunk', got {self.mode!r}")
        for name in ("update_every", "batch_size", "buffer_size", "epochs", "num_learners", "top_m", "osd_interval",
                     "publish_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"OnlineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.precondition not in PRECONDITIONERS:
            raise ValueError(f"precondition must be one of {PRECONDITIONERS}, got {self.precondition!r}")
        if self.ensemble_losses not in ENSEMBLE_LOSSES:
            raise ValueError(f"ensemble_losses must be one of {ENSEMBLE_LOSSES}, got {self.ensemble_losses!r}")
        if not (0.0 < float(self.rms_decay) < 1.0):
            raise ValueError(f"rms_decay must be in (0, 1), got {self.rms_decay}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")

    @property
    def step_size(self) -> float:
        return float(self.lr if self.lr is not None else DEFAULT_LR[self.learner])
