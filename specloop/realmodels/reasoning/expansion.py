"""Greedy step generation for Lookahead Reasoning, batch 1 or one batch of ragged
prefixes (Fu et al. 2025, Lookahead Reasoning: "the target expands each proposed
prefix by one step in a single batched pass"; OnlineSpec Table 2 / App. B.10).

`expand_steps` generates one step (`steps.StepRule`) after each of B token-id
prefixes in ONE batched forward loop: the prefixes' common head is prefilled once
(or taken from a batch-1 cache of the committed context, `CommittedCache`) and
repeated over the batch; each row's own tail is *left padded* to the longest tail
(pads sit between the shared head and the tail), with a float 4D additive mask that
hides the pads and per-row position ids that count real tokens only, so every row
computes what the same prefix computes alone (tested in float32 greedy). Rows that
finish (step delimiter, token cap, EOS) leave the batch.

`expand_steps_many` does the same for the prefixes of *several* committed contexts
(several prompts served in lockstep): each context's batch-1 cache is left padded to
the longest one and stacked, the pads hidden by the mask, positions counting each
row's real tokens, so a row computes what its prompt computes alone.

Decoding is greedy with an optional HF-style repetition penalty (OnlineSpec App.
B.10 uses 1.2): a logit s of a token already in the row (prefix or generated) becomes
s / r if s > 0 else s * r.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from specloop.realmodels.kvcache import _cache_kwarg, cache_length, causal_forward, new_cache
from specloop.realmodels.reasoning.steps import StepRule

__all__ = ["StepOutput", "CommittedCache", "expand_steps", "expand_steps_many", "padded_forward",
           "common_prefix_length", "last_logits_after"]


@dataclass(frozen=True)
class StepOutput:
    """One generated step.

    Attributes:
        ids: the step's token ids in the generating model's vocabulary (EOS excluded).
        text: ``tokenizer.decode(ids)``.
        eos: the step ended with EOS (the generation is over after it).
    """

    ids: tuple[int, ...]
    text: str
    eos: bool


class CommittedCache:
    """A batch-1 KV cache of a model over a growing committed context.

    Args:
        model: causal LM.
        ids: the initial context (int list, >= 2 tokens: the last token is kept out
            of the cache so that a step can always be generated from a 1-token tail).
    """

    def __init__(self, model, ids: list[int]):
        if len(ids) < 2:
            raise ValueError(f"a committed context needs >= 2 tokens, got {len(ids)}")
        self.model = model
        self.ids: list[int] = []
        self.cache = new_cache()
        self.extend(list(ids))

    @property
    def cached(self) -> int:
        """Tokens held in the cache (= len(ids) - 1)."""
        return cache_length(self.cache)

    def extend(self, new_ids: list[int]) -> None:
        """Append ``new_ids`` to the context (the cache follows up to the new last token)."""
        self.ids.extend(int(t) for t in new_ids)
        todo = self.ids[self.cached: len(self.ids) - 1]
        if todo:
            causal_forward(self.model, self.cache, torch.tensor(todo, dtype=torch.long), logits_to_keep=1)


def common_prefix_length(prefixes: list[list[int]]) -> int:
    """Length of the longest common head of all prefixes, at most min length - 1."""
    limit = min(len(p) for p in prefixes) - 1
    first = prefixes[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prefixes):
        n += 1
    return n


def _additive(visible: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    mask.masked_fill_(~visible.to(device), torch.finfo(dtype).min)
    return mask[:, None]


def _forward(model, cache, input_ids: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor,
             hidden: bool = False):
    """One forward; the LM head runs on the last position only (every row's last
    real token: rows are left padded), so a long prefill costs no full-vocabulary
    logits per position."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        return model(input_ids=input_ids.to(device), attention_mask=_additive(visible, dtype, device),
                     position_ids=positions.to(device), use_cache=cache is not None, logits_to_keep=1,
                     output_hidden_states=hidden, **({_cache_kwarg(model): cache} if cache is not None else {}))


