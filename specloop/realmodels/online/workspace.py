"""Where an online learner evaluates its losses and gradients
(`specloop.realmodels.online`): the drafter's own parameters (updates in the round loop),
or a private copy of them that a background worker trains while the decoder drafts with
the weights last published to it (`OnlineAdapter` with ``background=True``).

A `Workspace` bundles an objective, the parameters it differentiates and their
`ParameterOwner`. `shadow_workspace` builds the private copy: a shallow copy of the
drafter whose parameter module is deep-copied, its frozen tensors (the target's
embeddings a head reads, buffers) shared rather than copied, and the drafter's objective
rebuilt on it. Nothing the decoder reads is written while the worker trains the copy;
the adapter copies the trained values into the drafter between rounds.
"""
from __future__ import annotations

import copy
import math
from typing import Any

import torch

from specloop.realmodels.online.functional import ParameterOwner
from specloop.realmodels.online.objectives import objective_for

__all__ = ["Workspace", "shadow_workspace"]


class Workspace:
    """An objective, its trainable parameters and (if one module holds them) their owner.

    Args:
        objective: the drafter's online objective (`objectives.objective_for`).
        params: the tensors it differentiates (the drafter's ``parameters()``).
        owner: `ParameterOwner` of ``params``, or None (values are then written in and
            restored to evaluate elsewhere).

    Attributes:
        sample_losses: (first sample, its loss) of the latest evaluation at the
            workspace's own parameters (None before any).
    """

    def __init__(self, objective, params: list[torch.Tensor], owner: ParameterOwner | None) -> None:
        self.objective, self.params, self.owner = objective, list(params), owner
        self.sample_losses: tuple[Any, float] | None = None

    def loss_grad(self, samples: list) -> tuple[float, list[torch.Tensor]]:
        """f and grad f at the workspace's parameters (zeros where a parameter is unused)."""
        flags = [p.requires_grad for p in self.params]
        with torch.inference_mode(False), torch.enable_grad():
            try:
                for p in self.params:
                    p.requires_grad_(True)
                loss, per_sample = self.objective.loss_and_sample_losses(samples)
                grads = torch.autograd.grad(loss, self.params, allow_unused=True)
            finally:
                for p, flag in zip(self.params, flags):
                    p.requires_grad_(flag)
        self.sample_losses = (samples[0], float(per_sample[0]))
        return float(loss.detach()), [torch.zeros_like(p) if g is None else g.detach()
                                      for p, g in zip(self.params, grads)]

    def loss_only(self, samples: list) -> tuple[float, list[torch.Tensor]]:
        """f at the workspace's parameters without its gradient; zeros stand in for it
        (for a learner that does not read the played point's gradient)."""
        with torch.no_grad():
            loss, per_sample = self.objective.loss_and_sample_losses(samples)
        self.sample_losses = (samples[0], float(per_sample[0]))
        return float(loss), [torch.zeros_like(p) for p in self.params]

    def loss_grad_at(self, values: list, samples: list) -> tuple[float, list[torch.Tensor]]:
        """f and grad f at other values: substituted for the call, or written in and
        restored when no single module owns the parameters."""
        if self.owner is not None:
            loss, grads, _ = self.owner.loss_grad(self.objective, values, samples)
            return loss, grads
        saved = [p.detach().clone() for p in self.params]
        kept = self.sample_losses
        try:
            self.write(values)
            return self.loss_grad(samples)
        finally:
            self.write(saved)
            self.sample_losses = kept

    def write(self, values: list) -> None:
        """Copy ``values`` into the parameters (their dtype and device)."""
        with torch.no_grad():
            for p, v in zip(self.params, values):
                p.copy_(torch.as_tensor(v, dtype=p.dtype, device=p.device))

    def loss(self, sample) -> float:
        """One sample's loss at the workspace's parameters (NaN for None)."""
        if sample is None:
            return math.nan
        with torch.no_grad():
            return float(self.objective.loss([sample]))


def shadow_workspace(drafter, live: Workspace, top_m: int) -> Workspace:
    """A private copy of ``drafter``'s trainable parameters and an objective over it.

    Raises:
        ValueError: no single module of the drafter holds its parameters (`ParameterOwner`).
    """
    if live.owner is None:
        raise ValueError(f"background updates need the drafter's parameters in one module; "
                         f"{getattr(drafter, 'name', type(drafter).__name__)!r} has none")
    module = live.owner.module
    trainable = {id(p) for p in live.params}
    memo = {id(t): t for t in [*module.parameters(), *module.buffers()] if id(t) not in trainable}
    copied = copy.deepcopy(module, memo)
    if module is drafter:
        shadow = copied
    else:
        shadow = copy.copy(drafter)
        names = [name for name, value in vars(drafter).items() if value is module]
        for name in names:
            setattr(shadow, name, copied)
    named = dict(copied.named_parameters(remove_duplicate=False))
    params = [named[key[len("owner."):]] for key in live.owner.keys]
    return Workspace(objective_for(shadow, top_m=top_m), params, ParameterOwner(copied, params))
