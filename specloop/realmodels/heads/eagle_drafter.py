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
from specloop.realmodels.heads.head_drafting import read_tree_levels
from specloop.realmodels.sampling import check_finite, draft_index, processed_probs

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
        device = "cpu"
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
        """A chain of up to k tokens. Everything stays on the head's device (a sampled
        step reads its row for the draw; a policy hook that reads probabilities gets
        them per step); the session reads the tokens in one copy."""
        h, logits = self._root_h, self._root_logits
        tokens, rows, cums, raw = [], [], [], []
        node_k = self._cache.k[:, :0]
        node_v = self._cache.v[:, :0]
        logcum = None                                 # float64 (device) cumulative log-probability
        for depth in range(1, k + 1):
            raw.append(logits)
            probs = processed_probs(logits.float(), request.sampling, check=False)
            j = draft_index(probs, request.sampling, request.generator)
            rows.append(probs)
            step = torch.log_softmax(logits.double(), -1).gather(0, j)
            logcum = step if logcum is None else logcum + step
            cums.append(logcum)
            tok = self._d2t.index_select(0, j)
            tokens.append(tok)
            if depth == k or not policy_continues(request, depth, lambda: [math.exp(float(cums[-1]))],
                                                  lambda: math.exp(float(cums[-2])) if depth > 1 else 1.0):
                break
            pos = torch.full((1,), self._cache.length + depth - 1, dtype=torch.long, device=self._device)
            mask = torch.ones(1, node_k.shape[1], dtype=torch.bool, device=self._device)
            h, lg, kk, vv = self.head.step_nodes(self._cache, h, tok, pos, node_k, node_v, mask)
            node_k, node_v = torch.cat([node_k, kk], 1), torch.cat([node_v, vv], 1)
            logits = lg[0]
        check_finite(torch.stack(raw), "model")          # every step's logits, in one read
        q_reduced = torch.stack(rows).float()      # as `ReducedVocab.scatter_probs`, with the device's d2t
        q = q_reduced.new_zeros((q_reduced.shape[0], self.vocab.target_vocab_size))
        q[:, self._d2t] = q_reduced
        toks = torch.cat(tokens)
        parents = torch.arange(-1, toks.shape[0] - 1, dtype=torch.long, device="cpu")
        return DraftProposal(toks, parents, q, torch.cat(cums).exp())

    def _tree(self, max_depth: int, request: DraftRequest) -> DraftProposal:
        """A static / EAGLE-2 tree. Expansion, the frontier choice and the tree masks
        stay on the head's device; the drafted tokens, parents and cumulative
        log-probabilities come to the host in one copy at the end (per level only for
        a policy hook that reads probabilities), where `select_nodes` keeps the
        verified nodes."""
        tree = request.plan.tree
        dev = self._device
        toks, pars, cums = [], [], []           # per level, on the device
        count = 0
        node_k = self._cache.k[:, :0]
        node_v = self._cache.v[:, :0]
        front_idx = torch.full((1,), -1, dtype=torch.long, device=dev)   # frontier nodes (-1 = the root)
        front_cum = torch.zeros(1, dtype=torch.float64, device=dev)
        front_h = self._root_h                   # head output of each frontier node
        front_vis = torch.zeros(1, 0, dtype=torch.bool, device=dev)      # frontier rows' ancestor slots
        front_logits = self._root_logits[None]
        for depth in range(1, max_depth + 1):
            width = tree.top_k if tree.top_k is not None else tree.branching[depth - 1]
            logp = torch.log_softmax(front_logits.double(), -1)
            top_lp, top_j = logp.topk(min(int(width), logp.shape[-1]), -1)
            rows, w = top_lp.shape
            src = torch.arange(rows, device=dev).repeat_interleave(w)    # frontier row of each new node
            new_cum = (front_cum[:, None] + top_lp).reshape(-1)
            new_tok = self._d2t[top_j.reshape(-1)]
            toks.append(new_tok)
            pars.append(front_idx[src])
            cums.append(new_cum)
            new_idx = torch.arange(count, count + rows * w, device=dev)
            count += rows * w
            parent_cum = front_cum
            if depth == max_depth or not policy_continues(
                    request, depth, lambda: [math.exp(c) for c in new_cum.tolist()],
                    lambda: max(math.exp(c) for c in parent_cum.tolist()) if depth > 1 else 1.0):
                break
            # a new node sees its parent's ancestors and its parent (the root has no slot)
            if depth == 1:
                child_vis = torch.zeros(rows * w, 0, dtype=torch.bool, device=dev)
            else:
                child_vis = torch.cat([front_vis[src], torch.eye(rows, dtype=torch.bool, device=dev)[src]], 1)
            child_h = front_h[src]
            if tree.top_k is not None:           # the top_k newest by cumulative probability, ties to the earlier
                pick = torch.sort(new_cum, descending=True, stable=True).indices[: tree.top_k]
            else:
                pick = torch.arange(rows * w, device=dev)
            front_idx, front_cum, front_vis = new_idx[pick], new_cum[pick], child_vis[pick]
            pos = torch.full((int(pick.numel()),), self._cache.length + depth - 1, dtype=torch.long, device=dev)
            h, front_logits, kk, vv = self.head.step_nodes(self._cache, child_h[pick], new_tok[pick], pos,
                                                           node_k, node_v, front_vis)
            front_h = h
            node_k, node_v = torch.cat([node_k, kk], 1), torch.cat([node_v, vv], 1)
        tokens, parents, logcum = read_tree_levels(toks, pars, cums)
        budget = int(request.max_tokens)
        drafted = count if tree.verify_size is None else int(tree.verify_size)
        budget = min(budget, policy_verify_size(request, depth, lambda: [math.exp(v) for v in logcum], drafted,
                                                count=count))
        full = DraftProposal(torch.tensor(tokens, dtype=torch.long, device="cpu"),
                             torch.tensor(parents, dtype=torch.long, device="cpu"), None,
                             torch.tensor(logcum, dtype=torch.float64, device="cpu").exp())
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
    from specloop.realmodels.loading import resolve_dtype
    head_dtype = torch.float32 if dtype is None else resolve_dtype(dtype)
    # built from the target's own tensors on its device (no host copy of the (V, H)
    # embedding and LM head), then placed on that device in the drafting dtype
    embed = model.get_input_embeddings().weight.detach()
    lm = model.get_output_embeddings().weight.detach()
    from specloop.realmodels.heads.eagle3_arch import build_eagle_head
    head = build_eagle_head(head_cfg, embed.float(), lm[d2t.to(lm.device)].float())    # the saved arch's layer
    head.load_state_dict(tensors, strict=True)
    head = head.to(device=embed.device, dtype=head_dtype)
    drafter = EagleDrafter(head, vocab, name=kind)
    drafter.train_report = meta
    return drafter