def _tail_inputs(tails: list[list[int]], head: int, pad_id: int):
    """Left-padded tails after a shared head of ``head`` tokens: input (B, S), key
    validity (B, head + S), prefill visibility (B, S, head + S), positions (B, S)
    (`_ragged_tail_inputs` with every row's head the same and fully valid)."""
    return _ragged_tail_inputs(tails, [head] * len(tails), torch.ones((len(tails), head), dtype=torch.bool), pad_id)


def _penalise(logits: torch.Tensor, seen: list[set[int]], penalty: float) -> torch.Tensor:
    if penalty == 1.0:
        return logits
    logits = logits.clone()
    for b, tokens in enumerate(seen):
        idx = torch.tensor(sorted(tokens), dtype=torch.long, device=logits.device)
        values = logits[b, idx]
        logits[b, idx] = torch.where(values > 0, values / penalty, values * penalty)
    return logits


def expand_steps(model, tokenizer, prefixes: list[list[int]], rule: StepRule, *, eos_ids: set[int],
                 base: CommittedCache | None = None, repetition_penalty: float = 1.0,
                 max_tokens: int | list[int] | None = None) -> list[StepOutput]:
    """Generate one greedy step after every prefix, all prefixes in one batch.

    Args:
        model: causal LM (any dtype / device; float32 for exactness).
        tokenizer: its tokenizer (``decode``), to find step delimiters.
        prefixes: B >= 1 lists of token ids, each >= 1 token (ragged).
        rule: `StepRule` (delimiter, token cap).
        eos_ids: token ids that end the generation.
        base: optional `CommittedCache` whose ids are a head of every prefix and
            strictly shorter than each; its cache is copied, never modified.
            Without it the common head is prefilled once here.
        repetition_penalty: r >= 1.0 (1.0 = off).
        max_tokens: optional cap below ``rule.max_step_tokens`` (one int, or one per
            prefix; each >= 1), e.g. the tokens left in the budget.

    Returns:
        B `StepOutput`, in prefix order.

    Raises:
        ValueError: no prefixes, an empty prefix, a base that is not a strict head
            of every prefix, repetition_penalty < 1.
    """
    if not prefixes or any(len(p) == 0 for p in prefixes):
        raise ValueError("expand_steps needs >= 1 non-empty prefix")
    if repetition_penalty < 1.0:
        raise ValueError(f"repetition_penalty must be >= 1.0, got {repetition_penalty}")
    prefixes = [list(map(int, p)) for p in prefixes]
    if base is not None:
        head = base.cached
        if any(len(p) <= head or p[:len(base.ids)] != base.ids for p in prefixes):
            raise ValueError("the committed cache is not a strict head of every prefix")
        cache = copy.deepcopy(base.cache)
    else:
        head = common_prefix_length(prefixes)
        cache = new_cache()
        if head:
            causal_forward(model, cache, torch.tensor(prefixes[0][:head], dtype=torch.long), logits_to_keep=1)
    batch = len(prefixes)
    if head and batch > 1:
        cache.batch_repeat_interleave(batch)
    limits = max_tokens if isinstance(max_tokens, (list, tuple)) else [max_tokens] * batch
    if len(limits) != batch or any(m is not None and int(m) < 1 for m in limits):
        raise ValueError(f"max_tokens must be >= 1 (one per prefix), got {max_tokens}")
    cap = [int(rule.max_step_tokens if m is None else min(rule.max_step_tokens, int(m))) for m in limits]
    pad_id = prefixes[0][-1]
    input_ids, valid, visible, positions = _tail_inputs([p[head:] for p in prefixes], head, pad_id)
    logits = _forward(model, cache, input_ids, visible, positions).logits[:, -1].float()
    return _decode_loop(model, tokenizer, cache, logits, valid, positions[:, -1], prefixes, rule, cap,
                        eos_ids, float(repetition_penalty))


