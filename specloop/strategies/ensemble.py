"""Online ensembles of draft parameters: the Hedge ensemble of OnlineSpec Sec. 3.3
(Ens-EAGLE; proof of Corollary 3, App. D.5) and the optimism + ensemble combination
of App. C.3 (Sword++-style, Zhao et al. 2024).

N base learners run OGD (or optimistic OGD) with geometrically spaced learning rates
eta_i = 2^{i-1} eta_1, N = ceil(1/2 log2(1 + T)) + 1; a Hedge meta learner weights
them by p^i proportional to exp(-epsilon * sum_{s<t} f_s(w_s^i)); the played
parameters are the weighted average w_t = sum_i p_t^i w_t^i (a convex combination,
so it stays in the L2 ball).

Losses and gradients of the base learners: pass ``oracle`` to ``step`` --
``oracle(params) -> (loss, grads)`` evaluates f_t and grad f_t at any parameter
list -- to use the true f_t(w_t^i) and grad f_t(w_t^i) exactly as in the paper (N
evaluations per round). Without an oracle the ensemble uses the linearised surrogate
loss l_t(w) = <grad f_t(w_t), w> of Ader / Sword++ (Zhang et al. 2018; Zhao et al.
2024): every base learner gets the played point's gradient and the meta learner the
surrogate losses <grad f_t(w_t), w_t^i>, which keeps one gradient per round and the
same dynamic-regret guarantee for convex f_t.

``base_losses`` chooses between the two: "exact" (the default) uses the oracle when one
is given (and the surrogate without one, as before), "linearised" always uses the
surrogate, so a round costs one gradient whatever N is. With "exact" and an oracle the
played point's gradient is not used at all (the base learners see their own gradients);
the learner declares it (``uses_played_gradient``) so an engine can skip computing it.
An oracle may also offer ``oracle.many(points) -> (losses, grads_per_point)``, f_t and
grad f_t at several parameter lists in one call (an engine that stacks the base learners'
weights on a leading axis); the ensemble then makes one such call per round instead of N.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from specloop.strategies import _arrays as A
from specloop.strategies._state import check_state_keys, make_rng, rng_state, set_rng_state
from specloop.strategies.ogd import OGD, Oracle, OptimisticOGD

__all__ = ["HedgeEnsemble", "OptimisticEnsemble", "geometric_learning_rates",
           "default_num_learners", "BASE_LOSSES"]

#: how an ensemble's base learners and meta learner get f_t (module docstring)
BASE_LOSSES = ("exact", "linearised")


def default_num_learners(horizon: int) -> int:
    """N = ceil(1/2 log2(1 + T)) + 1 (OnlineSpec App. D.5). Raises ValueError if T < 1."""
    if int(horizon) < 1:
        raise ValueError(f"horizon T must be >= 1 round, got {horizon}")
    return int(math.ceil(0.5 * math.log2(1 + int(horizon)))) + 1


def geometric_learning_rates(lr_min: float, num_learners: int | None = None,
                             horizon: int | None = None) -> list[float]:
    """eta_i = 2^{i-1} * lr_min, i = 1..N (App. D.5 uses lr_min = D / (G sqrt(T))).

    N is ``num_learners`` or, if None, `default_num_learners(horizon)`.
    Raises ValueError for lr_min <= 0 or when neither N nor T is given.
    """
    if not (math.isfinite(float(lr_min)) and lr_min > 0):
        raise ValueError(f"lr_min must be positive and finite, got {lr_min}")
    if num_learners is None:
        if horizon is None:
            raise ValueError("give num_learners or horizon (to set N = ceil(log2(1+T)/2)+1)")
        num_learners = default_num_learners(horizon)
    if int(num_learners) < 1:
        raise ValueError(f"num_learners must be >= 1, got {num_learners}")
    return [float(lr_min) * 2.0 ** i for i in range(int(num_learners))]


def _softmax_neg(scores: np.ndarray, meta_lr: float) -> np.ndarray:
    z = -meta_lr * (scores - scores.min())
    w = np.exp(z - z.max())
    return w / w.sum()


class HedgeEnsemble:
    """Hedge over N projected-OGD base learners with geometric learning rates,
    combined by weighted parameter averaging (OnlineSpec Sec. 3.3, App. D.5).

    Args:
        learning_rates: eta_i of the base learners (e.g. `geometric_learning_rates`).
        radius: D of the feasible ball shared by all base learners (None = R^d).
        meta_lr: epsilon > 0 of the meta learner (the paper's experiments use 10 on
            training losses; theory: epsilon ~ sqrt(ln N / T) / loss range).
        seed: seed of the learner's generator (nothing is drawn).
        base_losses: "exact" (f_t and grad f_t at each base learner's point through the
            oracle, N evaluations a round; the surrogate when no oracle is given) or
            "linearised" (the surrogate <grad f_t(w_t), w> always, one gradient a round;
            Ader / Sword++).

    `step(params, grads, loss, oracle=None)` returns the combined w_{t+1}; see the
    module docstring for ``oracle``. Attributes: ``weights`` (N,) float64 meta
    weights p_{t+1}; ``cumulative_loss`` (N,) float64.

    Raises:
        ValueError: empty/non-positive learning rates, meta_lr <= 0, an unknown
            base_losses, an oracle that returns gradients of the wrong structure or a
            non-finite loss.
    """

    _base_cls = OGD
    #: learns from the played point's gradient (and the oracle) every round
    feedback = "played"

    def __init__(self, learning_rates: Sequence[float], radius: float | None = None,
                 meta_lr: float = 1.0, seed: int | None = None, base_losses: str = "exact"):
        rates = [float(r) for r in learning_rates]
        if base_losses not in BASE_LOSSES:
            raise ValueError(f"base_losses must be one of {BASE_LOSSES}, got {base_losses!r}")
        self.base_losses = base_losses
        if not rates:
            raise ValueError("an ensemble needs at least one base learning rate")
        if not (math.isfinite(float(meta_lr)) and meta_lr > 0):
            raise ValueError(f"meta_lr epsilon must be positive and finite, got {meta_lr}")
        self.meta_lr = float(meta_lr)
        self.radius = radius
        self.seed = seed
        self._rng = make_rng(seed)
        self.bases = [self._make_base(r, radius) for r in rates]
        self.cumulative_loss = np.zeros(len(rates))
        self.last_losses = np.zeros(len(rates))
        self._points: list | None = None
        self.t = 0

    def _make_base(self, lr: float, radius: float | None):
        return OGD(lr, radius)

    @property
    def learning_rates(self) -> list[float]:
        return [b.lr for b in self.bases]

    @property
    def uses_played_gradient(self) -> bool:
        """Whether ``step`` reads the played point's gradient when given an oracle:
        only the linearised surrogate does ("exact" evaluates every base point itself)."""
        return self.base_losses == "linearised"

    @property
    def weights(self) -> np.ndarray:
        """Meta weights p_{t+1}^i proportional to exp(-epsilon * L_t^i)."""
        return _softmax_neg(self.cumulative_loss, self.meta_lr)

    def _base_feedback(self, points, params, grads, oracle) -> tuple[np.ndarray, list]:
        if oracle is None or self.base_losses == "linearised":
            return np.array([A.inner(grads, p) for p in points]), [grads] * len(points)
        many = getattr(oracle, "many", None)
        if callable(many):
            got_losses, got_grads = many([A.copy_list(p) for p in points])
            if len(got_losses) != len(points) or len(got_grads) != len(points):
                raise ValueError(f"oracle.many returned {len(got_losses)} losses and {len(got_grads)} "
                                 f"gradients for {len(points)} points")
            pairs = list(zip(got_losses, got_grads))
        else:
            pairs = [oracle(A.copy_list(p)) for p in points]
        losses, base_grads = [], []
        for p, (loss_i, grads_i) in zip(points, pairs):
            A.check_pair(p, grads_i)
            losses.append(A.check_loss(loss_i, required=True))
            base_grads.append(grads_i)
        return np.array(losses), base_grads

    def step(self, params: Sequence[Any], grads: Sequence[Any], loss: float = math.nan,
             oracle: Oracle | None = None) -> list[Any]:
        """Update every base learner and the meta weights; return sum_i p^i w^i."""
        A.check_pair(params, grads)
        A.check_loss(loss, required=False)
        if self._points is None:
            self._points = [A.copy_list(params) for _ in self.bases]
        points = [A.from_numpy_or_same(p, params) for p in self._points]
        losses, base_grads = self._base_feedback(points, params, grads, oracle)
        self.cumulative_loss = self.cumulative_loss + losses
        self.last_losses = losses
        self._points = [b._update(p, g) for b, p, g in zip(self.bases, points, base_grads)]
        self.t += 1
        return A.weighted_sum(self._points, self.weights)

    def state_dict(self) -> dict:
        return {"class": type(self).__name__, "meta_lr": self.meta_lr, "radius": self.radius,
                "base_losses": self.base_losses, "t": self.t, "bases": [b.state_dict() for b in self.bases],
                "cumulative_loss": self.cumulative_loss.copy(),
                "last_losses": self.last_losses.copy(),
                "points": None if self._points is None else [A.to_numpy_list(p) for p in self._points],
                "rng": rng_state(self._rng)}

    def load_state_dict(self, state: dict) -> None:
        check_state_keys(state, {"meta_lr", "radius", "t", "bases", "cumulative_loss",
                                 "last_losses", "points", "rng"}, type(self).__name__)
        if state.get("base_losses", "exact") != self.base_losses:
            raise ValueError(f"state is of an ensemble with {state.get('base_losses', 'exact')!r} base losses, "
                             f"this one uses {self.base_losses!r}")
        if len(state["bases"]) != len(self.bases):
            raise ValueError(f"state has {len(state['bases'])} base learners, this ensemble "
                             f"has {len(self.bases)}")
        self.meta_lr, self.radius, self.t = float(state["meta_lr"]), state["radius"], int(state["t"])
        for base, base_state in zip(self.bases, state["bases"]):
            base.load_state_dict(base_state)
        self.cumulative_loss = np.array(state["cumulative_loss"], dtype=np.float64)
        self.last_losses = np.array(state["last_losses"], dtype=np.float64)
        self._points = None if state["points"] is None else [A.to_numpy_list(p) for p in state["points"]]
        set_rng_state(self._rng, state["rng"])


class OptimisticEnsemble(HedgeEnsemble):
    """Optimism + ensemble (OnlineSpec App. C.3; Sword++, Zhao et al. 2024): base
    learners are `OptimisticOGD` (Eq. 3, last gradient as hint) with geometric
    learning rates, and the meta learner is optimistic Hedge with the last loss
    vector as its hint m_{t+1} = l_t::

        p_{t+1}^i proportional to exp(-epsilon * (L_t^i + l_t^i)),  L_t = sum_{s<=t} l_s.

    Args: as `HedgeEnsemble`, plus ``adaptive`` and ``hint_scale`` (self-tuned base
    step sizes, see `OptimisticOGD`). Without an oracle the base learners see the played point's
    gradient and the meta learner the surrogate losses <grad f_t(w_t), w_t^i>, as in
    Sword++ (one gradient per round).
    """

    def __init__(self, learning_rates: Sequence[float], radius: float | None = None,
                 meta_lr: float = 1.0, adaptive: bool = False, hint_scale: float = 1.0,
                 seed: int | None = None, base_losses: str = "exact"):
        self.adaptive = bool(adaptive)
        self.hint_scale = float(hint_scale)
        super().__init__(learning_rates, radius, meta_lr, seed, base_losses)

    def _make_base(self, lr: float, radius: float | None):
        return OptimisticOGD(lr, radius, adaptive=self.adaptive, hint_scale=self.hint_scale)

    @property
    def weights(self) -> np.ndarray:
        """Optimistic Hedge weights using the last loss vector as the hint."""
        return _softmax_neg(self.cumulative_loss + self.last_losses, self.meta_lr)
