"""RMS preconditioning as a wrapper learner: adaptive OGD (RMSProp / Adam's second-moment
scaling without momentum; Tieleman & Hinton 2012, Kingma & Ba 2015) around any learner
of `specloop.strategies`.

``Preconditioned(inner)`` keeps the running mean of squared *played-point* gradients

    v_t = beta * v_{t-1} + (1 - beta) * g_t^2,     v_0 = 0,
    v_hat_t = v_t / (1 - beta^t)                   (bias correction)

and hands the inner learner every gradient divided elementwise by sqrt(v_hat_t) + eps:
the played point's gradient of ``step`` and the gradients returned by the round's
``oracle`` (ensembles' base points) alike, so ``lr`` becomes a per-element step (the
EAGLE / EAGLE-3 set-up of OnlineSpec App. B.10 uses Adam at 3e-5..4e-4). Before any
played gradient was seen the gradients pass unchanged.

A learner that ignores the played point's gradient (``feedback == "rejections"``, OSD)
gives the wrapper nothing to fold into v, so its feedback passes through unchanged --
what ``precondition="rms"`` always did for OSD.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from specloop.strategies import _arrays as A
from specloop.strategies._state import check_state_keys

__all__ = ["Preconditioned", "PRECONDITIONERS"]

#: names of the gradient preconditioners (`specloop.strategies.registry.learner_from_name`)
PRECONDITIONERS = ("none", "rms")


class Preconditioned:
    """An `OnlineLearner` that RMS-scales the gradients its inner learner sees (see the
    module docstring). Arrays: lists of NumPy arrays or torch tensors (array API);
    ``second_moment`` matches the gradients' shapes and dtype.

    Args:
        inner: any learner with ``step(params, grads, loss, oracle=None)``,
            ``state_dict`` and ``load_state_dict``.
        decay: beta in (0, 1), the running mean's decay (``rms_decay``).
        eps: > 0, added to sqrt(v_hat) (gradient units).

    Attributes:
        second_moment: v_t (None before the first played gradient).
        steps: t, the played gradients folded into v so far.

    Raises:
        ValueError: decay outside (0, 1), eps <= 0, an inner object that is not a learner.
    """

    def __init__(self, inner: Any, decay: float = 0.95, eps: float = 1e-8):
        if not all(callable(getattr(inner, m, None)) for m in ("step", "state_dict", "load_state_dict")):
            raise ValueError(f"Preconditioned needs an online learner, got {type(inner).__name__}")
        if not (0.0 < float(decay) < 1.0):
            raise ValueError(f"rms_decay must be in (0, 1), got {decay}")
        if not (math.isfinite(float(eps)) and eps > 0):
            raise ValueError(f"eps must be positive and finite, got {eps}")
        self.inner = inner
        self.decay, self.eps = float(decay), float(eps)
        self.second_moment: list | None = None
        self.steps = 0

    # -- the inner learner's protocol attributes ------------------------------------
    @property
    def feedback(self) -> str:
        """The inner learner's feedback kind (`specloop.strategies.registry`)."""
        return getattr(self.inner, "feedback", "played")

    @property
    def uses_played_gradient(self) -> bool:
        """True for a "played" inner learner: v is folded from the played gradients
        even when the inner learner itself (an exact ensemble) would not read them."""
        return self.feedback == "played"

    @property
    def buffered(self) -> int:
        """Feedback items the inner learner holds (its ``buffered``; 0 if it has none)."""
        return int(getattr(self.inner, "buffered", 0))

    def add_feedback(self, context: Any = None, p_target: Any = None, oracle: Callable | None = None) -> None:
        """Forward to the inner learner's ``add_feedback`` (oracle gradients scaled).

        Raises:
            ValueError: the inner learner takes no buffered feedback.
        """
        if not callable(getattr(self.inner, "add_feedback", None)):
            raise ValueError(f"{type(self.inner).__name__} takes no add_feedback")
        self.inner.add_feedback(context, p_target, oracle=self._wrap(oracle))

    # -- the update -----------------------------------------------------------------
    def step(self, params: Sequence[Any], grads: Sequence[Any], loss: float = math.nan,
             oracle: Callable | None = None) -> list[Any]:
        """Fold ``grads`` into v (learners that use the played gradient), then one inner
        step on the scaled gradients with a scaling oracle. Returns the inner learner's
        new parameters; never mutates its inputs."""
        A.check_pair(params, grads)
        if self.feedback == "played":
            self._fold(grads)
            grads = self.scale(grads)
        return self.inner.step(params, grads, loss, oracle=self._wrap(oracle))

    def _fold(self, grads: Sequence[Any]) -> None:
        v = ([A.namespace(grads).zeros_like(A.detach(g)) for g in grads] if self.second_moment is None
             else A.from_numpy_or_same(self.second_moment, grads))
        self.second_moment = [A.add_product(vi * self.decay, g, g, 1.0 - self.decay) for vi, g in zip(v, grads)]
        self.steps += 1

    def scale(self, grads: Sequence[Any]) -> list[Any]:
        """g / (sqrt(v_hat) + eps) elementwise (new arrays); ``grads`` unchanged (the
        same list) before any played gradient was folded in."""
        if self.second_moment is None:
            return grads
        xp = A.namespace(grads)
        v = A.from_numpy_or_same(self.second_moment, grads)
        correction = 1.0 - self.decay ** self.steps
        return [A.detach(g) / (xp.sqrt(vi / correction) + self.eps) for g, vi in zip(grads, v)]

    def _wrap(self, oracle: Callable | None) -> Callable | None:
        if oracle is None:
            return None

        def scaled(values):
            loss, grads = oracle(values)
            return loss, self.scale(grads)
        return scaled

    # -- state ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The inner learner's state, the decay, eps, t and v (NumPy copies)."""
        return {"class": type(self).__name__, "inner": self.inner.state_dict(), "decay": self.decay,
                "eps": self.eps, "steps": self.steps, "second_moment": A.to_numpy_list(self.second_moment)}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output (the inner learner's through its own loader).

        Raises:
            ValueError: missing keys or another class's state.
        """
        check_state_keys(state, {"inner", "decay", "eps", "steps", "second_moment"}, type(self).__name__)
        self.inner.load_state_dict(state["inner"])
        self.decay, self.eps, self.steps = float(state["decay"]), float(state["eps"]), int(state["steps"])
        self.second_moment = A.to_numpy_list(state["second_moment"])
