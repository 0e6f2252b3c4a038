"""OSD-style online distillation (Liu et al. 2024, "Online Speculative Decoding";
the OSD baseline of OnlineSpec Sec. 3.1 / Table 1).

The draft keeps a buffer of the positions where verification *rejected* a draft
token, each with the target's distribution p_target there, and every
``update_every`` rounds runs an inner optimiser (SGD or Adam, ``inner_epochs``
passes over the buffer in a seeded random order, mini-batches of ``batch_size``)
on the distillation loss over the buffer, projects onto the L2 ball, and clears the
buffer. Between updates ``step`` returns the played parameters unchanged (copies).

Feedback reaches the buffer in two ways:

* ``add_feedback(context, p_target)``: a rejected position; the learner needs
  ``loss_and_grad(params, context, p_target) -> (loss, grads)`` (e.g. the cross-
  entropy -sum p_target log q_draft of the simulator's draft) at construction;
* ``add_feedback(oracle=fn)`` or ``step(..., oracle=fn)``: a closure
  ``fn(params) -> (loss, grads)`` for that round's loss. The caller passes it only
  for rounds with a rejection (OSD distils on rejected positions only).
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable, Sequence

import numpy as np

from specloop.strategies import _arrays as A
from specloop.strategies._state import check_state_keys, make_rng, rng_state, set_rng_state
from specloop.strategies.ogd import Oracle, _check_lr, _check_radius

__all__ = ["OSDDistillation"]

LossAndGrad = Callable[[list, Any, Any], tuple[float, list]]


class OSDDistillation:
    """Periodic distillation on a buffer of rejected positions (OSD).

    Args:
        lr: inner optimiser step size > 0.
        update_every: rounds between updates (OSD's update interval), >= 1.
        inner_epochs: passes over the buffer per update, >= 1.
        batch_size: samples per inner step (gradients averaged), >= 1.
        optimizer: "sgd" or "adam" (Adam moments persist across updates;
            betas 0.9 / 0.999, eps 1e-8).
        radius: D of the feasible ball (None = unconstrained).
        max_buffer: buffer capacity; the oldest samples are dropped beyond it.
        loss_and_grad: ``(params, context, p_target) -> (loss, grads)`` used by
            ``add_feedback(context, p_target)``.
        seed: seeds the generator that shuffles the buffer.

    Raises:
        ValueError: bad hyper-parameters; ``add_feedback(context, p_target)``
            without ``loss_and_grad``; non-finite losses from the buffer.
    """

    #: learns only from rounds with a rejection, handed over through `add_feedback`
    #: (or ``step(oracle=)``); ignores the played point's gradient (`specloop.strategies.registry`)
    feedback = "rejections"

    def __init__(self, lr: float, update_every: int = 8, inner_epochs: int = 1,
                 batch_size: int = 1, optimizer: str = "sgd", radius: float | None = None,
                 max_buffer: int = 4096, loss_and_grad: LossAndGrad | None = None,
                 seed: int | None = None):
        self.lr = _check_lr(lr)
        self.radius = _check_radius(radius)
        for name, value in (("update_every", update_every), ("inner_epochs", inner_epochs),
                            ("batch_size", batch_size), ("max_buffer", max_buffer)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        self.update_every, self.inner_epochs = int(update_every), int(inner_epochs)
        self.batch_size, self.max_buffer = int(batch_size), int(max_buffer)
        self.optimizer = optimizer
        self.loss_and_grad = loss_and_grad
        self.seed = seed
        self._rng = make_rng(seed)
        self.buffer: list[tuple] = []  # ("data", context, p_target) | ("oracle", fn)
        self.t = 0
        self.num_updates = 0
        self._adam_m: list | None = None
        self._adam_v: list | None = None
        self._adam_t = 0

    # -- feedback ------------------------------------------------------------
    @property
    def buffered(self) -> int:
        """Rejected positions in the buffer, not yet distilled."""
        return len(self.buffer)

    def add_feedback(self, context: Any = None, p_target: Any = None,
                     oracle: Oracle | None = None) -> None:
        """Buffer one rejected position: (context, p_target) or an oracle closure.

        The arrays are copied, so later changes by the caller do not leak in.
        """
        if oracle is not None:
            self._push(("oracle", oracle))
            return
        if self.loss_and_grad is None:
            raise ValueError("add_feedback(context, p_target) needs loss_and_grad= at "
                             "construction (or pass oracle=)")
        if p_target is None:
            raise ValueError("add_feedback needs p_target (the target's distribution)")
        ctx = copy.deepcopy(context)
        p = np.array(p_target, dtype=np.float64, copy=True)
        if p.ndim != 1 or not np.all(np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-6:
            raise ValueError("p_target must be a finite probability vector summing to 1")
        self._push(("data", ctx, p))

    def _push(self, entry: tuple) -> None:
        self.buffer.append(entry)
        if len(self.buffer) > self.max_buffer:
            del self.buffer[0]

    def _evaluate(self, entry: tuple, params: list) -> tuple[float, list]:
        if entry[0] == "oracle":
            return entry[1](params)
        return self.loss_and_grad(params, entry[1], entry[2])

    # -- update ----------------------------------------------------------------
    def step(self, params: Sequence[Any], grads: Sequence[Any], loss: float = math.nan,
             oracle: Oracle | None = None) -> list[Any]:
        """Record the round (buffering ``oracle`` if given); every ``update_every``
        rounds distil on the buffer and clear it. Returns w_{t+1} (new arrays)."""
        A.check_pair(params, grads)
        A.check_loss(loss, required=False)
        if oracle is not None:
            self._push(("oracle", oracle))
        self.t += 1
        if self.t % self.update_every != 0 or not self.buffer:
            return A.copy_list(params)
        out = self._distil(A.copy_list(params))
        self.buffer = []
        self.num_updates += 1
        return out

    def _distil(self, w: list) -> list:
        n = len(self.buffer)
        for _ in range(self.inner_epochs):
            order = self._rng.permutation(n)
            for start in range(0, n, self.batch_size):
                batch = order[start:start + self.batch_size]
                grads = self._batch_grad(w, batch)
                w = A.project_ball(self._apply(w, grads), self.radius)
        return w

    def _batch_grad(self, w: list, batch: np.ndarray) -> list:
        total = None
        for i in batch:
            loss_i, g = self._evaluate(self.buffer[int(i)], A.copy_list(w))
            A.check_pair(w, g)
            A.check_loss(loss_i, required=True)
            total = A.copy_list(g) if total is None else A.add_scaled(total, g, 1.0)
        return [g * (1.0 / len(batch)) for g in total]

    def _apply(self, w: list, grads: list) -> list:
        if self.optimizer == "sgd":
            return A.add_scaled(w, grads, -self.lr)
        b1, b2, eps = 0.9, 0.999, 1e-8
        xp = A.namespace(w)
        m = [g * 0.0 for g in grads] if self._adam_m is None else A.from_numpy_or_same(self._adam_m, w)
        v = [g * 0.0 for g in grads] if self._adam_v is None else A.from_numpy_or_same(self._adam_v, w)
        self._adam_t += 1
        m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grads)]
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grads)]
        c1, c2 = 1 - b1 ** self._adam_t, 1 - b2 ** self._adam_t
        self._adam_m, self._adam_v = m, v
        return [wi - self.lr * (mi / c1) / (xp.sqrt(vi / c2) + eps) for wi, mi, vi in zip(w, m, v)]

    # -- state -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Hyper-parameters, counters, Adam moments, generator state and the buffered
        (context, p_target) samples. Buffered *oracle closures* cannot be saved:
        ``oracles_dropped`` counts them (save right after an update to lose none)."""
        return {"class": type(self).__name__, "lr": self.lr, "radius": self.radius,
                "t": self.t, "num_updates": self.num_updates, "adam_t": self._adam_t,
                "adam_m": A.to_numpy_list(self._adam_m), "adam_v": A.to_numpy_list(self._adam_v),
                "buffer": [(copy.deepcopy(e[1]), e[2].copy()) for e in self.buffer if e[0] == "data"],
                "oracles_dropped": sum(1 for e in self.buffer if e[0] == "oracle"),
                "rng": rng_state(self._rng)}

    def load_state_dict(self, state: dict) -> None:
        check_state_keys(state, {"lr", "radius", "t", "num_updates", "adam_t", "adam_m",
                                 "adam_v", "buffer", "rng"}, type(self).__name__)
        self.lr, self.radius = float(state["lr"]), state["radius"]
        self.t, self.num_updates = int(state["t"]), int(state["num_updates"])
        self._adam_t = int(state["adam_t"])
        self._adam_m = A.to_numpy_list(state["adam_m"])
        self._adam_v = A.to_numpy_list(state["adam_v"])
        if state["buffer"] and self.loss_and_grad is None:
            raise ValueError("state has buffered (context, p_target) samples but this "
                             "learner has no loss_and_grad")
        self.buffer = [("data", copy.deepcopy(c), np.array(p, dtype=np.float64))
                       for c, p in state["buffer"]]
        set_rng_state(self._rng, state["rng"])
