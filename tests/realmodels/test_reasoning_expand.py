"""The target's batched one-step expansion of ragged prefixes equals expanding each
prefix alone (float32 greedy), with and without a committed cache and a repetition
penalty; steps stop at delimiters, caps and EOS."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.reasoning.expansion import CommittedCache, common_prefix_length, expand_steps
from specloop.realmodels.reasoning.steps import StepRule
from tests.realmodels.reasoning_util import EOS, ToyTokenizer, tiny_gpt2, tiny_loaded

RULE = StepRule("\n", 12, "test")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def target(request):
    if request.param == "gpt2":
        return tiny_gpt2(ToyTokenizer(), seed=0)
    return tiny_loaded(ToyTokenizer(), seed=0, newline_bias=0.3)


def _prefixes(tok):
    context = tok.encode("Q: 12 + 30?\nA:")
    tails = ["", " 12", " 12 + 30 = 42.\n", " 4"]
    return context, [context + tok.encode(t) for t in tails]


def _greedy_reference(model, ids, steps):
    """Plain greedy decoding with no cache at all (full forward every token)."""
    ids = list(ids)
    out = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        token = int(logits.argmax())
        out.append(token)
        ids.append(token)
    return out


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_batched_expansion_equals_each_prefix_alone(target, penalty):
    tok = target.tokenizer
    context, prefixes = _prefixes(tok)
    alone = [expand_steps(target.model, tok, [p], RULE, eos_ids={EOS}, repetition_penalty=penalty)[0]
             for p in prefixes]
    batched = expand_steps(target.model, tok, prefixes, RULE, eos_ids={EOS}, repetition_penalty=penalty)
    cached = expand_steps(target.model, tok, prefixes, RULE, eos_ids={EOS}, repetition_penalty=penalty,
                          base=CommittedCache(target.model, context))
    assert [s.ids for s in batched] == [s.ids for s in alone] == [s.ids for s in cached]
    assert len({s.ids for s in alone}) > 1            # the prefixes really lead to different steps
    for step in alone:
        assert step.text == tok.decode(list(step.ids))
        assert step.eos or RULE.step_complete(step.text) or len(step.ids) == RULE.max_step_tokens
    if penalty == 1.0:
        for p, step in zip(prefixes, alone):
            ref = _greedy_reference(target.model, p, len(step.ids) + int(step.eos))
            assert list(step.ids) == [t for t in ref if t != EOS]


def test_batched_rows_see_no_padding(target):
    """A long row next to a short one: the short row's step is unchanged when the
    long row grows (padding is masked and positions count real tokens)."""
    tok = target.tokenizer
    short = tok.encode("x = 1\n")
    for extra in ("a", "abc abc abc abc abc"):
        long = tok.encode("x = 1\n" + extra)
        pair = expand_steps(target.model, tok, [short, long], RULE, eos_ids={EOS})
        assert pair[0].ids == expand_steps(target.model, tok, [short], RULE, eos_ids={EOS})[0].ids


def test_common_prefix_and_errors(target):
    assert common_prefix_length([[1, 2, 3], [1, 2, 4, 5]]) == 2
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 1
    with pytest.raises(ValueError):
        expand_steps(target.model, target.tokenizer, [], RULE, eos_ids={EOS})
    with pytest.raises(ValueError, match="strict head"):
        expand_steps(target.model, target.tokenizer, [[5, 6]], RULE, eos_ids={EOS},
                     base=CommittedCache(target.model, [5, 6, 7]))
