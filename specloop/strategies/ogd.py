"""Online gradient descent learners: projected OGD (OnlineSpec Sec. 3.1) and
optimistic OGD (OnlineSpec Sec. 3.2, Eq. 3).

Both update a *list* of parameter arrays (NumPy or torch; written against the array
API through `array_api_compat`), project onto the L2 ball ``||w||_2 <= radius``
(joint norm over the list, OnlineSpec Assumption 2) and never mutate their inputs.

Contract (`specloop.strategies.base.OnlineLearner`): ``step(params, grads, loss,
oracle=None)``: ``params`` are the parameters w_t that were *played* in round t (the
ones this learner last returned, or the initial ones), ``grads`` is
grad f_t(w_t) with the same shapes, ``loss`` is f_t(w_t) (may be NaN for these
two learners). Returns w_{t+1}, the parameters to play next round, as new arrays in
the namespace, dtype and device of ``params``. ``oracle`` is accepted for a uniform
interface and ignored here.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from specloop.strategies import _arrays as A
from specloop.strategies._state import check_state_keys, make_rng, rng_state, set_rng_state

__all__ = ["OGD", "OptimisticOGD", "Oracle"]

#: ``oracle(params) -> (loss, grads)``: f_t and grad f_t at arbitrary parameters
#: (same list structure as ``params``). Supplied by the engine for learners that
#: need losses/gradients at points other than the played one (ensembles, OSD).
Oracle = Callable[[list], tuple[float, list]]


def _check_lr(lr: float) -> float:
    value = float(lr)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"learning rate must be a positive finite number, got {lr}")
    return value


def _check_radius(radius: float | None) -> float | None:
    if radius is None:
        return None
    value = float(radius)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"radius D must be a positive finite number or None, got {radius}")
    return value


class OGD:
    """Projected online gradient descent (Zinkevich 2003; OnlineSpec Sec. 3.1):
    ``w_{t+1} = Pi_W[w_t - lr * grad f_t(w_t)]``.

    Corollary 1 tunes ``lr = D / (G sqrt(T))`` for Reg_T = O(sqrt(T)(1 + P_T)).

    Args:
        lr: step size eta > 0 (units of parameters per unit gradient).
        radius: D, radius of the feasible L2 ball (None = unconstrained).
        seed: seed of the learner's own generator (OGD draws nothing; kept for
            the uniform interface).

    Raises:
        ValueError: non-positive lr or radius; mismatched/non-finite params, grads.
    """

    #: learns from the played point's gradient every round (`specloop.strategies.registry`)
    feedback = "played"

    def __init__(self, lr: float, radius: float | None = None, seed: int | None = None):
        self.lr = _check_lr(lr)
        self.radius = _check_radius(radius)
        self.seed = seed
        self._rng = make_rng(seed)
        self.t = 0

    def step(self, params: Sequence[Any], grads: Sequence[Any], loss: float = math.nan,
             oracle: Oracle | None = None) -> list[Any]:
        """One OGD update; returns w_{t+1} (new arrays). See module docstring."""
        A.check_pair(params, grads)
        A.check_loss(loss, required=False)
        return self._update(params, grads)

    def _update(self, params: Sequence[Any], grads: Sequence[Any]) -> list[Any]:
        """The update without input validation (callers have validated)."""
        self.t += 1
        return A.project_ball(A.add_scaled(params, grads, -self.lr), self.radius, copy=False)

    def state_dict(self) -> dict:
        return {"class": type(self).__name__, "lr": self.lr, "radius": self.radius,
                "t": self.t, "rng": rng_state(self._rng)}

    def load_state_dict(self, state: dict) -> None:
        check_state_keys(state, {"lr", "radius", "t", "rng"}, type(self).__name__)
        self.lr, self.radius, self.t = float(state["lr"]), state["radius"], int(state["t"])
        set_rng_state(self._rng, state["rng"])


class OptimisticOGD:
    """Optimistic online gradient descent, the two-step update of OnlineSpec Eq. (3)
    (Rakhlin & Sridharan 2013) with the last gradient as the hint (Sec. 3.2)::

        w_t       = Pi_W[w_hat_t - eta_t * h_t]          (played point)
        w_hat_t+1 = Pi_W[w_hat_t - eta_t * grad f_t(w_t)]
        h_{t+1}   = grad f_t(w_t)

    with w_hat_1 = w_1 = the first ``params`` seen and h_1 = 0. Corollary 2:
    Reg_T = O(sqrt(1 + delta_T)(1 + P_T)) with delta_T = sum_t ||h_t - grad f_t(w_t)||^2
    when eta = D / sqrt(1 + delta_T). ``adaptive=True`` uses the self-tuned
    ``eta_t = lr / sqrt(1 + delta_{t-1} / hint_scale^2)`` (delta observed so far),
    which realises that tuning without knowing delta_T in advance: ``lr = D`` and
    ``hint_scale = 1`` is the paper's form; ``lr = D / G`` and ``hint_scale = G``
    (gradient bound) is its scale-consistent version eta = D / sqrt(G^2 + delta).

    Args:
        lr: base step size eta > 0.
        radius: D (None = unconstrained).
        adaptive: use the self-tuned eta_t above instead of a constant lr.
        hint_scale: G > 0 in the adaptive step size (gradient units).
        seed: seed of the learner's generator (nothing is drawn).

    Attributes:
        hint_error: delta observed so far, sum_s ||h_s - grad f_s(w_s)||^2.
    """

    #: learns from the played point's gradient every round (`specloop.strategies.registry`)
    feedback = "played"

    def __init__(self, lr: float, radius: float | None = None, adaptive: bool = False,
                 hint_scale: float = 1.0, seed: int | None = None):
        self.lr = _check_lr(lr)
        self.hint_scale = _check_lr(hint_scale)
        self.radius = _check_radius(radius)
        self.adaptive = bool(adaptive)
        self.seed = seed
        self._rng = make_rng(seed)
        self.t = 0
        self.hint_error = 0.0
        self._w_hat: list | None = None
        self._hint: list | None = None

    def _eta(self) -> float:
        if not self.adaptive:
            return self.lr
        return self.lr / math.sqrt(1.0 + self.hint_error / self.hint_scale ** 2)

    def step(self, params: Sequence[Any], grads: Sequence[Any], loss: float = math.nan,
             oracle: Oracle | None = None) -> list[Any]:
        """Eq. (3): returns the next played point w_{t+1} (new arrays)."""
        A.check_pair(params, grads)
        A.check_loss(loss, required=False)
        return self._update(params, grads)

    def _update(self, params: Sequence[Any], grads: Sequence[Any]) -> list[Any]:
        """Eq. (3) without input validation (callers have validated)."""
        w_hat = A.copy_list(params) if self._w_hat is None else A.from_numpy_or_same(self._w_hat, params)
        hint = None if self._hint is None else A.from_numpy_or_same(self._hint, params)
        eta_t = self._eta()
        self.hint_error += (A.joint_norm(grads) ** 2 if hint is None
                            else A.joint_sq_dist(hint, grads))
        w_hat = A.project_ball(A.add_scaled(w_hat, grads, -eta_t), self.radius, copy=False)
        self._w_hat, self._hint = w_hat, A.copy_list(grads)
        self.t += 1
        return A.project_ball(A.add_scaled(w_hat, self._hint, -self._eta()), self.radius, copy=False)

    def state_dict(self) -> dict:
        return {"class": type(self).__name__, "lr": self.lr, "radius": self.radius,
                "adaptive": self.adaptive, "hint_scale": self.hint_scale, "t": self.t, "hint_error": self.hint_error,
                "w_hat": A.to_numpy_list(self._w_hat), "hint": A.to_numpy_list(self._hint),
                "rng": rng_state(self._rng)}

    def load_state_dict(self, state: dict) -> None:
        check_state_keys(state, {"lr", "radius", "adaptive", "hint_scale", "t", "hint_error", "w_hat",
                                 "hint", "rng"}, type(self).__name__)
        self.lr, self.radius = float(state["lr"]), state["radius"]
        self.adaptive, self.t = bool(state["adaptive"]), int(state["t"])
        self.hint_scale = float(state["hint_scale"])
        self.hint_error = float(state["hint_error"])
        self._w_hat = A.to_numpy_list(state["w_hat"])
        self._hint = A.to_numpy_list(state["hint"])
        set_rng_state(self._rng, state["rng"])