def expand_steps_many(model, tokenizer, groups: list[tuple[CommittedCache, list[list[int]], list[int]]],
                      rule: StepRule, *, eos_ids: set[int], repetition_penalty: float = 1.0) -> list[list[StepOutput]]:
    """`expand_steps` for the prefixes of several committed contexts in one batch.

    Args:
        model, tokenizer, rule, eos_ids, repetition_penalty: as `expand_steps`.
        groups: G >= 1 triples (base, prefixes, caps): a `CommittedCache` of this
            model (never modified), its prefixes (each strictly longer than the
            base's ids and starting with them) and one token cap per prefix (>= 1).
            A single group is exactly ``expand_steps(..., base=base, max_tokens=caps)``.

    Returns:
        per group, its `StepOutput` list in prefix order.

    Raises:
        ValueError: no groups, a group without prefixes, caps of the wrong length or
            < 1, a base that is not a strict head of its prefixes, repetition_penalty < 1.
    """
    if not groups or any(not prefixes for _, prefixes, _ in groups):
        raise ValueError("expand_steps_many needs >= 1 group, each with >= 1 prefix")
    if len(groups) == 1:
        base, prefixes, caps = groups[0]
        return [expand_steps(model, tokenizer, prefixes, rule, eos_ids=eos_ids, base=base,
                             repetition_penalty=repetition_penalty, max_tokens=list(caps))]
    if repetition_penalty < 1.0:
        raise ValueError(f"repetition_penalty must be >= 1.0, got {repetition_penalty}")
    rows, heads, caps, owners = [], [], [], []
    for g, (base, prefixes, limits) in enumerate(groups):
        if len(limits) != len(prefixes) or any(int(m) < 1 for m in limits):
            raise ValueError(f"group {g}: one cap >= 1 per prefix is needed, got {limits}")
        for prefix, limit in zip(prefixes, limits):
            prefix = list(map(int, prefix))
            if len(prefix) <= base.cached or prefix[:len(base.ids)] != base.ids:
                raise ValueError(f"group {g}: the committed cache is not a strict head of every prefix")
            rows.append(prefix)
            heads.append(base.cached)
            caps.append(min(rule.max_step_tokens, int(limit)))
            owners.append(g)
    cache, valid_head = _stacked_cache([groups[g][0].cache for g in owners], heads)
    input_ids, valid, visible, positions = _ragged_tail_inputs([r[h:] for r, h in zip(rows, heads)], heads,
                                                               valid_head, rows[0][-1])
    logits = _forward(model, cache, input_ids, visible, positions).logits[:, -1].float()
    flat = _decode_loop(model, tokenizer, cache, logits, valid, positions[:, -1], rows, rule, caps, eos_ids,
                        float(repetition_penalty))
    out: list[list[StepOutput]] = [[] for _ in groups]
    for g, step in zip(owners, flat):
        out[g].append(step)
    return out


def _stacked_cache(caches: list, heads: list[int]):
    """One ``DynamicCache`` of N rows from N batch-1 caches of lengths ``heads``, each
    left padded with zeros to the longest; returns (cache, validity bool (N, H))."""
    from transformers import DynamicCache
    width = max(heads)
    stacked = DynamicCache()
    valid = torch.zeros((len(caches), width), dtype=torch.bool)
    for row, head in enumerate(heads):
        valid[row, width - head:] = True
    if width == 0:
        return stacked, valid
    for layer in range(len(caches[0].layers)):
        first = caches[0].layers[layer].keys
        shape = (len(caches), first.shape[1], width, first.shape[3])
        keys = first.new_zeros(shape)
        values = caches[0].layers[layer].values.new_zeros(shape)
        for row, (cache, head) in enumerate(zip(caches, heads)):
            if head:
                keys[row, :, width - head:] = cache.layers[layer].keys[0]
                values[row, :, width - head:] = cache.layers[layer].values[0]
        stacked.update(keys, values, layer)
    return stacked, valid


