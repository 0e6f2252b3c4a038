"""A separate small causal LM as the draft (Leviathan et al. 2023; Chen et al. 2023),
with its own KV cache kept consistent with the committed sequence.

Two modes, chosen by `make_small_lm_drafter`:

* `SmallLMDrafter` -- draft and target share token ids (same tokenizer; a smaller
  draft vocabulary is zero-padded by the decoder). Chains are sampled token by
  token from q_draft = processed draft distribution; trees are expanded depth by
  depth with one draft forward per depth under a tree attention mask
  (static ``branching`` per depth, or EAGLE-2's dynamic ``top_k`` over cumulative
  draft probability). Sampled siblings are drawn without replacement and each
  reports the renormalised row it was drawn from (`sample_siblings`: recursive
  rejection sampling without replacement, lossless); greedy siblings are the
  top-b. The ``verify_size`` budget keeps the best nodes by cumulative probability
  when greedy, the first ones in drafting order when sampling (lossless).
* `RetokenizingDrafter` -- different tokenizers, like transformers' universal
  assisted decoding: the committed target text is re-encoded with the draft
  tokenizer, the draft continues it in its own token space, and the drafted text
  is re-encoded with the target tokenizer. The target ids it proposes are not
  draws from a known distribution over the target vocabulary, so it reports
  ``q_draft=None`` (point-mass verification, lossless; see `drafters.base`).
"""
from __future__ import annotations

import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback
from specloop.realmodels.kvcache import cache_length, causal_forward, crop, keep_positions, model_forward, new_cache
from specloop.realmodels.sampling import SamplingConfig, check_finite, processed_probs, sample_from
from specloop.realmodels.tree import additive_mask

__all__ = ["SmallLMDrafter", "RetokenizingDrafter", "make_small_lm_drafter", "same_token_ids", "sample_siblings"]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _CachedLM:
    """A causal LM plus a KV cache and the list of token ids the cache holds.

    Context ids the draft cannot embed (>= its vocabulary size, possible when a
    smaller draft vocabulary is zero-padded) are fed as id 0: the draft then
    conditions on a slightly different context, which lowers acceptance but never
    affects the output distribution.
    """

    def __init__(self, model):
        self.model = model
        self.cache = new_cache()
        self.ids: list[int] = []
        self.vocab = int(model.get_input_embeddings().weight.shape[0])

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, dtype=torch.long)
        return torch.where(ids < self.vocab, ids, torch.zeros_like(ids))

    def reset(self) -> None:
        self.cache = new_cache()
        self.ids = []

    def sync(self, seq: list[int]) -> torch.Tensor:
        """Make the cache hold ``seq[:-1]``, feed the rest, return the float32 logits
        (V,) of the next token after ``seq``."""
        keep = min(_common_prefix(self.ids, seq), len(seq) - 1)
        crop(self.cache, keep)
        self.ids = self.ids[:keep]
        out = causal_forward(self.model, self.cache, self._feed(seq[keep:]), logits_to_keep=1)
        self.ids.extend(seq[keep:])
        logits = out.logits[0, -1].float()
        check_finite(logits, "draft model")
        return logits

    def step(self, token: int) -> torch.Tensor:
        out = causal_forward(self.model, self.cache, self._feed([token]))
        self.ids.append(token)
        logits = out.logits[0, -1].float()
        check_finite(logits, "draft model")
        return logits


