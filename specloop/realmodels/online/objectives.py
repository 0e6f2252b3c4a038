"""The online objectives f_t(w) of the drafters (`specloop.realmodels.online`): the
cross-entropy -sum_x p_target(x) log q_draft(x; w) at every verified position of a
round, against the target's temperature-1 distribution truncated to its top ``top_m``
tokens and restricted to the draft's reduced vocabulary (`samples.sparse_targets`;
OnlineSpec Sec. 3; FR-Spec / EAGLE-3
train the same way). One objective per drafter family: feature heads (Medusa / Hydra),
the distilled small LM, EAGLE / EAGLE-3 heads (training-time test)."""
from __future__ import annotations

import math

import torch

from specloop.realmodels.drafters.base import VerifyFeedback
from specloop.realmodels.online.samples import ContextSample, EagleSample, FeatureSample, sparse_targets

__all__ = ["FeatureHeadObjective", "SmallLMObjective", "EagleObjective", "objective_for"]


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
        rows, probs = sparse_targets(feedback.target_logits[:m], self.drafter.target_to_draft, self.top_m)
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
        rows, probs = sparse_targets(feedback.target_logits[:m], self.drafter.target_to_draft, self.top_m)
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
        rows, probs = sparse_targets(feedback.target_logits, self._t2d, self.top_m)
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
