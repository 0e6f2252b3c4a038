"""The drafter interface: the plugin point of the real-model decoder.

Every draft source -- n-gram prompt lookup, a separate small LM (same or different
tokenizer), EAGLE / EAGLE-3 / Medusa / Hydra heads -- implements `Drafter` and
plugs into `specloop.realmodels.decoder.SpeculativeDecoder` without any change to
the decoder. The split follows OnlineSpec Algorithm 1 (draft -> verify -> feedback
-> update) and is similar in spirit to transformers' ``CandidateGenerator``
(``get_candidates`` / ``update_candidate_strategy``):

1. ``reset(prompt_ids, target_hidden=...)`` once per prompt, after the target's
   prefill.
2. per round, ``propose(request) -> DraftProposal``: a chain or a tree of target
   token ids (flattened, with parent indices) *and the exact distribution each node
   was drawn from* (``q_draft``), or ``q_draft=None`` for deterministic drafters.
3. the decoder verifies, then calls ``observe(feedback)`` with a `VerifyFeedback`:
   the accepted path, the committed tokens, the target's distributions at the
   verified positions, and -- if the drafter asked for them through
   ``needs_target_hidden`` -- the target's hidden states of the tokens that entered
   the target's KV cache this round (what EAGLE-style heads consume).
4. a learning drafter exposes its trainable tensors through ``parameters()``; the
   online learner (``specloop.strategies``) updates them between rounds.

Position conventions (used everywhere below). The decoder keeps one *pending*
token: the last committed token, not yet fed to the target (its KV entry does not
exist yet). The target's cache holds ``ids[:-1]``; ``request.ids[-1]`` is the
pending token. A round feeds ``[pending, node_0, ..., node_{n-1}]`` to the target;
the output at the pending token is the distribution of the *root's children*, the
output at node i the distribution of node i's children.

Losslessness contract for sampling (temperature > 0). Siblings are verified in
order with recursive rejection sampling (SpecInfer, Miao et al. 2024, Alg. 2;
Leviathan et al. 2023 for a chain): child c with row ``q_draft[c]`` is accepted
with probability ``min(1, p(c)/q(c))``; on rejection p <- norm(max(0, p - q)).
This reproduces the target distribution exactly when each node's token was drawn
from its ``q_draft`` row independently of its earlier siblings (e.g. i.i.d. draws),
or deterministically (``q_draft=None``: verified as a point mass, which is lossless
for *any* way of choosing the token, as long as it does not look at the target's
random numbers). A drafter that samples siblings without replacement must either
report them as deterministic (``q_draft=None``) or supply rows consistent with that
rule. ``q_draft`` must be the distribution *after* temperature / top-k / top-p,
i.e. `specloop.realmodels.sampling.processed_probs` of the draft logits with the
request's ``sampling`` config.

Vocabulary: node tokens are **target** token ids in [0, V_target). ``q_draft`` may
have V_draft <= V_target columns (a smaller draft vocabulary is zero-padded by the
decoder; the ids must mean the same tokens); more columns raise ValueError. A
drafter with a different tokenizer re-tokenises (see `small_lm.SmallLMDrafter`)
and reports ``q_draft=None``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan, TreeCandidates
from specloop.strategies.engine import RoundHooks, layer_draft_step
from specloop.strategies.subtree import reindex_parents

__all__ = ["DraftRequest", "DraftProposal", "VerifyFeedback", "Drafter", "BaseDrafter", "NoDraft",
           "policy_continues", "policy_verify_size", "policy_reads_probs"]


@dataclass(frozen=True)
class DraftRequest:
    """What the decoder asks a drafter for in one round.

    Attributes:
        ids: int64 tensor (L,) on the host: the committed sequence (prompt +
            generated), the last entry being the pending token. A drafter whose
            tensors live on an accelerator keeps its own device (its proposal's
            tokens may stay there: the session moves them to the host in one copy).
        plan: the policy's `DraftPlan` for this round: ``plan.num_draft_tokens`` is
            the chain length k (or the depth cap of a tree); ``plan.tree`` the
            `TreePlan` (``branching`` per depth, or EAGLE-2 ``top_k``; and
            ``verify_size``) or None for a chain.
        max_tokens: hard cap on the number of nodes the drafter may return (the
            decoder never verifies past ``max_new_tokens`` or the context window).
        sampling: the `SamplingConfig` the draft must apply to its logits before
            sampling (and report as q_draft).
        generator: the decoder's torch.Generator; the only randomness a drafter may
            use, so that a seeded run is reproducible.
        round_index: round t within the current prompt (0-based).
        policy: the round's hooks (the decoder session passes its
            `specloop.strategies.engine.RoundHooks`, which interprets the policy's
            optional ``continue_drafting(DraftStep) -> bool`` after each draft step and
            ``verify_size(TreeCandidates) -> int`` after a tree is drafted, the same
            way in every engine); None = no hooks. Drafters that draft step by step
            call them through `policy_continues` / `policy_verify_size`; for the
            others the session reveals the proposal to the hooks afterwards.
    """

    ids: torch.Tensor
    plan: DraftPlan
    max_tokens: int
    sampling: SamplingConfig
    generator: torch.Generator
    round_index: int = 0
    policy: Any = None

    @property
    def context_length(self) -> int:
        return int(self.ids.shape[0])


@dataclass(frozen=True)
class DraftProposal:
    """A drafted chain or tree.

    Attributes:
        tokens: int64 tensor (n,): target token ids of the nodes, in topological
            order (every parent before its children). n may be 0 (no speculation).
        parents: int64 tensor (n,): index of each node's parent in ``tokens``, or
            -1 for children of the pending token. A chain has parents
            ``(-1, 0, 1, ..., n-2)``.
        q_draft: float32 tensor (n, V_draft) or None. Row i is the distribution
            node i's token was drawn from (conditioned on its ancestors), after the
            request's temperature / top-k / top-p. None: a deterministic drafter,
            each node verified as a point mass (one-hot q).
        node_probs: optional float64 tensor (n,): cumulative draft probability of
            each node's path, for verification-size policies (LTD) and reports.
        source_index: optional tuple of n ints: node i's index in the proposal the
            drafter built (its own numbering, e.g. the rows of its KV cache), kept
            through every `subset`; None = the identity (nothing was dropped).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q_draft: torch.Tensor | None = None
    node_probs: torch.Tensor | None = None
    source_index: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        tokens, parents = self.tokens, self.parents
        if tokens.ndim != 1 or parents.ndim != 1 or tokens.shape != parents.shape:
            raise ValueError(f"DraftProposal: tokens {tuple(tokens.shape)} and parents "
                             f"{tuple(parents.shape)} must be 1-D of the same length")
        n = int(tokens.shape[0])
        if n and bool(((parents < -1) | (parents >= torch.arange(n, device=parents.device))).any()):
            raise ValueError("DraftProposal.parents must satisfy -1 <= parents[i] < i (topological order)")
        if self.q_draft is not None and (self.q_draft.ndim != 2 or self.q_draft.shape[0] != n):
            raise ValueError(f"DraftProposal.q_draft must be (n, V) with n={n}, got {tuple(self.q_draft.shape)}")
        if self.source_index is not None and len(self.source_index) != n:
            raise ValueError(f"DraftProposal.source_index must have n={n} entries, got {len(self.source_index)}")

    def subset(self, keep) -> "DraftProposal":
        """The proposal made of the nodes ``keep`` (the one tree-selection helper:
        `specloop.strategies.subtree.reindex_parents`).

        Args:
            keep: int sequence / array / tensor (m,), strictly increasing node indices
                closed under ancestors (e.g. `specloop.ltd.policy.select_subtree`).

        Returns:
            A `DraftProposal` of m nodes: tokens, q_draft rows and node_probs of the
            kept nodes (on their devices), parents re-indexed, ``source_index``
            composed (the drafter's own index of each kept node). ``self`` when
            every node is kept.

        Raises:
            ValueError: ``keep`` not increasing, out of range or not closed under
                ancestors.
        """
        idx = np.asarray(torch.as_tensor(keep, dtype=torch.long).cpu(), dtype=np.int64).reshape(-1)
        if idx.size == self.size and (idx == np.arange(self.size)).all():
            return self
        parents = torch.from_numpy(reindex_parents(self.parents.cpu().numpy(), idx)).to(self.parents.device)
        at = torch.from_numpy(idx)
        source = tuple(int(i) for i in idx) if self.source_index is None else \
            tuple(self.source_index[int(i)] for i in idx)
        return DraftProposal(self.tokens[at.to(self.tokens.device)], parents,
                             None if self.q_draft is None else self.q_draft[at.to(self.q_draft.device)],
                             None if self.node_probs is None else self.node_probs[at.to(self.node_probs.device)],
                             source)

    def draft_node(self, node: int) -> int:
        """Node ``node``'s index in the drafter's own numbering (see ``source_index``)."""
        return int(node) if self.source_index is None else int(self.source_index[int(node)])

    @classmethod
    def chain(cls, tokens: torch.Tensor | list[int], q_draft: torch.Tensor | None = None,
              device: torch.device | str | None = None) -> "DraftProposal":
        """A chain proposal: parents (-1, 0, 1, ...), always on the host (tokens left
        on a device need no parents there: the session reads them in one copy)."""
        toks = torch.as_tensor(tokens, dtype=torch.long, device=device).reshape(-1)
        parents = torch.arange(-1, toks.shape[0] - 1, dtype=torch.long, device="cpu")
        return cls(toks, parents, q_draft)

    @classmethod
    def empty(cls, device: torch.device | str | None = None) -> "DraftProposal":
        z = torch.zeros(0, dtype=torch.long, device=device)
        return cls(z, z.clone(), None)

    @property
    def size(self) -> int:
        """Number of drafted nodes n (tokens)."""
        return int(self.tokens.shape[0])

    def depths(self) -> torch.Tensor:
        """int64 (n,): depth of each node (children of the pending token have depth 1)."""
        parents = self.parents.tolist()
        depth = [0] * len(parents)
        for i, par in enumerate(parents):
            depth[i] = 1 if par < 0 else depth[par] + 1
        return torch.tensor(depth, dtype=torch.long, device="cpu")

    @property
    def depth(self) -> int:
        """Tree depth D in tokens (0 for an empty proposal)."""
        return int(self.depths().max().item()) if self.size else 0

    @property
    def is_chain(self) -> bool:
        n = self.size
        return bool(torch.equal(self.parents.cpu(), torch.arange(-1, n - 1, device="cpu")))


