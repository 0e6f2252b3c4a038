"""`OnlineDrafter`: a `Drafter` that adapts an inner drafter online through an
`OnlineAdapter` (`specloop.realmodels.online`; OnlineSpec Algorithm 1)."""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch

from specloop.realmodels.drafters.base import DraftProposal, DraftRequest, VerifyFeedback

if TYPE_CHECKING:
    from specloop.realmodels.online.adapter import OnlineAdapter

__all__ = ["OnlineDrafter"]


class OnlineDrafter:
    """A `Drafter` that adapts an inner drafter online (see module docstring).

    ``observe`` = collect the round's sample, let the inner drafter observe, then
    the adapter's micro-update (the decoder times it as the round's
    ``update_time``). The target's output never depends on the draft (lossless
    verification), only the speed does.

    Attributes:
        round_losses: f_t(w_t) of each round (`OnlineAdapter.record`: the round's own
            cross-entropy at the parameters that drafted it; NaN if the round gave
            no sample), in order; one entry per ``observe``.
        collect_seconds: wall seconds spent turning verification feedback into
            training samples (``objective.collect``; part of each round's update time).
        online_seconds: wall seconds of online work in ``observe``: collection plus the
            adapter's ``record`` (the round's loss, updates run or queued, publication);
            the inner drafter's own ``observe`` is left out.
        round_loss: the latest entry (NaN before the first round); ``observe``
            returns it, and the decoder session writes it into the round's
            `RoundRecord.loss`.
    """

    def __init__(self, inner, adapter: OnlineAdapter) -> None:
        self.inner = inner
        self.adapter = adapter
        self.name = f"online-{getattr(inner, 'name', 'drafter')}"
        self.needs_target_hidden = tuple(getattr(inner, "needs_target_hidden", ()))
        self.round_losses: list[float] = []
        self.collect_seconds = 0.0
        self.online_seconds = 0.0
        self._context: torch.Tensor | None = None

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        self._context = None
        self.inner.reset(prompt_ids, target_hidden=target_hidden)
        if hasattr(self.adapter.objective, "reset"):
            self.adapter.objective.reset(prompt_ids, target_hidden)

    def propose(self, request: DraftRequest) -> DraftProposal:
        self._context = request.ids
        with self.adapter.lock:
            return self.inner.propose(request)

    def observe(self, feedback: VerifyFeedback) -> float:
        """Collect the round's sample, let the inner drafter observe, micro-update;
        returns f_t(w_t), the observation the decoder folds into the round's
        `RoundRecord.loss` before the policy sees it."""
        t0 = time.perf_counter()
        sample = self.adapter.objective.collect(feedback, self._context)
        t1 = time.perf_counter()
        self._context = None
        self.inner.observe(feedback)
        t2 = time.perf_counter()
        loss = float(self.adapter.record(sample))
        self.collect_seconds += t1 - t0
        self.online_seconds += (t1 - t0) + (time.perf_counter() - t2)
        self.round_losses.append(loss)
        return loss

    @property
    def round_loss(self) -> float:
        return self.round_losses[-1] if self.round_losses else math.nan

    def parameters(self) -> list[torch.Tensor]:
        return self.inner.parameters()
