"""EAGLE / EAGLE-3 heads behind the decoder's `Drafter` interface.

State per prompt: the head's KV cache over positions 0..L-2 computed from the
target's *true* features (position i reads (f_i, x_{i+1}); features arrive with the
prefill at ``reset`` and with every ``observe``), absorbed lazily at ``propose``.
The root output h_{L-2} gives the first draft token's distribution; deeper nodes
are processed at positions L-1, L, ... with their parent's head output as feature
(EAGLE's feature feedback), attending to the true cache plus their own ancestors
(tree attention). All candidate tokens come from the reduced vocabulary and are
mapped back to target ids.

* chain (``plan.tree is None``): k = min(num_draft_tokens, max_tokens) steps; greedy
  argmax or a draw from q_draft = `processed_probs` of the step's logits; rows are
  reported in the target vocabulary (Leviathan et al. 2023).
* static tree (``TreePlan.branching``): each node at depth d gets its top-b_d
  children; EAGLE-2 dynamic tree (``TreePlan.top_k``, Li et al. 2024 Sec. 4): each
  depth expands the top_k newest nodes by cumulative draft probability, each with its
  top_k children. The verified set is the best ``verify_size`` (and ``max_tokens``)
  nodes by cumulative draft log-probability, which is closed under ancestors. Tree
  children are deterministic, so trees are reported with ``q_draft=None``.

Policy hooks (`specloop.strategies.base.DraftPolicy`): after every draft step the
policy's optional ``continue_drafting(DraftStep)`` may stop drafting before the depth
cap (LTD's depth policy), and after a tree is drafted its optional
``verify_size(TreeCandidates)`` sets V (LTD's size policy); see
`drafters.base.policy_continues` / `policy_verify_size`.
"""
from __future__ import annotations

import math

import torch

from specloop.realmodels.drafters.base import (BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback,
                                              policy_continues, policy_verify_size)
from specloop.realmodels.heads.common import ReducedVocab
from specloop.realmodels.heads.eagle import EagleHead
from specloop.realmodels.sampling import processed_probs, sample_from

__all__ = ["EagleDrafter", "select_nodes"]


def select_nodes(logcum: list[float], budget: int) -> list[int]:
    """Indices (ascending = topological) of the ``budget`` nodes with the highest
    cumulative log-probability, ties to the earlier node, so the set is closed under
    ancestors whenever every child's log-probability is <= its parent's."""
    order = sorted(range(len(logcum)), key=lambda i: (-logcum[i], i))
    return sorted(order[:max(0, budget)])