def _ragged_tail_inputs(tails: list[list[int]], heads: list[int], valid_head: torch.Tensor, pad_id: int):
    """`_tail_inputs` over a stacked cache whose rows hold ``heads`` real tokens
    (``valid_head`` (N, H)): input (N, S), key validity (N, H + S), prefill
    visibility (N, S, H + S), positions (N, S) counting each row's real tokens."""
    width = max(len(t) for t in tails)
    batch, head = len(tails), valid_head.shape[1]
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    valid = torch.cat([valid_head, torch.ones((batch, width), dtype=torch.bool)], dim=1)
    positions = torch.zeros((batch, width), dtype=torch.long)
    for b, tail in enumerate(tails):
        pad = width - len(tail)
        input_ids[b, pad:] = torch.tensor(tail, dtype=torch.long)
        valid[b, head: head + pad] = False
        positions[b, :] = heads[b]
        positions[b, pad:] = heads[b] + torch.arange(len(tail))
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    visible = valid[:, None, :].repeat(1, width, 1)
    visible[:, :, head:] &= causal
    visible[:, torch.arange(width), head + torch.arange(width)] = True   # pad rows see themselves (no NaN)
    return input_ids, valid, visible, positions


def _decode_loop(model, tokenizer, cache, logits, valid, last_pos, prefixes, rule, cap, eos_ids, penalty):
    batch = len(prefixes)
    generated: list[list[int]] = [[] for _ in range(batch)]
    results: list[StepOutput | None] = [None] * batch
    seen = [set(p) for p in prefixes] if penalty != 1.0 else []
    active = list(range(batch))
    while True:
        scores = _penalise(logits, [seen[b] for b in active], penalty) if penalty != 1.0 else logits
        next_ids = scores.argmax(dim=-1).tolist()
        keep = []
        for row, b in enumerate(active):
            token = int(next_ids[row])
            if token in eos_ids:
                results[b] = StepOutput(tuple(generated[b]), tokenizer.decode(generated[b]), True)
                continue
            generated[b].append(token)
            if penalty != 1.0:
                seen[b].add(token)
            text = tokenizer.decode(generated[b])
            if rule.step_complete(text) or len(generated[b]) >= cap[b]:
                results[b] = StepOutput(tuple(generated[b]), text, False)
                continue
            keep.append(row)
        if not keep:
            return results
        if len(keep) < len(active):
            index = torch.tensor(keep, dtype=torch.long)
            cache.batch_select_indices(index.to(next(model.parameters()).device))
            valid, last_pos = valid[index], last_pos[index]
            next_ids = [next_ids[r] for r in keep]
            active = [active[r] for r in keep]
        valid = torch.cat([valid, torch.ones((len(active), 1), dtype=torch.bool)], dim=1)
        last_pos = last_pos + 1
        out = _forward(model, cache, torch.tensor(next_ids, dtype=torch.long)[:, None], valid[:, None, :],
                       last_pos[:, None])
        logits = out.logits[:, -1].float()


def padded_forward(model, sequences: list[list[int]], *, hidden: bool = False):
    """One left-padded batch forward (no cache) over ragged ``sequences``.

    Returns:
        (logits float32 (B, V) at each row's last token, last-layer hidden states
        (B, S, H) or None, validity bool (B, S) of the padded positions).

    Raises:
        ValueError: no sequences or an empty one.
    """
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("padded_forward needs >= 1 non-empty sequence")
    input_ids, valid, visible, positions = _tail_inputs([list(map(int, s)) for s in sequences], 0,
                                                        int(sequences[0][-1]))
    out = _forward(model, None, input_ids, visible, positions, hidden)
    states = out.hidden_states[-1].float() if hidden else None
    return out.logits[:, -1].float(), states, valid


def last_logits_after(base: CommittedCache, tails: list[list[int]]) -> torch.Tensor:
    """float32 (B, V) next-token logits after ``base.ids + tail`` for each tail (one
    left-padded batch on a copy of the base's cache; the base is not modified).

    Raises:
        ValueError: no tails.
    """
    if not tails:
        raise ValueError("last_logits_after needs >= 1 tail")
    head = base.cached
    rows = [base.ids[head:] + list(map(int, t)) for t in tails]
    cache = copy.deepcopy(base.cache)
    if len(rows) > 1:
        cache.batch_repeat_interleave(len(rows))
    input_ids, _, visible, positions = _tail_inputs(rows, head, rows[0][-1])
    return _forward(base.model, cache, input_ids, visible, positions).logits[:, -1].float()