def _draw(probs: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    return int(probs.argmax()) if sampling.greedy else sample_from(probs, generator)


def sample_siblings(q_draft: torch.Tensor, width: int,
                    generator: torch.Generator) -> list[tuple[int, torch.Tensor]]:
    """Draw up to ``width`` distinct sibling tokens from ``q_draft`` without replacement.

    Sibling i is drawn from q_i = q_draft with siblings 1 .. i-1 removed and
    renormalised, and q_i is reported as that node's q_draft row. `verify_tree`
    tries siblings in this order against p_1 = p_target, p_{i+1} =
    norm(max(0, p_i - q_i)): recursive rejection sampling without replacement
    (Jeon et al. 2024, "Recursive Speculative Decoding", RRSw; the sibling rule of
    SpecTr, Sun et al. 2023, and of EAGLE-2's implementation).

    Lossless (proof sketch): let O_i be the token emitted when sibling i is tried
    with target p_i after siblings 1 .. i-1 (tokens h) were rejected. Given h,
    x_i ~ q_i and is accepted with probability min(1, p_i(x)/q_i(x)); on rejection
    the walk continues with p_{i+1} = norm(max(0, p_i - q_i)), which depends on h
    only (not on x_i), and by induction from the last sibling (whose rejection
    draws the correction from p_{m+1}) the rest of the walk emits p_{i+1}. So
    P(O_i = y) = min(p_i(y), q_i(y)) + (1 - sum_x min(p_i, q_i)(x)) p_{i+1}(y)
    = p_i(y), the one-draft identity of Leviathan et al. 2023; for i = 1 this is
    p_target. What is emitted below an accepted child is handled the same way at
    its own depth. The old rule (i.i.d. draws from q, duplicates dropped) is not
    lossless: after rejecting x it moved on with p_1 where the rule needs p_2.

    Args:
        q_draft: float (V,) processed draft distribution of the parent node.
        width: maximum number of siblings (>= 1); fewer when q_draft has fewer
            tokens of positive probability.
        generator: the decoder's torch.Generator (one uniform per sibling).

    Returns:
        [(token id, float (V,) row q_i)], in drafting order (= verification order).
    """
    out: list[tuple[int, torch.Tensor]] = []
    row = q_draft
    for _ in range(int(width)):
        if out:
            row = row.clone()
            row[out[-1][0]] = 0.0
            total = row.sum()
            if not total > 0:
                break
            row = row / total
        out.append((sample_from(row, generator), row))
    return out


def _draft_chain(lm: _CachedLM, seq: list[int], k: int, sampling: SamplingConfig,
                 generator: torch.Generator) -> tuple[list[int], list[torch.Tensor]]:
    """k tokens and the (V,) q rows they were drawn from."""
    logits = lm.sync(seq)
    tokens, rows = [], []
    for d in range(k):
        probs = processed_probs(logits, sampling)
        tok = _draw(probs, sampling, generator)
        tokens.append(tok)
        rows.append(probs)
        if d + 1 < k:
            logits = lm.step(tok)
    return tokens, rows


class SmallLMDrafter(BaseDrafter):
    """Small-LM draft sharing the target's token ids.

    Args:
        model: a transformers causal LM (the draft), eval mode.
        name: report name.

    ``q_draft`` rows have the draft's vocabulary size (zero-padded by the decoder
    to the target's); a sampled tree node's row excludes its earlier siblings
    (`sample_siblings`). Greedy trees pick the top-b tokens per node, which are not
    draws from the one-hot greedy q, so greedy trees report ``q_draft=None``
    (verification is then exact argmax matching, as for any greedy draft).
    """

    def __init__(self, model, name: str = "small-lm"):
        self.lm = _CachedLM(model)
        self.name = name
        self._tree_base: int | None = None
        self._tree_fed = 0

    @property
    def vocab_size(self) -> int:
        return int(self.lm.model.get_output_embeddings().weight.shape[0])

    def reset(self, prompt_ids, *, target_hidden=None) -> None:
        self.lm.reset()
        self._tree_base = None

    def propose(self, request: DraftRequest) -> DraftProposal:
        self._finish_tree(None)
        seq = request.ids.tolist()
        plan = request.plan
        if plan.tree is None:
            k = min(plan.num_draft_tokens, request.max_tokens)
            if k <= 0:
                return DraftProposal.empty()
            tokens, rows = _draft_chain(self.lm, seq, k, request.sampling, request.generator)
            return DraftProposal.chain(tokens, torch.stack(rows))
        return self._propose_tree(seq, request)

    # -- trees ------------------------------------------------------------------
    def _propose_tree(self, seq: list[int], request: DraftRequest) -> DraftProposal:
        tree, sampling, gen = request.plan.tree, request.sampling, request.generator
        depth_cap = min(int(tree.max_depth), int(request.plan.num_draft_tokens) or int(tree.max_depth))
        budget = min(request.max_tokens, tree.verify_size or request.max_tokens)
        logits = self.lm.sync(seq)
        self._tree_base, self._tree_fed = len(self.lm.ids), 0
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        cum: list[float] = []
        frontier = [(-1, logits, 1.0)]
        for depth in range(1, depth_cap + 1):
            width = tree.branching[depth - 1] if tree.branching is not None else tree.top_k
            if tree.top_k is not None:
                frontier = sorted(frontier, key=lambda f: -f[2])[: tree.top_k]
            new_nodes = []
            for parent, node_logits, parent_prob in frontier:
                probs = processed_probs(node_logits, sampling)
                choice_probs = node_logits.float().softmax(-1) if sampling.greedy else probs
                for tok, row in self._children(probs, choice_probs, width, sampling, gen):
                    new_nodes.append(len(tokens))
                    tokens.append(tok)
                    parents.append(parent)
                    rows.append(row)
                    cum.append(parent_prob * float(choice_probs[tok]))
            if depth == depth_cap or len(tokens) >= 4 * budget or not new_nodes:
                break
            frontier = self._expand(new_nodes, tokens, parents, cum)
        return self._select(tokens, parents, rows, cum, budget, sampling)

    @staticmethod
    def _children(probs, choice_probs, width, sampling, gen) -> list[tuple[int, torch.Tensor]]:
        """A node's children as (token, q row it was drawn from) pairs, in drafting
        order: top-``width`` when greedy (rows unused: q_draft is None), else
        `sample_siblings` (without replacement)."""
        if sampling.greedy:
            return [(tok, probs) for tok in torch.topk(choice_probs, width).indices.tolist()]
        return sample_siblings(probs, width, gen)

    def _expand(self, new_nodes, tokens, parents, cum):
        """Feed the newest depth's nodes in one forward; return the next frontier."""
        base = self._tree_base
        start = base + self._tree_fed  # == cache length
        n_new = len(new_nodes)
        visible = torch.zeros((n_new, start + n_new), dtype=torch.bool)
        visible[:, :base] = True
        positions = []
        for row, node in enumerate(new_nodes):
            depth, cur = 0, node
            while cur >= 0:
                visible[row, base + cur] = True
                cur, depth = parents[cur], depth + 1
            positions.append(base - 1 + depth)
        param = next(self.lm.model.parameters())
        mask = additive_mask(visible, param.dtype, param.device)
        ids = self.lm._feed([tokens[j] for j in new_nodes])
        out = model_forward(self.lm.model, self.lm.cache, ids, mask, torch.tensor([positions]))
        logits = out.logits[0].float()
        check_finite(logits, "draft model")
        self._tree_fed += n_new
        return [(node, logits[row], cum[node]) for row, node in enumerate(new_nodes)]

    @staticmethod
    def _select(tokens, parents, rows, cum, budget, sampling) -> DraftProposal:
        """Keep ``budget`` nodes. Greedy (point-mass nodes): the best by cumulative
        probability (closed under ancestors: a child's cumulative probability never
        exceeds its parent's). Sampled: the first ``budget`` in drafting order
        (breadth first, siblings in sampling order), so every kept node's kept
        children are the first m of its siblings with m fixed by the shallower
        levels. Choosing sampled siblings by their own probability would verify a
        biased subset of the draws (not lossless, see `sample_siblings`)."""
        n = len(tokens)
        if n == 0:
            return DraftProposal.empty()
        if sampling.greedy:
            keep = sorted(sorted(range(n), key=lambda i: (-cum[i], i))[:budget])
        else:
            keep = list(range(min(n, budget)))
        kept: set[int] = set()
        for i in keep:                 # ascending = topological: drop nodes whose parent went
            if parents[i] < 0 or parents[i] in kept:
                kept.add(i)
        full = DraftProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                             None if sampling.greedy else torch.stack(rows),
                             torch.tensor(cum, dtype=torch.float64))
        # the subset's source_index maps each verified node back to its row of the draft's
        # cache (fed in drafting order), through any later pruning by the decoder
        return full.subset(sorted(kept))

    def observe(self, feedback: VerifyFeedback) -> None:
        self._finish_tree(feedback)

    def _finish_tree(self, feedback: VerifyFeedback | None) -> None:
        """After a tree round keep the draft cache's accepted-path entries only."""
        if self._tree_base is None:
            return
        base, fed = self._tree_base, self._tree_fed
        self._tree_base = None
        if feedback is None or fed == 0:
            crop(self.lm.cache, base)
            self.lm.ids = self.lm.ids[:base]
            return
        kept = []
        for node in feedback.accepted_nodes:
            draft_node = feedback.proposal.draft_node(node)
            if draft_node >= fed:
                break
            kept.append(draft_node)
        positions = torch.cat([torch.arange(base), base + torch.tensor(kept, dtype=torch.long)])
        keep_positions(self.lm.cache, positions)
        self.lm.ids = self.lm.ids[:base] + [int(feedback.proposal.tokens[n]) for n in feedback.accepted_nodes[: len(kept)]]


