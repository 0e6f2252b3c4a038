"""One round's training sample for the online objectives (`specloop.realmodels.online`):
the verified positions of a round with the target's sparse distribution at each of them
(OnlineSpec Algorithm 1, the feedback step), one dataclass per drafter family."""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["FeatureSample", "EagleSample", "ContextSample", "sample_from_dict", "sparse_targets"]


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
        """Rebuild any sample (`FeatureSample`, `EagleSample`, `ContextSample`) from
        its ``to_dict`` (`sample_from_dict`)."""
        return sample_from_dict(d)


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


def sparse_targets(logits: torch.Tensor, target_to_draft: torch.Tensor, top_m: int):
    """(m, V) target logits -> (rows (m, top_m) int64, probs (m, top_m) float32): the
    temperature-1 distribution's top ``top_m`` tokens over the whole target
    vocabulary, those inside the draft's reduced vocabulary kept (the others -1 with
    probability 0) and renormalised there. Rows with no mass inside the vocabulary
    get all -1.

    Truncating before restricting (not the top ``top_m`` *inside* the vocabulary)
    makes the targets a function of the target's top-``top_m`` list alone, so a
    stream replay that recorded only that list (`specloop.realmodels.streams.replay`) gives
    the learner exactly the decoder's targets; on SmolLM2 with a 5.9k-token Hydra
    vocabulary 97 % of rows have a top-32 token outside it, and the other order sent
    the replayed learner off the decoder's path within a few hundred updates. The
    mass lost (in-vocabulary tokens ranked below ``top_m``) is what any top-m
    truncation drops."""
    probs = torch.softmax(logits.float(), -1)
    top_p, top_id = probs.topk(min(top_m, probs.shape[-1]), dim=-1)
    rows = target_to_draft.to(top_id.device)[top_id]
    valid = (top_p > 0) & (rows >= 0)
    top_p = torch.where(valid, top_p, torch.zeros_like(top_p))
    mass = top_p.sum(-1, keepdim=True)
    top_p = torch.where(mass > 0, top_p / mass.clamp_min(1e-30), top_p)
    rows = torch.where(valid, rows, torch.full_like(rows, -1))
    return rows.cpu(), top_p.cpu()




def sample_from_dict(d: dict):
    """Rebuild a `FeatureSample`, `EagleSample` or `ContextSample` from its ``to_dict``
    (the ``kind`` key; no kind = a feature sample, as checkpoints before kinds wrote)."""
    if d.get("kind") == "eagle":
        return EagleSample(d["features"], d["next_tokens"], d["steps"], d["index"], d["target_rows"],
                           d["target_probs"], bool(d["rejected"]))
    if d.get("kind") == "context":
        return ContextSample(d["ids"], int(d["start"]), d["target_rows"], d["target_probs"],
                             bool(d["rejected"]))
    return FeatureSample(d["h"], d["tokens"], d["target_rows"], d["target_probs"], bool(d["rejected"]))