@dataclass(frozen=True)
class VerifyFeedback:
    """What the target's verification told the drafter (one per round).

    Attributes:
        proposal: the `DraftProposal` that was verified.
        accepted_nodes: indices into ``proposal.tokens`` of the accepted path, root
            side first (length = accepted draft tokens).
        committed_tokens: int64 (n_t,): the tokens appended to the sequence this
            round: the accepted draft tokens, then the bonus / correction token
            (fewer when EOS or ``max_new_tokens`` stopped generation inside the
            block). ``committed_tokens[-1]`` is the new pending token.
        p_target: float32 (len(accepted_nodes) + 1, V_target): the target's
            processed distribution at the pending token and at each accepted node
            (row j = distribution of committed token j). Greedy runs give one-hot
            rows; ``target_logits`` has the raw scores.
        target_logits: float32 (len(accepted_nodes) + 1, V_target) raw logits at
            the same positions (for distillation losses).
        target_hidden: None unless the drafter set ``needs_target_hidden``; then a
            tuple, one tensor per requested index into transformers'
            ``hidden_states`` tuple (0 = embeddings, -1 = last layer), each
            (1 + len(accepted_nodes), H): the hidden states at the old pending token
            and the accepted nodes, i.e. of the tokens that entered the target's KV
            cache this round, in sequence order.
        child_acceptance_ratios: min(1, p(x)/q(x)) of every drafted child the
            verifier tried, in the order tried (floats; `RoundRecord` has the same
            field, and the per-position Acc_j as ``acceptance_probs``).
        finished: True when generation ended this round (EOS or max_new_tokens).
    """

    proposal: DraftProposal
    accepted_nodes: tuple[int, ...]
    committed_tokens: torch.Tensor
    p_target: torch.Tensor
    target_logits: torch.Tensor
    target_hidden: tuple[torch.Tensor, ...] | None = None
    child_acceptance_ratios: tuple[float, ...] = field(default_factory=tuple)
    finished: bool = False

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes)


