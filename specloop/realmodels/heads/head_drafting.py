"""Chain and tree drafting for feature heads (Medusa, Hydra) behind the decoder's
`specloop.realmodels.drafters.base.Drafter` interface.

A head drafter keeps one target feature ``h_t`` (last-layer hidden state, post final
norm) and the pending token x_{t+1}; depth j of a draft (j = 0 .. K-1) is produced by
``expand(states, tokens, j) -> (states, logits)`` over a batch of frontier nodes.

* chain (``plan.tree is None``): k = min(num_draft_tokens, K, max_tokens) steps; each
  token is the argmax (greedy) or a draw from ``q_draft`` = `processed_probs` of the
  step's logits (Leviathan et al. 2023); rows are reported in the target vocabulary.
* static tree (``TreePlan.branching``): every node at depth j gets the top-b_j
  children of its own distribution (SpecInfer / Medusa tree attention).
* dynamic tree (``TreePlan.top_k``): EAGLE-2 (Li et al. 2024, Sec. 4): each frontier
  node proposes its top_k children, the top_k children by cumulative draft
  probability form the next frontier and join the tree.

Tree children are chosen deterministically (top-b without replacement), so trees
are reported with ``q_draft=None`` (verified as point masses: lossless for any
sampling config, see the interface's contract). ``verify_size`` / ``max_tokens``
keep the best nodes by cumulative draft probability, closed under ancestors.

Policy hooks: the policy's optional ``continue_drafting(DraftStep)`` is asked after
every draft step (chain and tree) and may stop early; its optional
``verify_size(TreeCandidates)`` sets V once a tree is drafted (LTD's depth and size
policies; `drafters.base.policy_continues` / `policy_verify_size`).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from specloop.realmodels.drafters.base import (BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback,
                                              policy_continues, policy_verify_size)
from specloop.realmodels.heads.hydra import HydraHeads, ReducedVocabHead
from specloop.realmodels.heads.medusa import MedusaHeads
from specloop.realmodels.sampling import check_finite, draft_index, processed_probs

__all__ = ["FeatureHeadDrafter", "HydraDrafter", "MedusaDrafter", "draft_chain", "draft_tree", "prune_tree",
           "read_tree_levels"]

Expand = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def draft_chain(expand: Expand, state: torch.Tensor, pending: int, k: int, request: DraftRequest,
                vocab: ReducedVocabHead) -> DraftProposal:
    """Draft a chain of k tokens; returns q_draft (k, V_target) float32 on the heads'
    device. The tokens stay on the device (the session reads them in one copy); a
    greedy step reads nothing back, a sampled step reads its row for the draw, and
    the path probability is read only for a policy hook that looks at it."""
    tokens, rows, raw = [], [], []
    path = None                           # cumulative draft probability (float64, device)
    token = torch.full((1,), int(pending), dtype=torch.long, device=state.device)
    for depth in range(k):
        state, logits = expand(state, token, depth)
        raw.append(logits[0])
        probs = processed_probs(logits[0], request.sampling, check=False)
        tid = draft_index(probs, request.sampling, request.generator)
        rows.append(probs)
        token = vocab.draft_to_target.index_select(0, tid)
        tokens.append(token)
        parent_path = path
        own = probs.gather(0, tid).double()
        path = own if path is None else path * own
        if depth + 1 < k and not policy_continues(
                request, depth + 1, lambda: [float(path)],
                lambda: 1.0 if parent_path is None else float(parent_path)):
            break
    if not tokens:
        return DraftProposal.empty(device="cpu")
    check_finite(torch.stack(raw), "model")          # every step's logits, in one read
    q = vocab.to_target_probs(torch.stack(rows)).float()
    return DraftProposal.chain(torch.cat(tokens), q)


def draft_tree(expand: Expand, state: torch.Tensor, pending: int, depth_cap: int, request: DraftRequest,
               vocab: ReducedVocabHead) -> DraftProposal:
    """Draft a static (branching) or EAGLE-2 (top_k) tree up to ``depth_cap`` levels.

    Selection runs on the heads' device; the drafted tokens, parents and cumulative
    log-probabilities come to the host in one copy at the end (and per level only for
    a policy hook that reads the probabilities), where `prune_tree` keeps the
    verified nodes."""
    plan = request.plan.tree
    dev = state.device
    toks, pars, cums = [], [], []         # per level, on the device
    count = 0
    frontier = torch.full((1,), -1, dtype=torch.long, device=dev)   # node indices (-1 = the pending token)
    front_cum = torch.zeros(1, dtype=torch.float64, device=dev)
    front_tok = torch.full((1,), int(pending), dtype=torch.long, device=dev)
    states = state
    drafted_depth = 0
    for depth in range(depth_cap):
        states, logits = expand(states, front_tok, depth)
        logp = torch.log_softmax(logits.double(), -1)           # (B, V_d)
        width = plan.top_k if plan.top_k is not None else plan.branching[depth]
        width = min(int(width), logp.shape[-1])
        top_lp, top_id = logp.topk(width, dim=-1)                 # (B, width)
        cand = (front_cum[:, None] + top_lp).reshape(-1)
        if plan.top_k is not None and cand.numel() > plan.top_k:
            keep = cand.topk(plan.top_k).indices.sort().values
        else:
            keep = torch.arange(cand.numel(), device=dev)
        src = keep // width
        new_tok = vocab.draft_to_target[top_id.reshape(-1)[keep]]
        new_cum = cand[keep]
        toks.append(new_tok)
        pars.append(frontier[src])
        cums.append(new_cum)
        new_idx = torch.arange(count, count + int(keep.numel()), device=dev)
        count += int(keep.numel())
        drafted_depth = depth + 1
        if count >= request.max_tokens and plan.verify_size is None:
            break
        parent_cum = front_cum
        if not policy_continues(request, drafted_depth, lambda: [math.exp(c) for c in new_cum.tolist()],
                                lambda: max(math.exp(c) for c in parent_cum.tolist()) if depth else 1.0):
            break
        frontier, front_cum, front_tok = new_idx, new_cum, new_tok
        states = states[src]
    tokens, parents, cum = read_tree_levels(toks, pars, cums)
    default = count if plan.verify_size is None else int(plan.verify_size)
    budget = min(request.max_tokens, policy_verify_size(request, drafted_depth, lambda: [math.exp(c) for c in cum],
                                                        default, count=count))
    return prune_tree(tokens, parents, cum, budget, "cpu")


def read_tree_levels(toks: list[torch.Tensor], pars: list[torch.Tensor],
                     cums: list[torch.Tensor]) -> tuple[list[int], list[int], list[float]]:
    """A tree drafted level by level on a device, read to the host in one copy.

    Args:
        toks, pars, cums: per level, int64 (n_d,) target token ids, int64 (n_d,) parent
            node indices (-1 = the pending token) and float64 (n_d,) cumulative draft
            log-probabilities, all on one device.

    Returns:
        (tokens, parents, log_cum): lists of the n = sum n_d nodes in drafting order.
    """
    count = sum(int(t.numel()) for t in toks)
    packed = torch.cat([torch.cat(toks).double(), torch.cat(pars).double(), torch.cat(cums)]).tolist()
    return ([int(t) for t in packed[:count]], [int(p) for p in packed[count:2 * count]],
            packed[2 * count:])


def prune_tree(tokens: list[int], parents: list[int], log_cum: list[float], budget: int,
               device: torch.device | str) -> DraftProposal:
    """Keep at most ``budget`` nodes with the highest cumulative log-probability,
    always together with their ancestors, in topological order (EAGLE-2's rerank)."""
    n = len(tokens)
    order = sorted(range(n), key=lambda i: (-log_cum[i], i))
    chosen: set[int] = set()
    for i in order:
        chain, j = [], i
        while j >= 0 and j not in chosen:
            chain.append(j)
            j = parents[j]
        if len(chosen) + len(chain) > budget:
            continue
        chosen.update(chain)
    full = DraftProposal(torch.tensor(tokens, dtype=torch.long, device=device),
                         torch.tensor(parents, dtype=torch.long, device=device), None,
                         torch.tensor(log_cum, dtype=torch.float64).exp())
    return full.subset(sorted(chosen))


class FeatureHeadDrafter(BaseDrafter):
    """Base for drafters driven by the target's last-layer feature (Medusa, Hydra).

    Args:
        heads: the head module (`HydraHeads` / `MedusaHeads`): its ``lm_head`` (a
            `ReducedVocabHead`) maps states to the draft vocabulary, its
            ``config.num_heads`` is the depth cap K, and its
            ``trainable_parameters()`` are what ``parameters()`` hands the learners.

    Subclasses set ``name`` and implement ``expand(states, tokens, depth)``. The
    root state is h_t itself, shape (1, d).

    The feature h_t is the target's hidden state of the token *before* the pending
    token (``needs_target_hidden = (-1,)``: transformers' last hidden state, which
    for Llama-family models is after the final norm, so that
    ``lm_head(h_t)`` gives the pending token's distribution).
    """

    needs_target_hidden: tuple[int, ...] = (-1,)
    vocab: ReducedVocabHead
    max_depth: int

    def __init__(self, heads) -> None:
        self.heads = heads.eval()
        self.vocab = heads.lm_head
        self.max_depth = heads.config.num_heads
        self._h: torch.Tensor | None = None
        self._pending: int | None = None

    def root_state(self, h: torch.Tensor) -> torch.Tensor:
        return h.reshape(1, -1)

    def parameters(self) -> list[torch.Tensor]:
        return self.heads.trainable_parameters()

    # -- online-training accessors (`specloop.realmodels.online`) ----------------
    @property
    def target_to_draft(self) -> torch.Tensor:
        """int64 (V_target,): the draft-vocabulary row of each target token id, -1 for
        ids outside the draft's reduced vocabulary."""
        return self.vocab.target_to_draft

    def feature_state(self) -> tuple[torch.Tensor, int] | None:
        """The root the next draft starts from: (h_t, pending token id), h_t a detached
        float32 CPU copy of shape (d,); None while no feature exists (before `reset`,
        or a one-token prompt's first round).

        An online learner reads it in its ``observe`` *before* this drafter observes
        the round: it is then the state the round's draft was made from (the input
        of the heads whose outputs the target just verified)."""
        if self._h is None or self._pending is None:
            return None
        return self._h.detach().float().cpu().clone(), int(self._pending)

    def unrolled_logits(self, h: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Draft logits of depths 0..m-1, teacher-forced on given tokens, differentiable
        w.r.t. ``parameters()`` (call under ``torch.enable_grad()`` to train).

        Depth j runs `expand` exactly as drafting does: Hydra's head j reads head
        j-1's state and the token at depth j (``tokens[:, j]``; the pending token at
        j = 0); Medusa's head j reads h_t only (tokens unused).

        Args:
            h: float (B, d) target features h_t (any device / float dtype; moved to
                the heads').
            tokens: int64 (B, m) target token ids fed at depths 0..m-1, 1 <= m <=
                ``max_depth``; rows may be padded with any valid id past their length.

        Returns:
            m tensors of logits (B, V_draft) over the reduced vocabulary, in the heads'
            dtype and device.

        Raises:
            ValueError: mismatched shapes, or m outside 1..max_depth.
        """
        if h.dim() != 2 or tokens.dim() != 2 or tokens.shape[0] != h.shape[0]:
            raise ValueError(f"need h (B, d) and tokens (B, m), got {tuple(h.shape)} and {tuple(tokens.shape)}")
        m = int(tokens.shape[1])
        if not 1 <= m <= self.max_depth:
            raise ValueError(f"{self.name}: {m} depths requested, the heads have 1..{self.max_depth}")
        weight = self.vocab.proj.weight
        states = h.to(weight.device, weight.dtype)
        tokens = tokens.to(weight.device).long()
        out = []
        for depth in range(m):
            states, logits = self.expand(states, tokens[:, depth], depth)
            out.append(logits)
        return out

    def expand(self, states: torch.Tensor, tokens: torch.Tensor, depth: int):  # pragma: no cover
        raise NotImplementedError

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden: tuple[torch.Tensor, ...] | None = None) -> None:
        """Start a prompt. ``target_hidden[0]``: (L-1, d) last-layer states of prompt_ids[:-1].

        Raises:
            ValueError: empty prompt, or hidden states missing / of the wrong length.
        """
        if prompt_ids.numel() == 0:
            raise ValueError(f"{self.name}: empty prompt")
        if prompt_ids.numel() == 1 and not target_hidden:
            self._h, self._pending = None, int(prompt_ids[-1])   # nothing prefilled yet
            return
        if target_hidden is None or len(target_hidden) == 0:
            raise ValueError(f"{self.name} needs the target's last hidden states at reset "
                             "(needs_target_hidden=(-1,)); the decoder passed none")
        hidden = target_hidden[0]
        if hidden.shape[0] != prompt_ids.shape[0] - 1:
            raise ValueError(f"{self.name}: got hidden states for {hidden.shape[0]} tokens, expected "
                             f"{prompt_ids.shape[0] - 1} (the prompt without its pending token)")
        self._h = hidden[-1].detach().clone() if hidden.shape[0] else None   # clone: not an inference tensor
        self._pending = int(prompt_ids[-1])

    def observe(self, feedback: VerifyFeedback) -> None:
        """Take h_t from the last verified token and the new pending token."""
        if feedback.target_hidden is None:
            raise ValueError(f"{self.name} needs VerifyFeedback.target_hidden (needs_target_hidden=(-1,))")
        self._h = feedback.target_hidden[0][-1].detach().clone()
        self._pending = int(feedback.committed_tokens[-1])

    @torch.no_grad()
    def propose(self, request: DraftRequest) -> DraftProposal:
        """Chain or tree from the current feature; empty when no feature exists yet
        (a one-token prompt's first round) or k = 0."""
        pending = int(request.ids[-1])
        if self._h is None or request.plan.num_draft_tokens == 0 or request.max_tokens <= 0:
            return DraftProposal.empty(device="cpu")
        if pending != self._pending:
            raise ValueError(f"{self.name}: request's pending token {pending} != observed {self._pending}; "
                             "reset/observe were not called in order")
        state = self.root_state(self._h)
        if request.plan.tree is None:
            k = min(request.plan.num_draft_tokens, self.max_depth, request.max_tokens)
            return draft_chain(self.expand, state, pending, k, request, self.vocab)
        cap = min(request.plan.tree.max_depth, request.plan.num_draft_tokens, self.max_depth)
        return draft_tree(self.expand, state, pending, cap, request, self.vocab)


class HydraDrafter(FeatureHeadDrafter):
    """`HydraHeads` behind the Drafter interface: depth j runs head j on the previous
    node's predicted feature and token. ``parameters()``: the heads' tensors."""

    name = "hydra"

    def __init__(self, heads: HydraHeads) -> None:
        super().__init__(heads)

    def expand(self, states: torch.Tensor, tokens: torch.Tensor, depth: int):
        return self.heads.step(depth, states, tokens)


class MedusaDrafter(FeatureHeadDrafter):
    """`MedusaHeads` behind the Drafter interface: every depth reads the same h_t
    (Medusa heads ignore earlier draft tokens). ``parameters()``: the heads' tensors."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads) -> None:
        super().__init__(heads)

    def expand(self, states: torch.Tensor, tokens: torch.Tensor, depth: int):
        return states, self.heads.head_logits(states, depth)
