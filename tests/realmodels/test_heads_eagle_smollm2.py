"""EAGLE / EAGLE-3 / hybrid drafts on the real SmolLM2-135M-Instruct: greedy
speculative output == plain greedy (chain and tree), through the drafter registry.
Uses the trained drafts when saved (cache or the shipped float16 copy), otherwise a
freshly initialised head (exactness does not depend on training)."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.heads.common import ReducedVocab
from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
from specloop.realmodels.heads.eagle_drafter import EagleDrafter
from specloop.realmodels.heads.hybrid import HybridDrafter
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.strategies.base import TreePlan

PROMPT = "def fibonacci(n):"
MAX_NEW = 10


@pytest.fixture(scope="module")
def target(smollm2_float32):
    return smollm2_float32


def _ids(target) -> list[int]:
    return target.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def plain(target):
    """Plain greedy continuation (k = 0 rounds: one target step each)."""
    return SpeculativeDecoder(target, NGramDrafter(), policy=FixedDraftPolicy(0)).generate(
        _ids(target), MAX_NEW).new_tokens


def _head(kind: str, target):
    from specloop.realmodels.registry.drafters import make_drafter
    try:
        drafter = make_drafter(kind, target, train_if_missing=False, progress=False)
    except FileNotFoundError:
        torch.manual_seed(0)
        d2t = torch.arange(0, 49152, 6)
        model = target.model
        cfg = EagleConfig.from_target(model.config, kind, int(d2t.numel()))
        head = EagleHead(cfg, model.get_input_embeddings().weight.detach(),
                         model.get_output_embeddings().weight.detach()[d2t])
        drafter = EagleDrafter(head, ReducedVocab(d2t, 49152), name=kind)
    assert drafter.name == kind
    return drafter


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_greedy_speculative_equals_plain_greedy_on_smollm2(target, plain, kind):
    drafter = _head(kind, target)
    ids = _ids(target)
    chain = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(4)).generate(ids, MAX_NEW)
    tree = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3, TreePlan(top_k=3, max_depth=3,
                                                                                   verify_size=12))
                              ).generate(ids, MAX_NEW)
    assert chain.new_tokens == plain
    assert tree.new_tokens == plain


def test_hybrid_on_smollm2(target, plain):
    hybrid = HybridDrafter(_head("eagle", target))
    out = SpeculativeDecoder(target, hybrid, policy=FixedDraftPolicy(4)).generate(_ids(target), MAX_NEW)
    assert out.new_tokens == plain
    assert 1 <= hybrid.head_rounds + hybrid.lookup_rounds <= len(out.trace)