class RetokenizingDrafter(BaseDrafter):
    """A small-LM draft with a different tokenizer (universal assisted decoding).

    Args:
        model: the draft causal LM.
        draft_tokenizer, target_tokenizer: the two tokenizers.
        name: report name.

    Trees are not supported (the plan's depth is used as a chain of draft tokens).
    """

    def __init__(self, model, draft_tokenizer, target_tokenizer, name: str = "small-lm-retok"):
        self.lm = _CachedLM(model)
        self.draft_tok, self.target_tok = draft_tokenizer, target_tokenizer
        self.name = name

    def reset(self, prompt_ids, *, target_hidden=None) -> None:
        self.lm.reset()

    def propose(self, request: DraftRequest) -> DraftProposal:
        plan = request.plan
        k = int(plan.tree.max_depth if plan.tree is not None else plan.num_draft_tokens)
        k = min(k, request.max_tokens)
        if k <= 0:
            return DraftProposal.empty()
        text = self.target_tok.decode(request.ids.tolist(), skip_special_tokens=False)
        draft_ids = self.draft_tok.encode(text, add_special_tokens=False)
        if not draft_ids:
            return DraftProposal.empty()
        greedy = SamplingConfig(0.0) if request.sampling.greedy else request.sampling
        new, _ = _draft_chain(self.lm, draft_ids, k, greedy, request.generator)
        before = self.draft_tok.decode(draft_ids, skip_special_tokens=False)
        after = self.draft_tok.decode(draft_ids + new, skip_special_tokens=False)
        if not after.startswith(before):
            return DraftProposal.empty()
        candidate = self.target_tok.encode(after[len(before):], add_special_tokens=False)[:k]
        vocab = len(self.target_tok)
        candidate = [t for t in candidate if 0 <= t < vocab][:k]
        return DraftProposal.chain(candidate) if candidate else DraftProposal.empty()