@runtime_checkable
class Drafter(Protocol):
    """The interface the decoder drives (see the module docstring for the contract).

    Attributes:
        name: short name for reports.
        needs_target_hidden: indices into the target's ``hidden_states`` tuple the
            drafter wants in `VerifyFeedback.target_hidden` and at ``reset``
            (empty tuple = none; the decoder then skips ``output_hidden_states``).
    """

    name: str
    needs_target_hidden: tuple[int, ...]

    def reset(self, prompt_ids: torch.Tensor, *,
              target_hidden: tuple[torch.Tensor, ...] | None = None) -> None:
        """Start a new prompt. ``prompt_ids``: int64 (L,), target token ids.
        ``target_hidden``: if requested, one (L - 1, H) tensor per requested index:
        the target's hidden states of ``prompt_ids[:-1]`` (the prefill; the last
        prompt token is the first pending token)."""
        ...

    def propose(self, request: DraftRequest) -> DraftProposal:
        """Draft a chain (``request.plan.tree is None``) or a tree; at most
        ``request.max_tokens`` nodes."""
        ...

    def observe(self, feedback: VerifyFeedback) -> float | None:
        """Receive the verification outcome (keep internal caches consistent) and
        return the round's observation: the loss f_t(w_t) a learning draft saw this
        round (float, or a mapping with "loss"), or None. The decoder session writes
        it into the round's `RoundRecord.loss` before the policy observes the record."""
        ...

    def parameters(self) -> list[torch.Tensor]:
        """Trainable tensors for the online learner ([] if the drafter does not learn)."""
        ...


