"""Prompts served in lockstep (stacked caches of several committed contexts, one
batched forward per kind of work) compute what each prompt computes alone: the
steps of `expand_steps_many` equal `expand_steps` per context, and `run_many` over
LR and single-model generations returns the records `run_one` returns (float32
greedy, tiny Llama and GPT-2 models: GPT-2's absolute positions expose a wrong
position id under left padding)."""
from __future__ import annotations

import pytest

from specloop.realmodels.reasoning.expansion import CommittedCache, expand_steps, expand_steps_many
from specloop.realmodels.reasoning.judge import ConstantJudge, HiddenStateJudge
from specloop.realmodels.reasoning.lockstep import JudgeRequest, run_many, run_one
from specloop.realmodels.reasoning.lookahead import (LookaheadConfig, Participant, alone_process,
                                                     lookahead_process)
from specloop.realmodels.reasoning.steps import StepRule
from tests.realmodels.reasoning_util import EOS, ToyTokenizer, target_and_draft, tiny_gpt2, tiny_loaded

RULE = StepRule("\n", 12, "test")
QUESTIONS = ["Q: 12 + 30?\nA:", "Q: what is 7 * 6? Think.\nA: 7 * 6", "Q: 5 - 2?\nA:", "Q: the sum 1+2+3 is?\nA: 1"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    if request.param == "gpt2":
        return tiny_gpt2(ToyTokenizer(), seed=0)
    return tiny_loaded(ToyTokenizer(), seed=0, newline_bias=0.3)


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_stacked_contexts_expand_as_each_context_alone(model, penalty):
    tok = model.tokenizer
    groups = []
    for i, question in enumerate(QUESTIONS):
        context = tok.encode(question)
        tails = [" 1", " 12 + 30 = 4", " 9\n"][: 1 + i % 3]
        caps = [12 - j for j in range(len(tails))]
        groups.append((CommittedCache(model.model, context), [context + tok.encode(t) for t in tails], caps))
    alone = [expand_steps(model.model, tok, prefixes, RULE, eos_ids={EOS}, base=base, repetition_penalty=penalty,
                          max_tokens=caps) for base, prefixes, caps in groups]
    stacked = expand_steps_many(model.model, tok, groups, RULE, eos_ids={EOS}, repetition_penalty=penalty)
    assert [[s.ids for s in g] for g in stacked] == [[s.ids for s in g] for g in alone]
    assert len({s.ids for g in alone for s in g}) > 3      # the contexts really lead to different steps
    for base, _, _ in groups:                              # the bases are left as they were
        assert base.cached == len(base.ids) - 1


def test_expand_steps_many_refuses_bad_groups(model):
    tok = model.tokenizer
    base = CommittedCache(model.model, tok.encode("Q: 1?\nA:"))
    other = CommittedCache(model.model, tok.encode("Q: 2?\nA:"))
    good = (base, [base.ids + tok.encode(" 1")], [4])
    with pytest.raises(ValueError, match="strict head"):
        expand_steps_many(model.model, tok, [good, (other, [base.ids + tok.encode(" 1")], [4])], RULE, eos_ids={EOS})
    with pytest.raises(ValueError, match="one cap"):
        expand_steps_many(model.model, tok, [good, (other, [other.ids + [5]], [])], RULE, eos_ids={EOS})
    with pytest.raises(ValueError, match="at least|>= 1"):
        expand_steps_many(model.model, tok, [], RULE, eos_ids={EOS})


def _participants(target, draft, question):
    def side(loaded):
        ids = loaded.tokenizer.encode("User: " + question + "\nAssistant:")
        return Participant(loaded.model, loaded.tokenizer, ids, {EOS})
    return side(target), side(draft)


def _summary(result):
    return (result.text, result.steps, result.target_tokens, result.stop_reason,
            [(r.drafted, r.accepted, r.target_step, [round(s, 5) for s in r.scores]) for r in result.rounds],
            [(f.prompt_ids, f.chosen_ids, f.rejected_ids) for f in result.feedback], result.judged)


@pytest.mark.parametrize("judge_kind", ["hidden", "always", "never"])
def test_lockstep_lookahead_equals_batch_one(judge_kind):
    target, draft = target_and_draft()
    judge = HiddenStateJudge(target, threshold=0.6) if judge_kind == "hidden" else ConstantJudge(judge_kind == "always")
    config = LookaheadConfig(num_draft_steps=3, max_new_tokens=40, rule=RULE)
    pairs = [_participants(target, draft, q) for q in QUESTIONS]
    alone = [run_one(lookahead_process(t, d, judge, config), judge) for t, d in pairs]
    together = run_many([lookahead_process(t, d, judge, config) for t, d in pairs], judge)
    assert [_summary(r) for r in together] == [_summary(r) for r in alone]
    if judge_kind == "hidden":    # the judge decides both ways somewhere, so rounds differ in shape
        assert {r.accepted for res in alone for r in res.rounds} >= {0, 1}


@pytest.mark.parametrize("width", [1, 2, 3])
def test_a_finished_generation_frees_its_slot(width):
    """At most ``width`` generations in flight; results in order and equal to batch 1."""
    target, draft = target_and_draft()
    judge = HiddenStateJudge(target, threshold=0.6)
    config = LookaheadConfig(num_draft_steps=2, max_new_tokens=24, rule=RULE)
    pairs = [_participants(target, draft, q) for q in QUESTIONS]
    alone = [run_one(lookahead_process(t, d, judge, config), judge) for t, d in pairs]
    seen = []

    class Counting:
        threshold = judge.threshold

        def scores(self, batch):
            seen.append(len(batch))
            return judge.scores(batch)
    counting = Counting()
    together = run_many([lookahead_process(t, d, counting, config) for t, d in pairs], counting, width=width)
    assert [_summary(r) for r in together] == [_summary(r) for r in alone]
    assert max(seen) <= width and (width == 1 or max(seen) == width)
    with pytest.raises(ValueError, match="width"):
        run_many([lookahead_process(*pairs[0], judge, config)], judge, width=0)


def test_lockstep_single_model_rows_equal_batch_one():
    target, draft = target_and_draft()
    config = LookaheadConfig(num_draft_steps=3, max_new_tokens=30, rule=RULE)
    pairs = [_participants(target, draft, q) for q in QUESTIONS]
    for make in (lambda t, d: alone_process(t, config), lambda t, d: alone_process(d, config, count_with=t)):
        alone = [run_one(make(t, d)) for t, d in pairs]
        together = run_many([make(t, d) for t, d in pairs])
        assert [_summary(r) for r in together] == [_summary(r) for r in alone]
        assert len({r.text for r in alone}) >= 3      # different prompts, different generations


def test_unknown_requests_are_refused():
    def asks():
        yield "expand please"
    with pytest.raises(TypeError, match="unknown request"):
        run_many([asks(), asks()])


def test_judge_requests_need_a_judge():
    def asks():
        yield JudgeRequest((("a", "a"),))
    with pytest.raises(ValueError, match="no judge"):
        run_one(asks())
    with pytest.raises(ValueError, match="no judge"):
        run_many([asks(), asks()])
    with pytest.raises(ValueError, match=">= 1"):
        run_many([])


def _eos_after(loaded, trigger: str):
    """``loaded`` whose model emits EOS right after the token ``trigger`` (a step may
    then end with EOS mid-step, or an EOS may open a step)."""
    import torch
    model, index = loaded.model, loaded.tokenizer.index[trigger]
    forward = model.forward

    def patched(*args, **kwargs):
        out = forward(*args, **kwargs)
        last = kwargs["input_ids"][:, -1]
        out.logits[:, -1, EOS] += torch.where(last == index, 1e4, 0.0).to(out.logits.dtype)
        return out
    model.forward = patched
    return loaded


@pytest.mark.parametrize("budget,penalty,eos_after", [(30, 1.0, None), (57, 1.0, None), (40, 1.3, None),
                                                      (60, 1.0, "\n"), (60, 1.2, " ")])
def test_target_row_in_one_request_equals_step_by_step(budget, penalty, eos_after):
    """The Target row's whole greedy continuation, cut into steps afterwards, gives the
    steps of step-by-step generation (forced here by counting with an equal but
    distinct participant, which takes the step-wise path), with EOS at a step's end,
    inside a step and at the budget."""
    target, draft = target_and_draft()
    if eos_after is not None:
        target = _eos_after(tiny_loaded(ToyTokenizer(), seed=0, newline_bias=0.5), eos_after)
    config = LookaheadConfig(num_draft_steps=3, max_new_tokens=budget, rule=StepRule("\n", 7, "test"),
                             repetition_penalty=penalty)
    stops = []
    for question in QUESTIONS:
        who, _ = _participants(target, draft, question)
        twin = Participant(who.model, who.tokenizer, list(who.prompt_ids), set(who.eos_ids))
        requests = []

        def counting(process):
            try:
                request = next(process)
                while True:
                    requests.append(request)
                    request = process.send(request.alone())
            except StopIteration as stop:
                return stop.value
        whole = counting(alone_process(who, config))
        assert len(requests) == 1
        stepwise = run_one(alone_process(who, config, count_with=twin))
        assert [s for s, _ in whole.steps] == [s for s, _ in stepwise.steps]
        assert (whole.target_tokens, whole.stop_reason) == (stepwise.target_tokens, stepwise.stop_reason)
        assert len(whole.rounds) == len(stepwise.rounds) >= 1
        stops.append(whole.stop_reason)
    assert ("eos" in stops) == (eos_after is not None)       # the EOS branches ran where forced