class EagleDrafter(BaseDrafter):
    """Drafter over a trained `EagleHead`.

    Args:
        head: the trained head (eval mode; float32 on CPU by default).
        vocab: its `ReducedVocab`.
        name: report name ("eagle" / "eagle3").
    """

    def __init__(self, head: EagleHead, vocab: ReducedVocab, name: str = "eagle") -> None:
        if vocab.size != head.config.draft_vocab_size:
            raise ValueError(f"vocabulary size {vocab.size} != head's {head.config.draft_vocab_size}")
        self.head = head.eval()
        self.vocab = vocab
        self.name = name
        self.needs_target_hidden = tuple(head.config.feature_layers)
        self._dtype = head.q_proj.weight.dtype
        self._device = head.q_proj.weight.device
        self._d2t = vocab.d2t.to(self._device)
        self.reset(torch.zeros(1, dtype=torch.long))

    # ---------------------------------------------------------------- state
    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        self._cache = self.head.empty_cache()
        self._pending_feats: list[torch.Tensor] = []
        self._pending_next: list[torch.Tensor] = []
        self._root_h = None
        self._root_logits = None
        if target_hidden is not None and prompt_ids.numel() > 1:
            self._push(target_hidden, prompt_ids[1:])

    def _push(self, hidden: tuple[torch.Tensor, ...], next_tokens: torch.Tensor) -> None:
        if len(hidden) != len(self.needs_target_hidden):
            raise ValueError(f"expected {len(self.needs_target_hidden)} hidden-state tensors, got {len(hidden)}")
        feats = torch.cat([h.to(device=self._device, dtype=self._dtype) for h in hidden], -1)
        n = min(int(feats.shape[0]), int(next_tokens.shape[0]))
        if n:
            self._pending_feats.append(feats[:n])
            self._pending_next.append(next_tokens[:n].to(self._device).long())

    def observe(self, feedback: VerifyFeedback) -> None:
        if feedback.target_hidden is None:
            raise ValueError(f"{self.name} drafter needs the target's hidden states in VerifyFeedback")
        self._push(feedback.target_hidden, feedback.committed_tokens)

    def parameters(self) -> list[torch.Tensor]:
        return self.head.trainable()

    # -- online-training accessors (`specloop.realmodels.online`) ----------------
    @property
    def target_to_draft(self) -> torch.Tensor:
        """int64 (V_target,): the draft-vocabulary row of each target token id, -1 for
        ids outside the draft's reduced vocabulary."""
        return self.vocab.t2d

    def ttt_logits(self, features: torch.Tensor, next_tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Draft logits of EAGLE-3's training-time test over teacher-forced windows
        (`EagleHead.forward_ttt`), differentiable w.r.t. ``parameters()`` (call under
        ``torch.enable_grad()`` to train).

        Args:
            features: float (B, T, F) the target's true features at positions
                0..T-1 (F = H for EAGLE, 3H for EAGLE-3; any device / float dtype).
            next_tokens: int64 (B, T) the token at position i + 1 for each i.
            steps: draft steps S >= 1.

        Returns:
            S tensors (B, T, V_draft) in the head's dtype and device: at step s,
            position i predicts the token at i + 2 from the anchor i - s + 1 (the
            s-th draft step from that anchor); positions i < s - 1 have no
            anchor and must be left out of losses.

        Raises:
            ValueError: steps < 1, or features / tokens of mismatched shapes.
        """
        return [logits for _, logits in self._ttt(features, next_tokens, steps, True)]

    def ttt_hidden(self, features: torch.Tensor, next_tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """`ttt_logits` without the LM head: S head outputs h_s (B, T, H) in the
        head's dtype and device (`draft_logits` turns chosen rows into logits, so a
        loss over a few rows per sequence skips the (B, T, V_draft) products).

        Raises:
            ValueError: steps < 1, or features / tokens of mismatched shapes.
        """
        return [h for h, _ in self._ttt(features, next_tokens, steps, False)]

    def _ttt(self, features: torch.Tensor, next_tokens: torch.Tensor, steps: int, with_logits: bool):
        if features.dim() != 3 or next_tokens.shape != features.shape[:2]:
            raise ValueError(f"need features (B, T, F) and next_tokens (B, T), got {tuple(features.shape)} "
                             f"and {tuple(next_tokens.shape)}")
        return self.head.forward_ttt(features.to(self._device, self._dtype), next_tokens.to(self._device).long(),
                                     int(steps), with_logits=with_logits)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits (..., V_draft) over the reduced vocabulary of head outputs
        ``hidden`` (..., H) (`EagleHead.logits`; differentiable)."""
        return self.head.logits(hidden)

    @torch.no_grad()
    def _absorb(self) -> None:
        if not self._pending_feats:
            return
        feats = torch.cat(self._pending_feats)
        nxt = torch.cat(self._pending_next)
        self._pending_feats, self._pending_next = [], []
        self._cache, h = self.head.extend(self._cache, feats, nxt)
        self._root_h = h[-1:]
        self._root_logits = self.head.logits(self._root_h)[0]

    # -------------------------------------------------------------- drafting
    @torch.no_grad()
    def propose(self, request: DraftRequest) -> DraftProposal:
        self._absorb()
        device = request.ids.device
        if self._root_h is None or request.max_tokens < 1:
            return DraftProposal.empty(device=device)
        if self._cache.length != request.context_length - 1:
            raise ValueError(f"{self.name} drafter out of sync: head cache covers {self._cache.length} positions, "
                             f"context has {request.context_length} tokens (reset/observe missed)")
        plan = request.plan
        if plan.tree is None:
            k = min(int(plan.num_draft_tokens), int(request.max_tokens))
            return self._chain(k, request) if k > 0 else DraftProposal.empty(device=device)
        depth = int(plan.tree.max_depth)
        if plan.num_draft_tokens and plan.num_draft_tokens > 0:
            depth = min(depth, int(plan.num_draft_tokens))
        return self._tree(depth, request)

    def _chain(self, k: int, request: DraftRequest) -> DraftProposal:
        h, logits = self._root_h, self._root_logits
        tokens, rows = [], []
        node_k = self._cache.k[:, :0]
        node_v = self._cache.v[:, :0]
        logcum, cums = 0.0, []
        for depth in range(1, k + 1):
            probs = processed_probs(logits.float(), request.sampling)
            j = int(probs.argmax()) if request.sampling.greedy else sample_from(probs, request.generator)
            rows.append(probs)
            logcum += float(torch.log_softmax(logits.double(), -1)[j])
            cums.append(logcum)
            tok = self._d2t[j:j + 1]
            tokens.append(int(tok))
            if depth == k or not policy_continues(request, depth, [math.exp(logcum)],
                                                  math.exp(cums[-2]) if depth > 1 else 1.0):
                break
            pos = torch.tensor([self._cache.length + depth - 1], device=self._device)
            mask = torch.ones(1, node_k.shape[1], dtype=torch.bool, device=self._device)
            h, lg, kk, vv = self.head.step_nodes(self._cache, h, tok, pos, node_k, node_v, mask)
            node_k, node_v = torch.cat([node_k, kk], 1), torch.cat([node_v, vv], 1)
            logits = lg[0]
        q = self.vocab.scatter_probs(torch.stack(rows).float()).to(request.ids.device)
        prop = DraftProposal.chain(tokens, q, device=request.ids.device)
        return DraftProposal(prop.tokens, prop.parents, q, torch.tensor(cums, dtype=torch.float64).exp())

    def _tree(self, max_depth: int, request: DraftRequest) -> DraftProposal:
        tree = request.plan.tree
        tokens: list[int] = []
        parents: list[int] = []
        logcum: list[float] = []
        node_h: dict[int, torch.Tensor] = {}
        slot: dict[int, int] = {}               # node -> index in node_k (processed nodes)
        node_k = self._cache.k[:, :0]
        node_v = self._cache.v[:, :0]
        ancestors: list[set[int]] = []
        frontier = [-1]
        front_logits = self._root_logits[None]
        for depth in range(1, max_depth + 1):
            width = tree.top_k if tree.top_k is not None else tree.branching[depth - 1]
            logp = torch.log_softmax(front_logits.double(), -1)
            top_lp, top_j = logp.topk(min(int(width), logp.shape[-1]), -1)
            new_nodes = []
            for r, par in enumerate(frontier):
                base = logcum[par] if par >= 0 else 0.0
                for lp, j in zip(top_lp[r].tolist(), top_j[r].tolist()):
                    tokens.append(int(self._d2t[j]))
                    parents.append(par)
                    logcum.append(base + lp)
                    ancestors.append((ancestors[par] | {par}) if par >= 0 else set())
                    new_nodes.append(len(tokens) - 1)
            parent_best = max(math.exp(logcum[i]) for i in frontier) if frontier[0] >= 0 else 1.0
            if depth == max_depth or not policy_continues(request, depth, [math.exp(logcum[i]) for i in new_nodes],
                                                          parent_best):
                break
            if tree.top_k is not None:
                new_nodes = sorted(new_nodes, key=lambda i: (-logcum[i], i))[: tree.top_k]
            frontier = new_nodes
            parent_h = torch.cat([node_h[parents[i]] if parents[i] >= 0 else self._root_h for i in frontier])
            pos = torch.full((len(frontier),), self._cache.length + depth - 1, device=self._device)
            mask = torch.zeros(len(frontier), node_k.shape[1], dtype=torch.bool, device=self._device)
            for r, i in enumerate(frontier):
                for a in ancestors[i]:
                    mask[r, slot[a]] = True
            toks = torch.tensor([tokens[i] for i in frontier], device=self._device)
            h, front_logits, kk, vv = self.head.step_nodes(self._cache, parent_h, toks, pos, node_k, node_v, mask)
            for r, i in enumerate(frontier):
                node_h[i] = h[r:r + 1]
                slot[i] = node_k.shape[1] + r
            node_k, node_v = torch.cat([node_k, kk], 1), torch.cat([node_v, vv], 1)
        budget = int(request.max_tokens)
        drafted = len(tokens) if tree.verify_size is None else int(tree.verify_size)
        budget = min(budget, policy_verify_size(request, depth, [math.exp(v) for v in logcum], drafted))
        device = request.ids.device
        full = DraftProposal(torch.tensor(tokens, dtype=torch.long, device=device),
                             torch.tensor(parents, dtype=torch.long, device=device), None,
                             torch.tensor(logcum, dtype=torch.float64).exp())
        return full.subset(select_nodes(logcum, budget))