class BaseDrafter:
    """Convenience base: no hidden states needed, no parameters, no-op observe."""

    name: str = "drafter"
    needs_target_hidden: tuple[int, ...] = ()

    def reset(self, prompt_ids: torch.Tensor, *,
              target_hidden: tuple[torch.Tensor, ...] | None = None) -> None:
        return None

    def propose(self, request: DraftRequest) -> DraftProposal:  # pragma: no cover - abstract
        raise NotImplementedError

    def observe(self, feedback: VerifyFeedback) -> None:
        return None

    def parameters(self) -> list[torch.Tensor]:
        return []


class NoDraft(BaseDrafter):
    """Proposes nothing: the decoder then runs plain autoregressive decoding
    (one target forward per token) through the same code path."""

    name = "none"

    def propose(self, request) -> DraftProposal:
        return DraftProposal.empty(device=request.ids.device)


def policy_reads_probs(request: DraftRequest, hook: str = "continue_drafting") -> bool:
    """Whether the round's ``hook`` ("continue_drafting" / "verify_size") looks at the
    draft probabilities: False when there is no such hook, or when the request's
    hooks are the session's `RoundHooks` and its policy lacks the hook (the answer then
    depends only on the depth / the node count). A drafter on an accelerator reads its
    probabilities to the host only when this is True (a stream sync per draft step)."""
    hooks = request.policy
    if getattr(hooks, hook, None) is None:
        return False
    if isinstance(hooks, RoundHooks):
        return getattr(hooks.policy, hook, None) is not None
    return True


def policy_continues(request: DraftRequest, depth: int, layer_probs, parent_best) -> bool:
    """Ask the policy's optional ``continue_drafting`` hook after draft step ``depth``.

    Args:
        request: the round's request (``request.policy`` may be None or lack the hook).
        depth: tokens drafted so far along the chain / tree depth D (>= 1).
        layer_probs: float64 (n,), cumulative draft probabilities of the candidates
            drafted at this depth (any order; sorted descending here), or a callable
            returning them, called only when the hook reads them
            (`policy_reads_probs`), so a drafter on an accelerator does not read its
            probabilities to the host for a hook that ignores them.
        parent_best: cumulative draft probability of the best node one level up
            (1.0 at depth 1), so ``max_prob`` is the best candidate's conditional
            draft probability; a float or a callable (as ``layer_probs``).

    Returns:
        The hook's answer, or True when there is no hook (draft to the plan's cap).

    Source: the ``continue_drafting(DraftStep)`` contract of
    `specloop.strategies.base.DraftPolicy` (LTD's depth policy, ConfidenceStop).
    """
    hook = getattr(request.policy, "continue_drafting", None)
    if hook is None:
        return True
    if callable(layer_probs) or callable(parent_best):
        if policy_reads_probs(request):
            layer_probs = layer_probs() if callable(layer_probs) else layer_probs
            parent_best = parent_best() if callable(parent_best) else parent_best
        else:                     # the session's hooks answer from the depth alone
            layer_probs, parent_best = np.ones(1), 1.0
    return bool(hook(layer_draft_step(depth, request.context_length, layer_probs, parent_best)))


def policy_verify_size(request: DraftRequest, depth: int, node_probs, default: int,
                       count: int | None = None) -> int:
    """The verification size V from the policy's optional ``verify_size`` hook.

    Args:
        request: the round's request.
        depth: drafted depth D.
        node_probs: float64 (n,), cumulative draft probability of every drafted node,
            or a callable returning them (then ``count`` = n is required), called only
            when the hook reads them (`policy_reads_probs`).
        default: V without a hook (the plan's ``verify_size`` or all nodes).
        count: n, when ``node_probs`` is a callable.

    Returns:
        int V in [1, n] (the hook's answer clipped to the drafted nodes), or ``default``.

    Raises:
        ValueError: the hook returned V < 1, or a callable ``node_probs`` without count.
    """
    hook = getattr(request.policy, "verify_size", None)
    if hook is None:
        return int(default)
    if callable(node_probs):
        if count is None:
            raise ValueError("policy_verify_size: a callable node_probs needs count")
        # the session's hooks without a policy hook answer from n alone
        node_probs = node_probs() if policy_reads_probs(request, "verify_size") else np.ones(int(count))
    probs = np.asarray(node_probs, dtype=np.float64).copy()
    size = int(hook(TreeCandidates(int(depth), request.context_length, probs)))
    if size < 1:
        raise ValueError(f"policy.verify_size returned {size}; it must be >= 1")
    return min(size, max(1, probs.size))
