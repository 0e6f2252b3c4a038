"""Online updates of the LR draft from the judge's feedback (OnlineSpec Sec. 3.1,
Eq. 2; settings of App. B.10).

Online-LR minimises, over the preference pairs S_t of a chunk (x = context,
y_w = the target's step, y_l = the rejected draft step, all in the draft's tokens),

    f_t(w) = - sum log sigmoid( beta * L(y_w) - beta * L(y_l) ),
    L(y) = log pi_w(y | x) - log pi_ref(y | x),

with pi_ref a frozen copy of the draft taken when the updater is built (Rafailov et
al. 2023, DPO). App. B.10: AdamW (beta_1 0.9, beta_2 0.95), gradient clipping 1.0,
learning rate 5e-7, beta_DPO 0.1, 3 epochs per update round, global batch 16; one
round per chunk of 25 prompts (`runner`). OSD-LR, the naive contender, feeds the
same pairs to OSD-style token-level distillation: the cross-entropy of the draft on
the target's step tokens y_w given x (no reference model), same optimiser.
"""
from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

from specloop.realmodels.reasoning.lookahead import FeedbackPair

__all__ = ["sequence_logprob", "dpo_loss", "distill_loss", "DraftUpdater", "OBJECTIVES"]

OBJECTIVES = ("dpo", "distill")


def sequence_logprob(model, prompt_ids, response_ids) -> torch.Tensor:
    """log pi(y | x) = sum_i log p(y_i | x, y_<i) (scalar, float32 or float64 for a
    float64 model; differentiable).

    Args:
        model: causal LM.
        prompt_ids: x, >= 1 ids; response_ids: y, >= 1 ids.

    Raises:
        ValueError: empty prompt or response.
    """
    if len(prompt_ids) == 0 or len(response_ids) == 0:
        raise ValueError("sequence_logprob needs a non-empty prompt and response")
    device = next(model.parameters()).device
    ids = torch.tensor(list(prompt_ids) + list(response_ids), dtype=torch.long, device=device)[None]
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt_ids) - 1: -1]
    logits = logits if logits.dtype == torch.float64 else logits.float()     # bf16 / fp16 -> float32
    target = ids[0, len(prompt_ids):]
    return torch.log_softmax(logits, dim=-1).gather(-1, target[:, None]).sum()


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """-log sigmoid(beta * ((pc - rc) - (pr - rr))) (Eq. 2 per pair); tensors of
    the same shape (sequence log-probabilities), mean over them."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def distill_loss(model, pair: FeedbackPair) -> torch.Tensor:
    """Mean token cross-entropy of the draft on the target's step (OSD-LR)."""
    return -sequence_logprob(model, pair.prompt_ids, pair.chosen_ids) / len(pair.chosen_ids)


class DraftUpdater:
    """Collects feedback pairs and updates the draft once per chunk.

    Args:
        model: the draft causal LM, updated in place (its parameters get
            ``requires_grad``); keep a separate copy per method.
        objective: "dpo" (Online-LR) or "distill" (OSD-LR).
        lr: learning rate (default 5e-7, App. B.10).
        beta: beta_DPO (0.1).
        epochs: passes over the chunk's pairs per update (3).
        batch_size: pairs per optimiser step (gradient accumulation; 16).
        clip: max gradient norm (1.0).

    Raises:
        ValueError: unknown objective, lr/beta <= 0, epochs/batch_size < 1.
    """

    def __init__(self, model, objective: str = "dpo", *, lr: float = 5e-7, beta: float = 0.1, epochs: int = 3,
                 batch_size: int = 16, clip: float = 1.0):
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; choose from {OBJECTIVES}")
        if lr <= 0 or beta <= 0 or epochs < 1 or batch_size < 1 or clip <= 0:
            raise ValueError(f"need lr, beta, clip > 0 and epochs, batch_size >= 1; got {lr}, {beta}, "
                             f"{clip}, {epochs}, {batch_size}")
        self.model, self.objective = model, objective
        self.beta, self.epochs, self.batch_size, self.clip = float(beta), int(epochs), int(batch_size), float(clip)
        self.reference = None
        if objective == "dpo":
            self.reference = copy.deepcopy(model).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
        self.params = [p for p in model.parameters()]
        for p in self.params:
            p.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(self.params, lr=float(lr), betas=(0.9, 0.95), weight_decay=0.0)
        self.buffer: list[FeedbackPair] = []

    def add(self, pairs) -> None:
        """Queue feedback pairs (empty chosen / rejected steps are skipped)."""
        self.buffer.extend(p for p in pairs if len(p.chosen_ids) and len(p.rejected_ids) and len(p.prompt_ids))

    def pair_loss(self, pair: FeedbackPair) -> torch.Tensor:
        """This pair's loss under the current draft (differentiable)."""
        if self.objective == "distill":
            return distill_loss(self.model, pair)
        with torch.no_grad():
            ref_c = sequence_logprob(self.reference, pair.prompt_ids, pair.chosen_ids)
            ref_r = sequence_logprob(self.reference, pair.prompt_ids, pair.rejected_ids)
        return dpo_loss(sequence_logprob(self.model, pair.prompt_ids, pair.chosen_ids),
                        sequence_logprob(self.model, pair.prompt_ids, pair.rejected_ids), ref_c, ref_r, self.beta)

    def update(self) -> dict:
        """One update round over the queued pairs (then the queue is emptied).

        Returns:
            {"pairs", "steps", "loss_first" (mean loss of the first epoch, f_t(w_t)),
            "loss_last", "seconds"}; no pairs -> zeros and nan losses.
        """
        start = time.perf_counter()
        pairs, self.buffer = self.buffer, []
        if not pairs:
            return {"pairs": 0, "steps": 0, "loss_first": float("nan"), "loss_last": float("nan"), "seconds": 0.0}
        self.model.eval()
        steps, epoch_losses = 0, []
        with torch.enable_grad():
            for _ in range(self.epochs):
                total = 0.0
                for begin in range(0, len(pairs), self.batch_size):
                    batch = pairs[begin: begin + self.batch_size]
                    self.optimizer.zero_grad(set_to_none=True)
                    for pair in batch:
                        loss = self.pair_loss(pair) / len(batch)
                        loss.backward()
                        total += float(loss.detach()) * len(batch)
                    torch.nn.utils.clip_grad_norm_(self.params, self.clip)
                    self.optimizer.step()
                    steps += 1
                epoch_losses.append(total / len(pairs))
        self.optimizer.zero_grad(set_to_none=True)
        return {"pairs": len(pairs), "steps": steps, "loss_first": epoch_losses[0], "loss_last": epoch_losses[-1],
                "seconds": time.perf_counter() - start}

    def state_dict(self) -> dict:
        """Draft parameters, optimiser state and the queued pairs."""
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "buffer": list(self.buffer)}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer = list(state["buffer"])
