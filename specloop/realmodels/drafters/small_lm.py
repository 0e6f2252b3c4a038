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

import dataclasses

import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback
from specloop.realmodels.drafters.options import ContextOptions
from specloop.realmodels.kvcache import cache_length, causal_forward, crop, keep_positions, model_forward, new_cache
from specloop.realmodels.sampling import SamplingConfig, check_finite, draft_index, processed_probs, sample_from

__all__ = ["SmallLMDrafter", "RetokenizingDrafter", "make_small_lm_drafter", "same_token_ids", "sample_siblings",
           "SmallLMOptions"]


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
        self._ids: list[int] = []
        self._unread: list[torch.Tensor] = []    # fed draft tokens still on the device
        self.vocab = int(model.get_input_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device

    @property
    def ids(self) -> list[int]:
        """The token ids the cache holds (fed draft tokens are read back here, in one copy)."""
        if self._unread:
            self._ids.extend(torch.cat(self._unread).tolist())
            self._unread = []
        return self._ids

    @ids.setter
    def ids(self, value: list[int]) -> None:
        self._ids, self._unread = list(value), []

    def _feed(self, tokens) -> torch.Tensor:
        """int64 (n,) on the draft's device: ``tokens`` (ints, or a device tensor),
        ids the draft cannot embed fed as 0."""
        if torch.is_tensor(tokens):
            ids = tokens.reshape(-1).to(self.device)
        else:
            ids = torch.tensor(tokens, dtype=torch.long, device="cpu").to(self.device)
        return torch.where(ids < self.vocab, ids, torch.zeros_like(ids))

    def reset(self) -> None:
        self.cache = new_cache()
        self.ids = []

    def sync(self, seq: list[int], check: bool = True) -> torch.Tensor:
        """Make the cache hold ``seq[:-1]``, feed the rest, return the float32 logits
        (V,) of the next token after ``seq`` (``check``: raise on NaN here)."""
        keep = min(_common_prefix(self.ids, seq), len(seq) - 1)
        crop(self.cache, keep)
        self.ids = self.ids[:keep]
        out = causal_forward(self.model, self.cache, self._feed(seq[keep:]), logits_to_keep=1)
        self.ids.extend(seq[keep:])
        logits = out.logits[0, -1].float()
        if check:
            check_finite(logits, "draft model")
        return logits

    def step(self, token, check: bool = True) -> torch.Tensor:
        """Feed one token (an int, or an int64 (1,) tensor on the draft's device, read
        back only when `ids` is next asked for); the next token's float32 logits."""
        out = causal_forward(self.model, self.cache, self._feed(token if torch.is_tensor(token) else [token]))
        if torch.is_tensor(token):
            self.ids              # earlier unread tokens stay in order
            self._unread.append(token.reshape(-1))
        else:
            self.ids.append(token)
        logits = out.logits[0, -1].float()
        if check:
            check_finite(logits, "draft model")
        return logits


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
                 generator: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """k tokens (int64 (k,) on the draft's device: nothing is read back while
    drafting, the logits of every step are checked for NaN once at the end) and the
    (V,) q rows they were drawn from."""
    logits = lm.sync(seq, check=False)
    tokens, rows, raw = [], [], []
    for d in range(k):
        raw.append(logits)
        probs = processed_probs(logits, sampling, check=False)
        tok = draft_index(probs, sampling, generator)
        tokens.append(tok)
        rows.append(probs)
        if d + 1 < k:
            logits = lm.step(tok, check=False)
    check_finite(torch.stack(raw), "draft model")
    return torch.cat(tokens), rows


def _greedy_children(logits: torch.Tensor, width: int) -> list[list[tuple[int, float]]]:
    """Per row of ``logits`` (F, V): its top-``width`` tokens by softmax probability
    as (token, probability) pairs, read to the host in one copy."""
    top = torch.topk(logits.float().softmax(-1), width, dim=-1)
    f, w = top.values.shape
    host = torch.cat([top.values.double().reshape(-1), top.indices.double().reshape(-1)]).tolist()
    return [[(int(host[f * w + r * w + c]), host[r * w + c]) for c in range(w)] for r in range(f)]


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
        greedy = sampling.greedy
        logits = self.lm.sync(seq, check=not greedy)
        self._tree_base, self._tree_fed = len(self.lm.ids), 0
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor | None] = []
        cum: list[float] = []
        raw = [logits.reshape(1, -1)]                 # greedy: every logits row, checked once at the end
        frontier = [(-1, logits, 1.0)]
        for depth in range(1, depth_cap + 1):
            width = tree.branching[depth - 1] if tree.branching is not None else tree.top_k
            if tree.top_k is not None:
                frontier = sorted(frontier, key=lambda f: -f[2])[: tree.top_k]
            new_nodes = []
            if greedy:     # the frontier's top-width children in one batch and one read
                children = _greedy_children(torch.stack([f[1] for f in frontier]), width)
            for r, (parent, node_logits, parent_prob) in enumerate(frontier):
                if greedy:
                    kids = [(tok, None, prob) for tok, prob in children[r]]
                else:
                    probs = processed_probs(node_logits, sampling)
                    kids = [(tok, row, float(probs[tok])) for tok, row in sample_siblings(probs, width, gen)]
                for tok, row, prob in kids:
                    new_nodes.append(len(tokens))
                    tokens.append(tok)
                    parents.append(parent)
                    rows.append(row)
                    cum.append(parent_prob * prob)
            if depth == depth_cap or len(tokens) >= 4 * budget or not new_nodes:
                break
            frontier = self._expand(new_nodes, tokens, parents, cum, check=not greedy)
            raw.extend(f[1].reshape(1, -1) for f in frontier)
        if greedy:
            check_finite(torch.cat(raw), "draft model")
        return self._select(tokens, parents, rows, cum, budget, sampling)

    def _expand(self, new_nodes, tokens, parents, cum, check: bool = True):
        """Feed the newest depth's nodes in one forward (their ids, positions and tree
        visibility travel to the device in one copy that does not grow with the
        context); return the next frontier (``check``: raise on NaN logits here)."""
        base = self._tree_base
        fed = self._tree_fed
        start = base + fed  # == cache length
        n_new = len(new_nodes)
        host = {"dtype": torch.long, "device": "cpu"}
        visible = torch.zeros((n_new, fed + n_new), **host)     # the tree part; the cache is all visible
        positions = []
        for row, node in enumerate(new_nodes):
            depth, cur = 0, node
            while cur >= 0:
                visible[row, cur] = 1
                cur, depth = parents[cur], depth + 1
            positions.append(base - 1 + depth)
        ids = torch.tensor([tokens[j] for j in new_nodes], **host)
        ids = torch.where(ids < self.lm.vocab, ids, torch.zeros_like(ids))
        param = next(self.lm.model.parameters())
        packed = torch.cat([ids, torch.tensor(positions, **host), visible.reshape(-1)]).to(param.device)
        mask = torch.zeros((n_new, start + n_new), dtype=param.dtype, device=param.device)
        mask[:, base:].masked_fill_(packed[2 * n_new:].reshape(n_new, -1) == 0, torch.finfo(param.dtype).min)
        out = model_forward(self.lm.model, self.lm.cache, packed[:n_new], mask[None, None],
                            packed[n_new:2 * n_new][None])
        logits = out.logits[0].float()
        if check:
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
        new = new.tolist()
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


