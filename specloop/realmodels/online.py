"""Online draft adaptation inside the real decoder (OnlineSpec Algorithm 1: draft ->
verify -> feedback -> *update*; Sec. 3 learners, Sec. 4 / App. B set-up).

`OnlineDrafter` wraps any trained `Drafter` and is itself a `Drafter`, so the
unchanged `SpeculativeDecoder` drives it. In ``observe`` it turns the round's
`VerifyFeedback` into a training sample *before* the inner drafter moves on, keeps
it in a replay buffer, and -- depending on the mode -- updates the draft's
parameters through an online learner of `specloop.strategies` (OGD, optimistic OGD,
Hedge ensemble, optimism + ensemble, OSD distillation; all ``step(params, grads,
loss, oracle) -> params`` on lists of torch tensors):

* ``mode="round"``: every ``update_every`` rounds one micro-update on a mini-batch
  of ``batch_size`` samples: the newest one plus uniformly drawn older ones from the
  replay buffer (capacity ``buffer_size``);
* ``mode="chunk"``: the paper's chunked mode (App. B.1): samples of a chunk of
  prompts are collected, and `end_chunk` runs ``epochs`` passes over them in
  shuffled mini-batches (one learner step per mini-batch).

``background=True`` runs the updates on a worker thread (App. B.2) so decoding does
not wait; parameter writes and drafting are serialised by a lock.

Loss f_t(w) (`FeatureHeadObjective`): at every verified position j of the round
(the pending token and each accepted node; row j of ``VerifyFeedback.target_logits``)
the cross-entropy ``-sum_x p_target_j(x) log q_draft_j(x; w)`` of the draft head of
depth j against the target's temperature-1 distribution, truncated to its top
``top_m`` tokens inside the draft's reduced vocabulary and renormalised there (the
draft cannot place mass outside its vocabulary; FR-Spec / EAGLE-3 train the same
way). Equal to KL(p || q) up to the entropy of p, which does not depend on w.
Heads are unrolled teacher-forced on the committed tokens (Hydra's sequential
dependence uses the heads' own features).

EAGLE / EAGLE-3 heads (`EagleObjective`) are re-run with gradients over a window of
the true target features (training-time test, steps 1..2) at the verified positions.
The distilled small-LM draft (Vanilla SD / OSD rows; `SmallLMObjective`) uses the
same cross-entropy, re-running the draft with gradients over the last ``window``
context tokens and the accepted tokens. Other drafters (n-gram, separate small
models with another tokenizer) have no objective: their online methods fail with a
ValueError saying so.

Default step sizes (`DEFAULT_LR`) come from a probe on SmolLM2-135M's Hydra heads:
plain OGD at 0.05 diverged (NaN draft logits), 1e-3..3e-3 lowered the in-stream
loss fastest without raising the loss on later prompts.

OSD (Liu et al. 2024) distils only on rounds with a rejection: the learner receives
an oracle for those rounds only.

Per-round loss: `OnlineAdapter.record` returns f_t(w_t), the round's own
cross-entropy at the parameters that drafted it, for every learner and mode;
`OnlineDrafter.round_losses` keeps them and the stream runner writes them into
`RoundRecord.loss`. The objectives read the drafters only through their public
online-training accessors (``target_to_draft``; ``feature_state`` /
``unrolled_logits`` of the feature heads, ``ttt_hidden`` / ``draft_logits`` of EAGLE, ``context_logits``
of the small LM).
"""
from __future__ import annotations

import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from specloop.realmodels.drafters.base import DraftProposal, DraftRequest, VerifyFeedback

__all__ = ["FeatureSample", "ContextSample", "FeatureHeadObjective", "SmallLMObjective", "EagleObjective", "EagleSample", "objective_for", "OnlineConfig", "OnlineAdapter",
           "OnlineDrafter", "make_learner", "LEARNER_KINDS", "PRECONDITIONERS", "save_checkpoint", "load_checkpoint"]

LEARNER_KINDS = ("ogd", "opt", "ens", "opt-ens", "osd")
PRECONDITIONERS = ("none", "rms")


# ----------------------------------------------------------------------------- samples
@dataclass(frozen=True)
class FeatureSample:
    """One round's verified positions for feature heads (Medusa / Hydra).

    Attributes:
        h: float32 (d,) target feature h_t before the round's pending token.
        tokens: int64 (m,) target ids fed to heads 0..m-1 (pending token, then the
            accepted draft tokens).
        target_rows: int64 (m, top_m) reduced-vocabulary rows of p_target's top tokens
            (-1 = padding).
        target_probs: float32 (m, top_m) their renormalised probabilities (0 padding).
        rejected: True when the round rejected a draft token (OSD's trigger).
    """

    h: torch.Tensor
    tokens: torch.Tensor
    target_rows: torch.Tensor
    target_probs: torch.Tensor
    rejected: bool

    def to_dict(self) -> dict:
        return {"kind": "feature", "h": self.h, "tokens": self.tokens, "target_rows": self.target_rows,
                "target_probs": self.target_probs, "rejected": self.rejected}

    @classmethod
    def from_dict(cls, d: dict):
        """Rebuild a `FeatureSample` or `ContextSample` from its ``to_dict``."""
        if d.get("kind") == "eagle":
            return EagleSample(d["features"], d["next_tokens"], d["steps"], d["index"], d["target_rows"],
                               d["target_probs"], bool(d["rejected"]))
        if d.get("kind") == "context":
            return ContextSample(d["ids"], int(d["start"]), d["target_rows"], d["target_probs"],
                                 bool(d["rejected"]))
        return cls(d["h"], d["tokens"], d["target_rows"], d["target_probs"], bool(d["rejected"]))


