"""The learner factory of online adaptation in the real decoder: the registry's
learners (`specloop.strategies.registry`) tuned as OnlineSpec App. B runs them, and their
default step sizes.

Names: ``ogd``, ``optimistic``, ``ensemble``, ``optimistic-ensemble``, ``osd`` (the
registry's), with today's short names ``opt``, ``ens``, ``opt-ens`` as aliases.
"""
from __future__ import annotations

from specloop.strategies.registry import LEARNER_NAMES, PRECONDITIONERS
from specloop.strategies.registry import learner_from_name

__all__ = ["head_learner", "LEARNER_KINDS", "PRECONDITIONERS", "DEFAULT_LR"]

#: the learner names an `OnlineConfig` accepts (aliases resolve to these)
LEARNER_KINDS = LEARNER_NAMES

#: default step size per learner, from a probe on SmolLM2-135M's Hydra heads: plain OGD
#: at 0.05 diverged (NaN draft logits), 1e-3..3e-3 lowered the in-stream loss fastest
#: without raising the loss on later prompts
DEFAULT_LR = {"ogd": 2e-3, "optimistic": 2e-3, "ensemble": 1e-3, "optimistic-ensemble": 1e-3, "osd": 3e-4}


def head_learner(kind: str, lr: float, *, num_learners: int = 3, meta_lr: float = 10.0,
                 osd_update_every: int = 8, osd_epochs: int = 1, seed: int = 0,
                 precondition: str = "none", rms_decay: float = 0.95, ensemble_losses: str = "exact"):
    """A learner of `specloop.strategies` for the draft's parameters (torch tensors).

    Args:
        kind: a registered name or alias: "ogd" (projected OGD), "optimistic" / "opt"
            (optimistic OGD, Eq. 3), "ensemble" / "ens" (Hedge ensemble, N base learners
            with geometric rates lr * 2^i, App. B: N=3, epsilon=10),
            "optimistic-ensemble" / "opt-ens" (optimism + ensemble, App. C.3), "osd" (OSD
            distillation with Adam, every ``osd_update_every`` rounds).
        lr: base step size (smallest rate of an ensemble).
        precondition: "none" or "rms" (the `Preconditioned` wrapper, decay ``rms_decay``).
        ensemble_losses: "exact" or "linearised" base losses of the ensembles
            (`specloop.strategies.ensemble`).

    Raises:
        ValueError: unknown kind (the message lists the names) or bad hyper-parameters.
    """
    return learner_from_name(kind, lr, seed=seed, num_learners=num_learners, meta_lr=meta_lr,
                             update_every=osd_update_every, inner_epochs=osd_epochs, batch_size=1,
                             optimizer="adam", max_buffer=4096, precondition=precondition,
                             rms_decay=rms_decay, ensemble_losses=ensemble_losses)