@dataclasses.dataclass(frozen=True)
class SmallLMOptions(ContextOptions):
    """Options of a separate small-LM draft (`make_small_lm_drafter`; ``--draft
    small-lm`` without the trained heads, and any unregistered name, which is the
    ``model``): the `ContextOptions` (``dtype`` default "float32" and ``device``
    used) and:

    Attributes:
        model (str, "smollm2-135m"): draft model name / path (see `load_model`).
        retokenize (bool | None, None): None = auto (re-tokenise iff the token ids
            differ), True / False to force.
    """
    kind = "small-lm"

    dtype: str | torch.dtype | None = "float32"
    model: str = "smollm2-135m"
    retokenize: bool | None = None


def make_small_lm_drafter(target, model: str | None = None, *, dtype: str | torch.dtype | None = None,
                          device: str | None = None, retokenize: bool | None = None, **options):
    """Factory for the ``small-lm`` registry entry (and unregistered draft names).

    Args:
        target: the target's `LoadedModel`.
        model: draft model name / path (see `load_model`); None = `SmallLMOptions`'
            default, ``smollm2-135m``.
        dtype, device: for the draft (None: float32, the target's device).
        retokenize: None = auto (re-tokenise iff the token ids differ), True /
            False to force.
        **options: the other `ContextOptions` (ignored).

    Raises:
        ValueError: an option `SmallLMOptions` does not declare or a wrong type;
            ``retokenize=False`` with a draft vocabulary larger than the target's or
            token ids that mean different tokens.
    """
    opts = SmallLMOptions.from_options(dict(options, model=model, dtype=dtype, device=device,
                                            retokenize=retokenize))
    model, dtype, device, retokenize = opts.model, opts.dtype, opts.device, opts.retokenize
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