@dataclass(frozen=True)
class EagleSample:
    """One round's verified positions for an EAGLE / EAGLE-3 head.

    Attributes:
        features: float32 (T, F) the target's true features of a window of
            positions (F = H for EAGLE, 3H for EAGLE-3), ending just before the
            round's last verified position.
        next_tokens: int64 (T,) the token after each of those positions.
        steps: int64 (n,) draft step s (1-based) of each supervised output.
        index: int64 (n,) window index i of each supervised output (at step s,
            position i predicts the token at i + 2 from the anchor i - s + 1,
            EAGLE-3's training-time test).
        target_rows, target_probs: (n, top_m) sparse target distributions.
        rejected: True when the round rejected a draft token.
    """

    features: torch.Tensor
    next_tokens: torch.Tensor
    steps: torch.Tensor
    index: torch.Tensor
    target_rows: torch.Tensor
    target_probs: torch.Tensor
    rejected: bool

    def to_dict(self) -> dict:
        return {"kind": "eagle", "features": self.features, "next_tokens": self.next_tokens,
                "steps": self.steps, "index": self.index, "target_rows": self.target_rows,
                "target_probs": self.target_probs, "rejected": self.rejected}


@dataclass(frozen=True)
class ContextSample:
    """One round's verified positions for a small-LM draft.

    Attributes:
        ids: int64 (T,) the last context tokens up to the pending token, then the
            accepted draft tokens; the draft's logits at the last m positions are
            compared with the target's rows.
        start: absolute position of ``ids[0]`` (position ids of the re-run).
        target_rows, target_probs, rejected: as in `FeatureSample` (m rows).
    """

    ids: torch.Tensor
    start: int
    target_rows: torch.Tensor
    target_probs: torch.Tensor
    rejected: bool

    def to_dict(self) -> dict:
        return {"kind": "context", "ids": self.ids, "start": self.start, "target_rows": self.target_rows,
                "target_probs": self.target_probs, "rejected": self.rejected}


def _sparse_targets(logits: torch.Tensor, target_to_draft: torch.Tensor, top_m: int):
    """(m, V) target logits -> (rows (m, top_m) int64, probs (m, top_m) float32):
    the temperature-1 distribution restricted to the reduced vocabulary, top_m
    entries, renormalised. Rows whose mass inside the vocabulary is 0 get all -1."""
    probs = torch.softmax(logits.float(), -1)
    mapped = target_to_draft.to(probs.device)
    inside = probs * (mapped >= 0).to(probs.dtype)
    top_p, top_id = inside.topk(min(top_m, inside.shape[-1]), dim=-1)
    rows = mapped[top_id]
    valid = (top_p > 0) & (rows >= 0)
    top_p = torch.where(valid, top_p, torch.zeros_like(top_p))
    mass = top_p.sum(-1, keepdim=True)
    top_p = torch.where(mass > 0, top_p / mass.clamp_min(1e-30), top_p)
    rows = torch.where(valid, rows, torch.full_like(rows, -1))
    return rows.cpu(), top_p.cpu()


class _Objective:
    """Shared reductions of the online objectives: subclasses implement
    ``_sums(samples) -> (sums (B,), counts (B,))``, the summed cross-entropy over each
    sample's supervised positions and how many positions that is."""

    def _sums(self, samples: list) -> tuple[torch.Tensor, list[int]]:  # pragma: no cover
        raise NotImplementedError

    def loss(self, samples: list) -> torch.Tensor:
        """Mean cross-entropy over every supervised position of ``samples`` (scalar,
        differentiable w.r.t. the draft's parameters).

        Raises:
            ValueError: no samples.
        """
        if not samples:
            raise ValueError("loss of an empty batch")
        sums, counts = self._sums(samples)
        return sums.sum() / max(sum(counts), 1)

    def loss_and_sample_losses(self, samples: list) -> tuple[torch.Tensor, torch.Tensor]:
        """`loss` and, from the same forward pass, each sample's own mean
        cross-entropy (float32 (B,), detached; NaN for a sample without positions):
        f_t(w) of each round.

        Raises:
            ValueError: no samples.
        """
        if not samples:
            raise ValueError("loss of an empty batch")
        sums, counts = self._sums(samples)
        n = torch.tensor(counts, dtype=torch.float32)
        per = sums.detach().float().cpu() / n.clamp_min(1)
        per = torch.where(n > 0, per, torch.full_like(per, math.nan))
        return sums.sum() / max(sum(counts), 1), per


