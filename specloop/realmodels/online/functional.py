"""Draft losses and gradients at parameter values other than the drafter's own, without
writing them into the drafter (`specloop.realmodels.online`): the learners' oracle.

`ParameterOwner` finds the `torch.nn.Module` of the drafter that holds every trainable
parameter and evaluates an objective with given values substituted for them
(`torch.func.functional_call`), so an oracle call costs one forward and backward and no
copies of the weights (the former path saved the weights, wrote the values in and wrote
the weights back: three copies of every parameter per call, about 13 % of an EAGLE-3
oracle call at one thread).

``loss_grad_many`` evaluates several points in one call: the values stacked on a leading
axis and the objective mapped over it with `torch.func.vmap` -- the form in which an
ensemble's N base learners cost one batched forward and backward on an accelerator
(OnlineSpec App. B: "all draft models can be updated in parallel"). On a CPU at one
thread the stacked call is slower than N calls (an EAGLE-3 ensemble of 3: 385 ms against
282 ms per call, `benchmarks/online_stacked.py`), so it is an option
(`OnlineConfig.stacked_oracle`), not the default.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["ParameterOwner"]


class _Call(torch.nn.Module):
    """A module whose forward is ``fn(*args)``, with ``owner`` as its one submodule, so
    `functional_call` can substitute the owner's parameters (keys ``owner.<name>``)."""

    def __init__(self, owner: torch.nn.Module, fn: Callable) -> None:
        super().__init__()
        self.owner = owner
        self._fn = fn

    def forward(self, *args):
        return self._fn(*args)


class ParameterOwner:
    """The module of a drafter that holds its trainable parameters, and evaluation of an
    objective at other values of them.

    Args:
        module: the module (every parameter of ``params`` is one of its parameters).
        params: the drafter's trainable parameters, in the learners' order.

    Raises:
        ValueError: a parameter that is not the module's.
    """

    def __init__(self, module: torch.nn.Module, params: Sequence[torch.Tensor]) -> None:
        names = {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}
        missing = [i for i, p in enumerate(params) if id(p) not in names]
        if missing:
            raise ValueError(f"parameters {missing} are not parameters of {type(module).__name__}")
        self.module = module
        self.params = list(params)
        self.keys = ["owner." + names[id(p)] for p in params]

    @classmethod
    def find(cls, drafter, params: Sequence[torch.Tensor]) -> "ParameterOwner | None":
        """The drafter's attribute module that holds every parameter of ``params`` (the
        drafter itself if it is one), or None when no single module does."""
        wanted = {id(p) for p in params}
        candidates = [drafter] if isinstance(drafter, torch.nn.Module) else []
        candidates += [v for v in vars(drafter).values() if isinstance(v, torch.nn.Module)]
        for module in candidates:
            if wanted <= {id(p) for p in module.parameters()}:
                return cls(module, params)
        return None

    def _values(self, values: Sequence) -> list[torch.Tensor]:
        return [torch.as_tensor(v, dtype=p.dtype, device=p.device) for p, v in zip(self.params, values)]

    def call(self, fn: Callable, values: Sequence[torch.Tensor], *args):
        """``fn(*args)`` with ``values`` in place of the parameters (the module's own
        parameters are untouched; the substitution lasts for the call only)."""
        return torch.func.functional_call(_Call(self.module, fn), dict(zip(self.keys, values)), args,
                                          strict=False, tie_weights=False)

    def loss_grad(self, objective, values: Sequence, samples: list):
        """f and grad f of ``objective`` on ``samples`` at ``values``.

        Returns:
            (loss float, gradients like ``params`` (detached, zeros where unused),
            the first sample's own loss float).
        """
        leaves = [v.detach().clone().requires_grad_(True) for v in self._values(values)]
        with torch.inference_mode(False), torch.enable_grad():
            loss, per_sample = self.call(objective.loss_and_sample_losses, leaves, samples)
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        out = [torch.zeros_like(v) if g is None else g.detach() for v, g in zip(leaves, grads)]
        return float(loss.detach()), out, float(per_sample[0])

    def loss_grad_many(self, objective, points: Sequence[Sequence], samples: list):
        """f and grad f at every point of ``points`` in one stacked call (`torch.func.vmap`
        over the values stacked on a leading axis).

        Returns:
            (list of loss floats, list of gradient lists), one per point.

        Raises:
            ValueError: no points.
        """
        if not points:
            raise ValueError("loss_grad_many needs at least one point")
        stacked = [torch.stack(vs) for vs in zip(*(self._values(p) for p in points))]

        def loss_at(values):
            return self.call(objective.loss, values, samples)

        with torch.inference_mode(False), torch.enable_grad():
            grads, losses = torch.func.vmap(torch.func.grad_and_value(loss_at), randomness="error")(stacked)
        return ([float(x) for x in losses.detach()],
                [[g[i].detach() for g in grads] for i in range(len(points))])
