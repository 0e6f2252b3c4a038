"""LR decoding on tiny models with different tokenizers: a judge that always accepts
reproduces the draft's output, one that never accepts the target's own greedy output;
token-level speculation inside the target's steps changes nothing; the judges."""
from __future__ import annotations

import math

import pytest
import torch

from specloop.realmodels.reasoning.expansion import padded_forward
from specloop.realmodels.reasoning.judge import (ALIGNMENT_TEMPLATE, ConstantJudge, ExactMatchJudge,
                                                 HiddenStateJudge, ModelJudge, alignment_prompt, judge_agreement,
                                                 make_judge, normalise_step)
from specloop.realmodels.reasoning.lookahead import (LookaheadConfig, Participant, generate_alone,
                                                     lookahead_generate)
from specloop.realmodels.reasoning.steps import StepRule
from tests.realmodels.reasoning_util import EOS, target_and_draft

RULE = StepRule("\n", 10, "test")
CONFIG = LookaheadConfig(num_draft_steps=3, max_new_tokens=30, rule=RULE)
PROMPT = "Q: 7 * 6 = ?\nA:"


@pytest.fixture(scope="module")
def models():
    return target_and_draft()


def _participants(models, prompt=PROMPT):
    target, draft = models
    make = (lambda m: Participant(m.model, m.tokenizer, m.tokenizer.encode(prompt), {EOS}))
    return make(target), make(draft)


def _plain_greedy(participant, steps):
    """transformers' own greedy generate (another code path than the step expansion)."""
    ids = torch.tensor([participant.prompt_ids])
    out = participant.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                                     do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    return [t for t in out[0, ids.shape[1]:].tolist() if t != EOS]


def test_always_accept_gives_the_drafts_output(models):
    target, draft = _participants(models)
    lr = lookahead_generate(target, draft, ConstantJudge(True), CONFIG)
    alone = generate_alone(draft, CONFIG, count_with=target)
    assert lr.text == alone.text and lr.steps == alone.steps and lr.target_tokens == alone.target_tokens
    assert all(src == "draft" for _, src in lr.steps) and not lr.feedback
    assert all(r.accepted == r.drafted == r.committed for r in lr.rounds[:-1])
    # the draft alone is its plain greedy decoding, cut at a step end
    greedy = draft.tokenizer.decode(_plain_greedy(draft, 3 * alone.target_tokens))
    assert greedy.startswith(alone.text) and len(greedy) > len(alone.text)


def test_never_accept_gives_the_targets_greedy_output(models):
    target, draft = _participants(models)
    lr = lookahead_generate(target, draft, ConstantJudge(False), CONFIG)
    alone = generate_alone(target, CONFIG)
    assert lr.text == alone.text and lr.target_tokens == alone.target_tokens
    assert all(src == "target" for _, src in lr.steps)
    assert [r.committed for r in lr.rounds] == [1] * len(lr.rounds)
    assert all(len(r.scores) == 1 for r in lr.rounds)     # judged up to the first rejection only
    greedy = _plain_greedy(target, alone.target_tokens + 1)
    assert target.tokenizer.decode(greedy).startswith(lr.text) and len(greedy) >= alone.target_tokens
    # every round's feedback pair: the target's step preferred over the first draft step
    assert len(lr.feedback) == len(lr.rounds)
    first = lr.feedback[0]
    assert first.prompt_ids == tuple(draft.prompt_ids)
    assert first.chosen_text == lr.steps[0][0]
    assert list(first.chosen_ids) == draft.encode(first.chosen_text)


def test_token_level_speculation_inside_target_steps_is_lossless(models):
    target, draft = _participants(models)
    spec = LookaheadConfig(3, 30, RULE, token_spec=True, spec_draft_tokens=3)
    judge = ExactMatchJudge()
    plain, fast = lookahead_generate(target, draft, judge, CONFIG), lookahead_generate(target, draft, judge, spec)
    assert fast.text == plain.text and fast.steps == plain.steps
    assert sum(r.spec_rounds for r in fast.rounds) > 0 and sum(r.spec_rounds for r in plain.rounds) == 0
    with pytest.raises(ValueError, match="repetition_penalty"):
        LookaheadConfig(token_spec=True, repetition_penalty=1.2)


def test_mixed_judge_commits_accepted_steps_then_the_targets(models):
    """A judge that accepts only the first pair of each round: rounds commit one draft
    step and then the target's step after it."""
    target, draft = _participants(models)

    class FirstOnly(ConstantJudge):
        batch_all = True          # all pairs of a round in one call

        def scores(self, pairs):
            return [1.0] + [0.0] * (len(pairs) - 1)

    lr = lookahead_generate(target, draft, FirstOnly(True), CONFIG)
    full = [r for r in lr.rounds if r.drafted == 3]
    assert full and all(r.accepted == 1 and r.target_step for r in full[:-1])
    assert all(len(r.scores) == 3 for r in full)
    assert [src for _, src in lr.steps[:2]] == ["draft", "target"]


def test_judges(models):
    target, _ = models
    assert normalise_step("So, 3 + 4 = 7.\n\n") == normalise_step("so 3 + 4 = 7")
    pairs = [("So, 3 + 4 = 7.", "so 3 + 4 = 7"), ("x = 2", "x = 5"), ("abc", "abc")]
    assert ExactMatchJudge().verdicts(pairs) == [True, False, True]
    model_judge = ModelJudge(target)
    scores = model_judge.scores(pairs)
    assert all(0.0 <= s <= 1.0 for s in scores) and len(scores) == 3
    prompt = alignment_prompt(target.tokenizer, "s one", "s two")
    assert ALIGNMENT_TEMPLATE.split("{draft_output}")[0] in prompt and prompt.endswith("[")
    assert "<start_s1>\ns one\n<end_s1>" in prompt and "<start_s2>\ns two\n<end_s2>" in prompt
    # the cached prompt head gives the scores of the whole prompt in one forward
    sequences = [target.tokenizer.encode(alignment_prompt(target.tokenizer, d, t)) for d, t in pairs]
    logits, _, _ = padded_forward(target.model, sequences)
    full = torch.softmax(torch.stack([logits[:, model_judge.yes_id], logits[:, model_judge.no_id]], -1), -1)[:, 0]
    assert scores == pytest.approx(full.tolist(), abs=1e-5)
    hidden = HiddenStateJudge(target, threshold=0.999)
    assert hidden.scores([("abc", "abc")])[0] == pytest.approx(1.0, abs=1e-5)
    stats = judge_agreement(ExactMatchJudge(), ConstantJudge(True), pairs)
    assert stats["agreement"] == pytest.approx(2 / 3) and stats["cheap_precision"] == 1.0
    assert math.isnan(judge_agreement(ConstantJudge(False), ConstantJudge(True), pairs)["cheap_precision"])
    assert make_judge("exact", target).name == "exact"
    with pytest.raises(ValueError, match="unknown judge"):
        make_judge("psychic", target)
    with pytest.raises(ValueError):
        ModelJudge(target, threshold=0.0)