class FeatureHeadObjective(_Objective):
    """Loss and samples for `HydraDrafter` / `MedusaDrafter` (see module docstring).

    Reads the drafter only through its public online-training accessors:
    ``feature_state()`` in `collect` (which must run before the drafter's
    ``observe``), ``unrolled_logits`` in `loss` and ``target_to_draft``.

    Args:
        drafter: the inner feature-head drafter.
        top_m: tokens kept per target row (>= 1).

    Raises:
        ValueError: a drafter that is not a feature-head drafter; top_m < 1.
    """

    def __init__(self, drafter, top_m: int = 32) -> None:
        from specloop.realmodels.heads.head_drafting import FeatureHeadDrafter, HydraDrafter
        if not isinstance(drafter, FeatureHeadDrafter):
            raise ValueError(f"FeatureHeadObjective needs a Hydra or Medusa drafter, got {type(drafter).__name__}")
        if int(top_m) < 1:
            raise ValueError(f"top_m must be >= 1, got {top_m}")
        self.drafter = drafter
        self.is_hydra = isinstance(drafter, HydraDrafter)
        self.top_m = int(top_m)

    def collect(self, feedback: VerifyFeedback, context_ids: torch.Tensor | None = None) -> FeatureSample | None:
        """The sample of this round (None when the drafter has no feature yet)."""
        state = self.drafter.feature_state()
        if state is None:
            return None
        h, pending = state
        m = min(feedback.num_accepted + 1, int(self.drafter.max_depth), int(feedback.target_logits.shape[0]))
        accepted = [int(feedback.proposal.tokens[j]) for j in feedback.accepted_nodes[: m - 1]]
        rows, probs = _sparse_targets(feedback.target_logits[:m], self.drafter.target_to_draft, self.top_m)
        rejected = feedback.num_accepted < feedback.proposal.depth
        return FeatureSample(h, torch.tensor([int(pending)] + accepted), rows, probs, bool(rejected))

    def _sums(self, samples: list[FeatureSample]) -> tuple[torch.Tensor, list[int]]:
        lengths = [int(s.tokens.numel()) for s in samples]
        width = max(lengths)
        h = torch.stack([s.h for s in samples])
        toks = torch.zeros(len(samples), width, dtype=torch.long)      # 0 pads finished rows
        for i, s in enumerate(samples):
            toks[i, :lengths[i]] = s.tokens
        all_logits = self.drafter.unrolled_logits(h, toks)
        device = all_logits[0].device
        sums = torch.zeros(len(samples), dtype=torch.float32, device=device)
        for depth, logits in enumerate(all_logits):
            live = [i for i, n in enumerate(lengths) if n > depth]
            logp = torch.log_softmax(logits[live].float(), -1)
            rows = torch.stack([samples[i].target_rows[depth] for i in live]).to(device)
            probs = torch.stack([samples[i].target_probs[depth] for i in live]).to(device)
            sums = sums.index_add(0, torch.tensor(live, device=device), _row_cross_entropy(logp, rows, probs))
        return sums, lengths


