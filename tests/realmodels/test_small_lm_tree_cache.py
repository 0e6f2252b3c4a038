"""The small-LM drafter's own KV cache after pruned tree rounds.

The drafter feeds its tree into its cache in drafting order; after the round it must keep
exactly the rows of the accepted path. When the drafter's own selection or the decoder's
clipping drops nodes, the verified proposal's node i is no longer drafted node i: the
mapping (`DraftProposal.source_index`) must survive every pruning, or the cache keeps the
keys of other nodes (the output stays lossless; the draft conditions on the wrong
context). The check: after every round the cached keys equal those of a fresh forward of
the draft over the ids it believes it holds.
"""
from __future__ import annotations

import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.small_lm import SmallLMDrafter
from specloop.realmodels.kvcache import cache_tensors, causal_forward, new_cache
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.strategies.base import TreePlan

from tests.realmodels.decoder_util import as_loaded, plain_greedy, tiny_llama


class _CacheChecker(SmallLMDrafter):
    """Records, after each observe, the largest key difference between the drafter's
    cache and a fresh forward over its ids."""

    def __init__(self, model):
        super().__init__(model)
        self.gaps: list[float] = []

    def observe(self, feedback):
        out = super().observe(feedback)
        ids = self.lm.ids
        fresh = new_cache()
        causal_forward(self.lm.model, fresh, torch.tensor(ids), logits_to_keep=1)
        ours, ref = cache_tensors(self.lm.cache), cache_tensors(fresh)
        gap = 0.0
        for (k, v), (k_ref, v_ref) in zip(ours, ref):
            if k.shape != k_ref.shape:
                gap = float("inf")
                break
            gap = max(gap, float((k - k_ref).abs().max()), float((v - v_ref).abs().max()))
        self.gaps.append(gap)
        return out


def test_draft_cache_holds_the_accepted_path_after_pruned_tree_rounds():
    target = tiny_llama(vocab=16, seed=0, layers=2, hidden=16)
    draft = tiny_llama(vocab=16, seed=0, layers=2, hidden=16, scale=0.97)   # close to the target
    prompt = [1, 4, 7, 2, 9, 3, 5]
    # 3 x 3 x 2 = up to 30 drafted nodes, verify_size 6: the drafter prunes every round
    policy = FixedDraftPolicy(3, TreePlan(branching=(3, 3, 2), verify_size=6))
    drafter = _CacheChecker(draft)
    out = SpeculativeDecoder(as_loaded(target), drafter, policy=policy, eos_token_id=[]).generate(prompt, 24)
    assert out.new_tokens == plain_greedy(target, prompt, 24)
    accepted = sum(r.accepted_tokens for r in out.trace)
    assert accepted >= 3, "the test needs rounds that accept pruned-tree nodes"
    assert max(drafter.gaps) < 1e-5, drafter.gaps