def same_token_ids(draft_tokenizer, target_tokenizer) -> bool:
    """True iff every draft token string has the same id in the target's vocabulary."""
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    return all(target_vocab.get(tok) == idx for tok, idx in draft_vocab.items())


def make_small_lm_drafter(target, model: str = "smollm2-135m", *, dtype: str = "float32",
                          device: str | None = None, retokenize: bool | None = None, **_ignored):
    """Factory for the ``small-lm`` registry entry.

    Args:
        target: the target's `LoadedModel`.
        model: draft model name / path (see `load_model`).
        dtype, device: for the draft (device defaults to the target's).
        retokenize: None = auto (re-tokenise iff the token ids differ), True /
            False to force.

    Raises:
        ValueError: ``retokenize=False`` with a draft vocabulary larger than the
            target's or token ids that mean different tokens.
    """
    from specloop.realmodels.loading import load_model
    device = device or str(target.device)
    if model == getattr(target, "name", None) and str(next(target.model.parameters()).dtype).endswith(str(dtype)):
        draft = target
    else:
        draft = load_model(model, dtype=dtype, device=device)
    same = same_token_ids(draft.tokenizer, target.tokenizer)
    if retokenize is None:
        retokenize = not same or draft.vocab_size > target.vocab_size
    if retokenize:
        return RetokenizingDrafter(draft.model, draft.tokenizer, target.tokenizer, name=f"{model}-retok")
    if draft.vocab_size > target.vocab_size:
        raise ValueError(f"draft vocabulary ({draft.vocab_size}) is larger than the target's "
                         f"({target.vocab_size}); use retokenize=True")
    if not same:
        raise ValueError("draft and target tokenizers map tokens to different ids; use retokenize=True")
    return SmallLMDrafter(draft.model, name=model)
