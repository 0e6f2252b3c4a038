"""Medusa / Hydra / distilled small-LM drafts on the real SmolLM2-135M-Instruct:
greedy speculative output == plain greedy (chain and tree), through the drafter
registry. Uses the trained drafts when saved (cache or shipped float16 copy),
otherwise freshly initialised ones (exactness does not depend on training)."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.strategies.base import TreePlan

PROMPTS = ["def fibonacci(n):", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def target(smollm2_float32):
    return smollm2_float32


def _fresh(kind: str, target):
    from specloop.realmodels.heads.head_drafting import HydraDrafter, MedusaDrafter
    from specloop.realmodels.heads.hydra import build_hydra
    from specloop.realmodels.heads.medusa import build_medusa
    from specloop.realmodels.heads.small_lm import SmallLMDraft, SmallLMDraftDrafter
    torch.manual_seed(0)
    d2t = torch.arange(0, 49152, 6)
    if kind == "hydra":
        return HydraDrafter(build_hydra(target.model, d2t, num_heads=4))
    if kind == "medusa":
        return MedusaDrafter(build_medusa(target.model, d2t, num_heads=4))
    return SmallLMDraftDrafter(SmallLMDraft.from_target(target.model, d2t, num_layers=2))


def _drafter(kind: str, target):
    from specloop.realmodels.registry.drafters import make_drafter
    try:
        return make_drafter(kind, target, train_if_missing=False, progress=False)
    except FileNotFoundError:
        return _fresh(kind, target)


def _ids(target, text: str) -> list[int]:
    return target.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def plain(target):
    """Plain greedy continuations (k = 0 rounds: one target step each), per prompt."""
    from specloop.realmodels.drafters.ngram import NGramDrafter
    out = {}
    for text in PROMPTS:
        ids = _ids(target, text)
        out[text] = SpeculativeDecoder(target, NGramDrafter(), policy=FixedDraftPolicy(0)).generate(ids, 16).new_tokens
    return out


def _check(target, plain, kind: str, texts, max_new: int) -> None:
    drafter = _drafter(kind, target)
    assert drafter.name in (kind, "small-lm")
    for text in texts:
        ids = _ids(target, text)
        chain = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(4)).generate(ids, max_new)
        tree = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3, TreePlan(branching=(3, 2, 1)))
                                  ).generate(ids, max_new)
        assert chain.new_tokens == plain[text][:max_new]
        assert tree.new_tokens == plain[text][:max_new]


@pytest.mark.parametrize("kind", ["hydra", "medusa", "small-lm"])
def test_greedy_speculative_equals_plain_greedy_on_smollm2(target, plain, kind):
    _check(target, plain, kind, PROMPTS[:1], 8)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hydra", "medusa", "small-lm"])
def test_greedy_speculative_equals_plain_greedy_on_smollm2_more_prompts(target, plain, kind):
    _check(target, plain, kind, PROMPTS, 16)