def eagle_drafter_from_saved(target, kind: str, tensors: dict, meta: dict,
                             dtype: str | torch.dtype | None = None) -> EagleDrafter:
    """The EAGLE / EAGLE-3 drafter of ``target`` (a `LoadedModel`) from a saved draft
    (``tensors, meta`` as `specloop.realmodels.heads.common.load_draft` gives them;
    loading, or training first when none is saved, is
    `specloop.realmodels.registry.head_factories.load_eagle_drafter`).

    ``dtype``: the head's dtype for drafting (None = float32, what online training
    needs). bfloat16 halves a CPU draft step with a bfloat16 target (SmolLM2-135M,
    top-6 tree layer: ~6 -> ~3 ms; measured accepted length unchanged to 1 %); the
    draft's numerics change, never the decoder's output.

    Raises:
        ValueError: the saved draft does not fit this target (other hidden size or
            vocabulary).
    """
    from specloop.realmodels.heads.eagle import EagleConfig
    head_cfg = EagleConfig(**{**meta["config"], "feature_layers": tuple(meta["config"]["feature_layers"])})
    model = target.model
    if head_cfg.target_vocab_size != int(model.get_output_embeddings().weight.shape[0]) or \
            head_cfg.hidden_size != int(model.config.hidden_size):
        raise ValueError(f"the saved {kind} draft was trained for another target "
                         f"(hidden {head_cfg.hidden_size}, vocab {head_cfg.target_vocab_size})")
    d2t = tensors.pop("d2t").long()
    vocab = ReducedVocab(d2t, head_cfg.target_vocab_size)
    embed = model.get_input_embeddings().weight.detach().float().cpu()
    lm = model.get_output_embeddings().weight.detach().float().cpu()
    head = EagleHead(head_cfg, embed, lm[d2t])
    head.load_state_dict(tensors, strict=True)
    if dtype is not None:
        from specloop.realmodels.loading import resolve_dtype
        head = head.to(resolve_dtype(dtype))
    drafter = EagleDrafter(head, vocab, name=kind)
    drafter.train_report = meta
    return drafter