def _row_cross_entropy(logp: torch.Tensor, rows: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Per row: -sum_j probs[j] log q[rows[j]] (rows -1 = padding); (n,)."""
    picked = logp.gather(-1, rows.clamp_min(0)) * (rows >= 0)
    return -(probs * picked).sum(-1)


def _cross_entropy(logp: torch.Tensor, rows: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Sum over rows of `_row_cross_entropy`."""
    return _row_cross_entropy(logp, rows, probs).sum()


class SmallLMObjective(_Objective):
    """Loss and samples for the distilled small-LM draft (`SmallLMDraftDrafter`;
    the Vanilla SD / OSD rows): the draft is re-run with gradients over the last
    ``window`` context tokens plus the accepted draft tokens (its public
    ``context_logits``), and its logits at the pending token and each accepted token
    are compared with the target's rows (cross-entropy, as `FeatureHeadObjective`).

    Raises:
        ValueError: another drafter kind; window or top_m < 1.
    """

    def __init__(self, drafter, top_m: int = 32, window: int = 128) -> None:
        from specloop.realmodels.heads.small_lm import SmallLMDraftDrafter
        if not isinstance(drafter, SmallLMDraftDrafter):
            raise ValueError(f"SmallLMObjective needs a small-LM draft drafter, got {type(drafter).__name__}")
        if int(top_m) < 1 or int(window) < 1:
            raise ValueError(f"top_m and window must be >= 1, got {top_m}, {window}")
        self.drafter = drafter
        self.top_m, self.window = int(top_m), int(window)

    def collect(self, feedback: VerifyFeedback, context_ids: torch.Tensor | None = None) -> ContextSample | None:
        if context_ids is None or context_ids.numel() == 0:
            return None
        m = min(feedback.num_accepted + 1, int(feedback.target_logits.shape[0]))
        accepted = [int(feedback.proposal.tokens[j]) for j in feedback.accepted_nodes[: m - 1]]
        ctx = context_ids.reshape(-1).long().cpu()
        start = max(0, int(ctx.numel()) - self.window)
        ids = torch.cat([ctx[start:], torch.tensor(accepted, dtype=torch.long)])
        rows, probs = _sparse_targets(feedback.target_logits[:m], self.drafter.target_to_draft, self.top_m)
        rejected = feedback.num_accepted < feedback.proposal.depth
        return ContextSample(ids, start, rows, probs, bool(rejected))

    def _sums(self, samples: list[ContextSample]) -> tuple[torch.Tensor, list[int]]:
        terms, counts = [], []
        for s in samples:
            m = int(s.target_rows.shape[0])
            logits = self.drafter.context_logits(s.ids, s.start)
            logp = torch.log_softmax(logits[-m:].float(), -1)
            terms.append(_cross_entropy(logp, s.target_rows.to(logp.device), s.target_probs.to(logp.device)))
            counts.append(m)
        return torch.stack(terms), counts


class EagleObjective(_Objective):
    """Loss and samples for `EagleDrafter` (EAGLE / EAGLE-3; the Ens-EAGLE(-3) rows).

    Keeps the prompt's true target features (position i reads (f_i, x_{i+1}), as
    the drafter's cache does). A round verified positions P_0..P_a (the old pending
    token and the accepted nodes) and the target's row j is the distribution of the
    token at P_j + 1. At every draft step s the head output at position i predicts
    the token at i + 2, from the anchor i - s + 1 (`EagleHead.forward_ttt`), so row
    j supervises position P_j - 1 at each step s = 1..``steps`` whose anchor
    P_j - s is inside the history: the head is re-run with gradients over
    a window of the last ``window`` positions (the context beyond it is dropped;
    the drafter's public ``ttt_hidden`` / ``draft_logits``: one right-padded
    forward per mini-batch, the LM head only at the supervised rows). Loss: the
    cross-entropy of `FeatureHeadObjective`, averaged over supervised outputs.

    Raises:
        ValueError: another drafter kind; window, steps or top_m < 1.
    """

    def __init__(self, drafter, top_m: int = 32, window: int = 32, steps: int = 2) -> None:
        from specloop.realmodels.heads.eagle_drafter import EagleDrafter
        if not isinstance(drafter, EagleDrafter):
            raise ValueError(f"EagleObjective needs an EAGLE drafter, got {type(drafter).__name__}")
        if min(int(top_m), int(window), int(steps)) < 1:
            raise ValueError(f"top_m, window and steps must be >= 1, got {top_m}, {window}, {steps}")
        self.drafter = drafter
        self.top_m, self.window, self.steps = int(top_m), int(window), int(steps)
        self._t2d = drafter.target_to_draft.cpu()
        self._feats: list[torch.Tensor] = []
        self._next: list[int] = []

    def reset(self, prompt_ids: torch.Tensor, target_hidden=None) -> None:
        """Seed the feature history with the prefill's features (positions 0..L-2)."""
        self._feats, self._next = [], []
        if target_hidden is not None and prompt_ids.numel() > 1:
            self._append(target_hidden, prompt_ids[1:])

    def _append(self, hidden, next_tokens: torch.Tensor) -> int:
        """Append (feature, next token) pairs; returns how many old entries were
        dropped to keep the history bounded."""
        feats = torch.cat([h.detach().float().cpu().clone() for h in hidden], -1)
        n = min(int(feats.shape[0]), int(next_tokens.shape[0]))
        self._feats.extend(feats[:n].unbind(0))
        self._next.extend(int(t) for t in next_tokens[:n])
        keep = self.window + self.steps + 64
        if len(self._feats) <= 2 * keep:
            return 0
        drop = len(self._feats) - keep
        del self._feats[:drop], self._next[:drop]
        return drop

    def collect(self, feedback: VerifyFeedback, context_ids: torch.Tensor | None = None) -> EagleSample | None:
        if feedback.target_hidden is None:
            return None
        p0 = len(self._feats)                 # history index of the old pending token
        p0 -= self._append(feedback.target_hidden, feedback.committed_tokens)
        a = int(feedback.target_logits.shape[0]) - 1
        pairs = [(s, p0 + j - 1, j) for s in range(1, self.steps + 1) for j in range(a + 1)
                 if p0 + j - s >= 0 and p0 + j - 1 < len(self._feats)]
        if not pairs:
            return None
        lo = max(0, min(i for _, i, _ in pairs) - self.window)
        hi = max(i for _, i, _ in pairs) + 1
        rows, probs = _sparse_targets(feedback.target_logits, self._t2d, self.top_m)
        sel = [j for _, _, j in pairs]
        rejected = feedback.num_accepted < feedback.proposal.depth
        return EagleSample(torch.stack(self._feats[lo:hi]), torch.tensor(self._next[lo:hi]),
                           torch.tensor([s for s, _, _ in pairs]), torch.tensor([i - lo for _, i, _ in pairs]),
                           rows[sel], probs[sel], bool(rejected))

    def _sums(self, samples: list[EagleSample]) -> tuple[torch.Tensor, list[int]]:
        """One padded forward for the whole batch: windows right-padded to the
        longest (the head is causal, so padding changes no real row), the LM head
        applied only at the supervised rows of each step."""
        steps = max(int(smp.steps.max()) for smp in samples)
        width = max(int(smp.features.shape[0]) for smp in samples)
        feats = samples[0].features.new_zeros(len(samples), width, samples[0].features.shape[1])
        toks = torch.zeros(len(samples), width, dtype=torch.long)
        for b, smp in enumerate(samples):
            n = int(smp.features.shape[0])
            feats[b, :n], toks[b, :n] = smp.features, smp.next_tokens
        hidden = self.drafter.ttt_hidden(feats, toks, steps)
        device = hidden[0].device
        sums = torch.zeros(len(samples), dtype=torch.float32, device=device)
        for s in range(1, steps + 1):
            parts = [(b, smp.steps == s) for b, smp in enumerate(samples)]
            parts = [(b, mask) for b, mask in parts if bool(mask.any())]
            if not parts:
                continue
            batch = torch.cat([torch.full((int(mask.sum()),), b, dtype=torch.long) for b, mask in parts])
            index = torch.cat([samples[b].index[mask] for b, mask in parts])
            rows = torch.cat([samples[b].target_rows[mask] for b, mask in parts]).to(device)
            probs = torch.cat([samples[b].target_probs[mask] for b, mask in parts]).to(device)
            logits = self.drafter.draft_logits(hidden[s - 1][batch.to(device), index.to(device)])
            logp = torch.log_softmax(logits.float(), -1)
            sums = sums.index_add(0, batch.to(device), _row_cross_entropy(logp, rows, probs))
        return sums, [int(smp.steps.numel()) for smp in samples]


def objective_for(drafter, **options):
    """The online objective of a drafter.

    Raises:
        ValueError: a drafter kind without an online objective (names what is missing).
    """
    from specloop.realmodels.heads.head_drafting import FeatureHeadDrafter
    from specloop.realmodels.heads.small_lm import SmallLMDraftDrafter
    if isinstance(drafter, FeatureHeadDrafter):
        return FeatureHeadObjective(drafter, **options)
    if isinstance(drafter, SmallLMDraftDrafter):
        return SmallLMObjective(drafter, **options)
    from specloop.realmodels.heads.eagle_drafter import EagleDrafter
    if isinstance(drafter, EagleDrafter):
        return EagleObjective(drafter, **options)
    raise ValueError(f"no online objective for drafter {getattr(drafter, 'name', type(drafter).__name__)!r}: "
                     "online updates exist for the feature heads (hydra, medusa), EAGLE / EAGLE-3 "
                     "heads and the distilled small LM (small-lm)")


# ----------------------------------------------------------------------------- learners
def make_learner(kind: str, lr: float, *, num_learners: int = 3, meta_lr: float = 10.0,
                 osd_update_every: int = 8, osd_epochs: int = 1, seed: int = 0):
    """A learner of `specloop.strategies` for the draft's parameters.

    Args:
        kind: "ogd" (projected OGD), "opt" (optimistic OGD, Eq. 3), "ens" (Hedge
            ensemble, N base learners with geometric rates lr * 2^i, App. B: N=3,
            epsilon=10), "opt-ens" (optimism + ensemble, App. C.3), "osd" (OSD
            distillation with Adam, every ``osd_update_every`` rounds).
        lr: base step size (smallest rate of an ensemble).

    Raises:
        ValueError: unknown kind or bad hyper-parameters.
    """
    from specloop.strategies import (OGD, HedgeEnsemble, OptimisticEnsemble, OptimisticOGD, OSDDistillation,
                                     geometric_learning_rates)
    if kind == "ogd":
        return OGD(lr, seed=seed)
    if kind == "opt":
        return OptimisticOGD(lr, seed=seed)
    if kind == "ens":
        return HedgeEnsemble(geometric_learning_rates(lr, num_learners), meta_lr=meta_lr, seed=seed)
    if kind == "opt-ens":
        return OptimisticEnsemble(geometric_learning_rates(lr, num_learners), meta_lr=meta_lr, seed=seed)
    if kind == "osd":
        return OSDDistillation(lr, update_every=osd_update_every, inner_epochs=osd_epochs, batch_size=1,
                               optimizer="adam", max_buffer=4096, seed=seed)
    raise ValueError(f"unknown learner {kind!r}; choose from {LEARNER_KINDS}")


DEFAULT_LR = {"ogd": 2e-3, "opt": 2e-3, "ens": 1e-3, "opt-ens": 1e-3, "osd": 3e-4}


@dataclass(frozen=True)
class OnlineConfig:
    """Online-adaptation settings.

    Attributes:
        learner: one of `LEARNER_KINDS`.
        lr: base step size (None = `DEFAULT_LR` of the learner).
        mode: "round" (micro-updates from the replay buffer) or "chunk" (update at
            `end_chunk`, ``epochs`` passes).
        update_every: rounds between micro-updates (round mode), >= 1.
        batch_size: samples per learner step, >= 1.
        buffer_size: replay-buffer capacity (samples), >= 1.
        epochs: passes over a chunk's samples (chunk mode), >= 1.
        num_learners, meta_lr: ensemble N and epsilon (App. B: 3 and 10).
        background: run updates on a worker thread (App. B.2).
        top_m: target tokens kept per verified position.
        osd_interval: OSD distils every this many learner steps (round mode;
            chunk mode distils every step, i.e. every mini-batch).
        precondition: "none" (the learner sees raw gradients) or "rms" (adaptive
            OGD: every gradient the learner sees -- played point and oracle points --
            is divided elementwise by sqrt(v) + 1e-8, v the bias-corrected running
            mean of squared played-point gradients with decay ``rms_decay``; RMSProp /
            Adam's second-moment scaling without momentum, so ``lr`` is the per-element
            step, the paper's EAGLE / EAGLE-3 set-up uses Adam at 3e-5..4e-4, App. B.10).
        rms_decay: beta_2 of the running mean, in (0, 1).
        seed: seeds the replay sampling and the learner.
    """

    learner: str = "ogd"
    lr: float | None = None
    mode: str = "round"
    update_every: int = 1
    batch_size: int = 4
    buffer_size: int = 256
    epochs: int = 2
    num_learners: int = 3
    meta_lr: float = 10.0
    background: bool = False
    top_m: int = 32
    osd_interval: int = 8
    precondition: str = "none"
    rms_decay: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.learner not in LEARNER_KINDS:
            raise ValueError(f"unknown learner {self.learner!r}; choose from {LEARNER_KINDS}")
        if self.mode not in ("round", "chunk"):
            raise ValueError(f"mode must be 'round' or 'chunk', got {self.mode!r}")
        for name in ("update_every", "batch_size", "buffer_size", "epochs", "num_learners", "top_m", "osd_interval"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"OnlineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.precondition not in PRECONDITIONERS:
            raise ValueError(f"precondition must be one of {PRECONDITIONERS}, got {self.precondition!r}")
        if not (0.0 < float(self.rms_decay) < 1.0):
            raise ValueError(f"rms_decay must be in (0, 1), got {self.rms_decay}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")

    @property
    def step_size(self) -> float:
        return float(self.lr if self.lr is not None else DEFAULT_LR[self.learner])


# ----------------------------------------------------------------------------- adapter
class OnlineAdapter:
    """Owns the objective, the learner, the replay buffer and the update schedule.

    Args:
        drafter: the inner drafter (its ``parameters()`` are updated in place).
        config: `OnlineConfig`.

    Attributes:
        train_seconds: wall seconds spent in updates (foreground and background).
        num_steps: learner steps taken.
        last_loss: the mini-batch loss of the latest learner step (NaN before any, and
            for OSD, whose steps do not evaluate the played point).
    """

    def __init__(self, drafter, config: OnlineConfig) -> None:
        self.drafter = drafter
        self.config = config
        self.objective = objective_for(drafter, top_m=config.top_m)
        self.params = [p for p in drafter.parameters()]
        if not self.params:
            raise ValueError(f"drafter {getattr(drafter, 'name', '?')!r} has no trainable parameters")
        self.learner = make_learner(config.learner, config.step_size, num_learners=config.num_learners,
                                    meta_lr=config.meta_lr, seed=config.seed,
                                    osd_update_every=config.osd_interval if config.mode == "round" else 1)
        self.rng = np.random.default_rng(config.seed)
        self.buffer: list[FeatureSample] = []
        self.chunk_samples: list[FeatureSample] = []
        self.osd_pending: list[FeatureSample] = []
        self.rounds = 0
        self.num_steps = 0
        self.train_seconds = 0.0
        self.last_loss = math.nan
        self.lock = threading.RLock()
        self._queue: queue.Queue | None = None
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None
        self._sample_losses: tuple[Any, float] | None = None   # (first sample, its loss) of the last _loss_grad
        self._played_losses: tuple[Any, float] | None = None   # the same at the played point of the last _step
        self.rms: list[torch.Tensor] | None = None    # running mean of squared played gradients ("rms")
        self.rms_steps = 0

    # -- loss / gradient ---------------------------------------------------------
    def _loss_grad(self, samples: list[FeatureSample]) -> tuple[float, list[torch.Tensor]]:
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
        out = [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(self.params, grads)]
        self._sample_losses = (samples[0], float(per_sample[0]))
        return float(loss.detach()), out

    def sample_loss(self, sample) -> float:
        """f_t(w) of one round's sample at the current parameters: its mean
        cross-entropy over the verified positions (no gradient; under the drafting
        lock, so a background update is not half-written). NaN for None."""
        if sample is None:
            return math.nan
        with self.lock, torch.no_grad():
            return float(self.objective.loss([sample]))

    def _loss_grad_at(self, values: list[torch.Tensor], samples: list[FeatureSample]):
        """f and (preconditioned, `_precondition`) grad f at other parameter values
        (the learners' oracle)."""
        saved = [p.detach().clone() for p in self.params]
        try:
            self._write(values)
            loss, grads = self._loss_grad(samples)
            return loss, self._precondition(grads)
        finally:
            self._write(saved)

    def _update_rms(self, grads: list[torch.Tensor]) -> None:
        """Fold a played-point gradient into the running second moment ("rms")."""
        if self.config.precondition != "rms":
            return
        beta = float(self.config.rms_decay)
        if self.rms is None:
            self.rms = [torch.zeros_like(g) for g in grads]
        for v, g in zip(self.rms, grads):
            v.mul_(beta).addcmul_(g, g, value=1.0 - beta)
        self.rms_steps += 1

    def _precondition(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """grads / (sqrt(v_hat) + 1e-8) under "rms" (v_hat bias-corrected); unchanged
        under "none" or before any played gradient was seen."""
        if self.config.precondition != "rms" or self.rms is None:
            return grads
        correction = 1.0 - float(self.config.rms_decay) ** self.rms_steps
        return [g / ((v / correction).sqrt() + 1e-8) for g, v in zip(grads, self.rms)]

    def _write(self, values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(self.params, values):
                p.copy_(torch.as_tensor(v, dtype=p.dtype, device=p.device))

    def _step(self, samples: list[FeatureSample]) -> None:
        """One learner step on ``samples``; parameters written in place (under the
        drafting lock). OSD sees oracles only for samples with a rejection."""
        t0 = time.perf_counter()
        if self.config.learner == "osd":   # OSD ignores the played point's gradient: skip it
            loss, grads = math.nan, [torch.zeros_like(p) for p in self.params]
        else:
            loss, grads = self._loss_grad(samples)
            self._played_losses = self._sample_losses   # at w_t (oracle calls below evaluate elsewhere)
            self._update_rms(grads)
            grads = self._precondition(grads)
        played = [p.detach().clone() for p in self.params]
        if self.config.learner == "osd":
            new = self._osd_step(played, grads, loss, samples)
        else:
            new = self.learner.step(played, grads, loss,
                                    oracle=lambda values, batch=list(samples): self._loss_grad_at(values, batch))
        if not all(bool(torch.isfinite(torch.as_tensor(v)).all()) for v in new):
            raise ValueError(f"online update produced non-finite draft parameters (learner "
                             f"{self.config.learner!r}, lr {self.config.step_size}); lower the learning rate")
        with self.lock:
            self._write(new)
        self.last_loss = loss
        self.num_steps += 1
        self.train_seconds += time.perf_counter() - t0

    def _osd_step(self, played, grads, loss, samples: list[FeatureSample]):
        """OSD: buffer one oracle per new rejected sample (round mode: the newest
        sample only, replayed ones were buffered already), then let the learner
        distil when due (its ``update_every``)."""
        fresh = samples[:1] if self.config.mode == "round" else samples
        rejected = [s for s in fresh if s.rejected]
        before = self.learner.num_updates
        for s in rejected:
            self.osd_pending.append(s)
            self.learner.add_feedback(oracle=self._sample_oracle(s))
        new = self.learner.step(played, grads, loss, oracle=None)
        if self.learner.num_updates != before:
            self.osd_pending = []
        return new

    # -- schedule -------------------------------------------------------------------
    def record(self, sample: FeatureSample | None) -> float:
        """Add a round's sample and run a micro-update when one is due.

        Returns:
            f_t(w_t): the round's own loss (`sample_loss`) at the parameters that
            drafted the round, before any update this call makes (``background``:
            at the parameters current when the round ends, as a queued update may
            have landed since the draft). A foreground gradient step on a
            mini-batch headed by the sample yields it from the same forward pass;
            otherwise (chunk mode, OSD, background, no update due) it costs one
            forward pass without gradient, inside the round's ``update_time``.
            NaN when the round gave no sample.
        """
        self.rounds += 1
        if sample is None:
            return math.nan
        self.buffer.append(sample)
        if len(self.buffer) > self.config.buffer_size:
            del self.buffer[0]
        if self.config.mode == "chunk":
            self.chunk_samples.append(sample)
            return self.sample_loss(sample)
        if self.rounds % self.config.update_every != 0:
            return self.sample_loss(sample)
        if self.config.background or self.config.learner == "osd":
            loss = self.sample_loss(sample)             # before the update can move w
            self._submit(self._replay_batch())
            return loss
        self._played_losses = None
        self._submit(self._replay_batch())              # foreground: newest sample first
        got = self._played_losses
        return got[1] if got is not None and got[0] is sample else self.sample_loss(sample)

    def _replay_batch(self) -> list[FeatureSample]:
        newest = self.buffer[-1]
        older = self.buffer[:-1]
        extra = min(self.config.batch_size - 1, len(older))
        picks = self.rng.choice(len(older), size=extra, replace=False) if extra else []
        return [newest] + [older[int(i)] for i in picks]

    def end_chunk(self) -> float:
        """Chunk mode: ``epochs`` shuffled passes over the chunk's samples. Waits for
        background updates. Returns the seconds this call took."""
        t0 = time.perf_counter()
        if self.config.mode == "chunk" and self.chunk_samples:
            samples, self.chunk_samples = self.chunk_samples, []
            bs = self.config.batch_size
            for _ in range(self.config.epochs):
                order = self.rng.permutation(len(samples))
                for start in range(0, len(samples), bs):
                    self._submit([samples[int(i)] for i in order[start:start + bs]])
        self.wait()
        return time.perf_counter() - t0

    # -- background worker (App. B.2) ------------------------------------------------
    def _submit(self, batch: list[FeatureSample]) -> None:
        if not self.config.background:
            self._step(batch)
            return
        if self._worker is None:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._work, name="specloop-online-update", daemon=True)
            self._worker.start()
        self._queue.put(batch)

    def _work(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    self._step(batch)
            except BaseException as exc:  # surfaced by wait()
                self._error = exc
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        """Block until queued background updates are done; re-raise a worker error."""
        if self._queue is not None:
            self._queue.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"background draft update failed: {error}") from error

    def close(self) -> None:
        """Finish queued updates and stop the worker thread."""
        if self._worker is not None:
            self.wait()
            self._queue.put(None)
            self._worker.join()
            self._worker, self._queue = None, None

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: parameters, learner state, replay
        buffer, pending chunk / OSD samples, generator, counters. Waits for
        background updates first."""
        self.wait()
        return {"params": [p.detach().cpu().clone() for p in self.params],
                "learner": self.learner.state_dict(),
                "buffer": [s.to_dict() for s in self.buffer],
                "chunk_samples": [s.to_dict() for s in self.chunk_samples],
                "osd_pending": [s.to_dict() for s in self.osd_pending],
                "rng": self.rng.bit_generator.state, "rounds": self.rounds, "num_steps": self.num_steps,
                "train_seconds": self.train_seconds, "config": dict(self.config.__dict__),
                "rms": None if self.rms is None else [v.detach().cpu().clone() for v in self.rms],
                "rms_steps": self.rms_steps}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output.

        Raises:
            ValueError: parameters of other shapes, or a different learner kind.
        """
        if state["config"]["learner"] != self.config.learner:
            raise ValueError(f"checkpoint is for learner {state['config']['learner']!r}, not {self.config.learner!r}")
        shapes = [tuple(p.shape) for p in self.params]
        if [tuple(t.shape) for t in state["params"]] != shapes:
            raise ValueError("checkpoint parameters do not match the drafter's parameter shapes")
        self._write(state["params"])
        self.learner.load_state_dict(state["learner"])
        self.buffer = [FeatureSample.from_dict(d) for d in state["buffer"]]
        self.chunk_samples = [FeatureSample.from_dict(d) for d in state["chunk_samples"]]
        self.osd_pending = [FeatureSample.from_dict(d) for d in state["osd_pending"]]
        if self.config.learner == "osd":   # buffered oracle closures are not saved: rebuild them
            for s in self.osd_pending:
                self.learner.add_feedback(oracle=self._sample_oracle(s))
        self.rng.bit_generator.state = state["rng"]
        self.rounds, self.num_steps = int(state["rounds"]), int(state["num_steps"])
        self.train_seconds = float(state["train_seconds"])
        rms = state.get("rms")
        self.rms = None if rms is None else [v.to(p.device) for v, p in zip(rms, self.params)]
        self.rms_steps = int(state.get("rms_steps", 0))

    def _sample_oracle(self, sample: FeatureSample) -> Callable:
        return lambda values, s=sample: self._loss_grad_at(values, [s])


# ----------------------------------------------------------------------------- drafter
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
        round_loss: the latest entry (NaN before the first round): what a decoder
            copies into the round's `RoundRecord.loss`.
    """

    def __init__(self, inner, adapter: OnlineAdapter) -> None:
        self.inner = inner
        self.adapter = adapter
        self.name = f"online-{getattr(inner, 'name', 'drafter')}"
        self.needs_target_hidden = tuple(getattr(inner, "needs_target_hidden", ()))
        self.round_losses: list[float] = []
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

    def observe(self, feedback: VerifyFeedback) -> None:
        sample = self.adapter.objective.collect(feedback, self._context)
        self._context = None
        self.inner.observe(feedback)
        self.round_losses.append(float(self.adapter.record(sample)))

    @property
    def round_loss(self) -> float:
        return self.round_losses[-1] if self.round_losses else math.nan

    def parameters(self) -> list[torch.Tensor]:
        return self.inner.parameters()


# ----------------------------------------------------------------------------- files
def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` with ``torch.save`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a `save_checkpoint` file.

    Raises:
        FileNotFoundError: no such file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no online checkpoint at {path}")
    return torch.load(path, weights_only=False)
