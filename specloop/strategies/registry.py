"""The one registry of online learners: one set of names for the simulator, the real
decoder, the stream runner and every CLI (OnlineSpec Sec. 3; OSD, Liu et al. 2024).

* ``ogd``: `OGD`, projected OGD (Sec. 3.1, Online-LR);
* ``optimistic`` (alias ``opt``): `OptimisticOGD`, Eq. (3) (Sec. 3.2, Opt-Hydra);
* ``ensemble`` (alias ``ens``): `HedgeEnsemble` (Sec. 3.3, Ens-EAGLE);
* ``optimistic-ensemble`` (aliases ``optens``, ``opt-ens``): `OptimisticEnsemble` (App. C.3);
* ``osd``: `OSDDistillation`, distillation on rejected positions (Liu et al. 2024).

`resolve_learner` maps a name or alias (case-insensitive, ``_`` = ``-``) to its
canonical name; `learner_from_name` builds one, optionally wrapped in the RMS
preconditioner (`specloop.strategies.precondition.Preconditioned`, ``precondition="rms"``).

Feedback (the learners' optional ``feedback`` attribute, `FEEDBACK_KINDS`): every learner
declares what it learns from, and engines read that instead of asking for a learner by
name (`learner_feedback`, `learns_from_round`):

* ``"played"``: ``step(params, grads, loss, oracle)`` learns from the gradient of f_t at the
  played point (and, for ensembles, the round's oracle) in every round;
* ``"rejections"`` (OSD): ``step`` ignores ``grads`` and ``loss`` (an engine may pass zeros
  and NaN and skip computing them); the learner keeps a buffer of rounds in which
  verification rejected a draft token, which the engine hands over once each through
  ``add_feedback(context, p_target)`` or ``add_feedback(oracle=fn)``; ``buffered`` counts
  those not yet distilled; ``step`` is still called every round and distils when due.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specloop.strategies.ensemble import BASE_LOSSES as ENSEMBLE_LOSSES
from specloop.strategies.ensemble import HedgeEnsemble, OptimisticEnsemble, geometric_learning_rates
from specloop.strategies.ogd import OGD, OptimisticOGD
from specloop.strategies.osd import OSDDistillation
from specloop.strategies.precondition import PRECONDITIONERS, Preconditioned

__all__ = ["LearnerSpec", "LEARNER_SPECS", "LEARNER_NAMES", "LEARNER_ALIASES", "FEEDBACK_KINDS",
           "PRECONDITIONERS", "resolve_learner", "learner_spec", "learner_from_name", "learner_feedback",
           "learns_from_round", "uses_played_gradient", "ENSEMBLE_LOSSES"]

#: what a learner learns from (its ``feedback`` attribute; see the module docstring)
FEEDBACK_KINDS = ("played", "rejections")


@dataclass(frozen=True)
class LearnerSpec:
    """One registered learner.

    Attributes:
        name: canonical name (lower case, e.g. "optimistic").
        cls: the learner class of `specloop.strategies`.
        aliases: other accepted names (today's short CLI names, e.g. "opt").
        short: the prefix of the stream's method names ("opt" in "opt-hydra").
        label: the paper's prefix of its Table 1 rows ("Opt" in "Opt-Hydra").
        summary: one line: what it is and where it comes from.
    """

    name: str
    cls: type
    aliases: tuple[str, ...]
    short: str
    label: str
    summary: str


LEARNER_SPECS: tuple[LearnerSpec, ...] = (
    LearnerSpec("ogd", OGD, (), "ogd", "OGD", "projected online gradient descent (OnlineSpec Sec. 3.1)"),
    LearnerSpec("optimistic", OptimisticOGD, ("opt",), "opt", "Opt",
                "optimistic OGD with the last gradient as hint (OnlineSpec Eq. 3, Sec. 3.2)"),
    LearnerSpec("ensemble", HedgeEnsemble, ("ens",), "ens", "Ens",
                "Hedge ensemble of OGD learners with geometric rates (OnlineSpec Sec. 3.3)"),
    LearnerSpec("optimistic-ensemble", OptimisticEnsemble, ("optens", "opt-ens"), "optens", "OptEns",
                "optimistic base learners + optimistic Hedge (OnlineSpec App. C.3)"),
    LearnerSpec("osd", OSDDistillation, (), "osd", "OSD",
                "distillation on rejected positions (OSD, Liu et al. 2024)"),
)

#: canonical names, in table order
LEARNER_NAMES: tuple[str, ...] = tuple(s.name for s in LEARNER_SPECS)
#: alias -> canonical name
LEARNER_ALIASES: dict[str, str] = {a: s.name for s in LEARNER_SPECS for a in s.aliases}
_BY_NAME = {s.name: s for s in LEARNER_SPECS}


def _known() -> str:
    aliases = ", ".join(f"{a} = {n}" for a, n in LEARNER_ALIASES.items())
    return f"{', '.join(LEARNER_NAMES)} (aliases: {aliases})"


def resolve_learner(name: str) -> str:
    """The canonical name of a learner name or alias (case-insensitive, "_" = "-").

    Raises:
        ValueError: an unknown name; the message lists the names and aliases.
    """
    if not isinstance(name, str):
        raise ValueError(f"a learner name must be a string, got {type(name).__name__}; choose from {_known()}")
    key = name.strip().lower().replace("_", "-")
    key = LEARNER_ALIASES.get(key, key)
    if key not in _BY_NAME:
        raise ValueError(f"unknown learner {name!r}; choose from {_known()}")
    return key


def learner_spec(name: str) -> LearnerSpec:
    """The `LearnerSpec` of a name or alias (ValueError as `resolve_learner`)."""
    return _BY_NAME[resolve_learner(name)]


def learner_from_name(name: str, lr: float, *, radius: float | None = None, seed: int | None = None,
                      adaptive: bool = False, hint_scale: float = 1.0,
                      num_learners: int = 3, meta_lr: float = 1.0,
                      update_every: int = 8, inner_epochs: int = 1, batch_size: int = 1,
                      optimizer: str = "sgd", max_buffer: int = 4096, loss_and_grad: Any = None,
                      precondition: str = "none", rms_decay: float = 0.95,
                      ensemble_losses: str = "exact"):
    """Build a registered learner (each engine chooses the tuning; see its factory).

    Args:
        name: a name or alias of `LEARNER_SPECS`.
        lr: step size eta > 0 (an ensemble's smallest base rate; its base rates are
            ``geometric_learning_rates(lr, num_learners)`` = lr * 2^i).
        radius: D of the feasible L2 ball (None = unconstrained), every learner.
        seed: the learner's generator seed, every learner.
        adaptive, hint_scale: self-tuned step sizes of the optimistic learners
            ("optimistic", "optimistic-ensemble"; see `OptimisticOGD`).
        num_learners, meta_lr: N and epsilon of the ensembles (App. B: 3 and 10).
        ensemble_losses: the ensembles' ``base_losses``, "exact" (the paper: each base
            learner's own f_t and gradient) or "linearised" (one gradient a round).
        update_every, inner_epochs, batch_size, optimizer, max_buffer, loss_and_grad:
            "osd" only (see `OSDDistillation`).
        precondition: "none" or "rms" (wrap in `Preconditioned` with decay ``rms_decay``).

    Raises:
        ValueError: an unknown name or preconditioner, or bad hyper-parameters.
    """
    name = resolve_learner(name)
    if precondition not in PRECONDITIONERS:
        raise ValueError(f"precondition must be one of {PRECONDITIONERS}, got {precondition!r}")
    if name == "ogd":
        learner = OGD(lr, radius, seed=seed)
    elif name == "optimistic":
        learner = OptimisticOGD(lr, radius, adaptive=adaptive, hint_scale=hint_scale, seed=seed)
    elif name == "ensemble":
        learner = HedgeEnsemble(geometric_learning_rates(lr, num_learners), radius, meta_lr, seed=seed,
                                base_losses=ensemble_losses)
    elif name == "optimistic-ensemble":
        learner = OptimisticEnsemble(geometric_learning_rates(lr, num_learners), radius, meta_lr,
                                     adaptive=adaptive, hint_scale=hint_scale, seed=seed,
                                     base_losses=ensemble_losses)
    else:
        learner = OSDDistillation(lr, update_every=update_every, inner_epochs=inner_epochs,
                                  batch_size=batch_size, optimizer=optimizer, radius=radius,
                                  max_buffer=max_buffer, loss_and_grad=loss_and_grad, seed=seed)
    if precondition == "rms":
        learner = Preconditioned(learner, decay=rms_decay)
    return learner


def learner_feedback(learner: Any) -> str:
    """What ``learner`` learns from: its ``feedback`` attribute ("played" if absent).

    Raises:
        ValueError: a ``feedback`` outside `FEEDBACK_KINDS`.
    """
    kind = getattr(learner, "feedback", "played")
    if kind not in FEEDBACK_KINDS:
        raise ValueError(f"{type(learner).__name__}.feedback must be one of {FEEDBACK_KINDS}, got {kind!r}")
    return kind


def uses_played_gradient(learner: Any) -> bool:
    """Whether ``learner.step`` reads the played point's gradient (its
    ``uses_played_gradient`` attribute; True if absent, False for "rejections"
    learners). An exact ensemble given an oracle does not, so an engine can compute
    the played point's loss alone."""
    if learner_feedback(learner) != "played":
        return False
    return bool(getattr(learner, "uses_played_gradient", True))


def learns_from_round(learner: Any, rejected: bool) -> bool:
    """Whether a round's feedback goes to ``learner``: every round for "played" learners,
    only rounds in which verification rejected a draft token for "rejections" (OSD)."""
    return learner_feedback(learner) == "played" or bool(rejected)
