"""Step segmentation: exact round trips (Hypothesis) and the delimiter rules."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from specloop.realmodels.reasoning.steps import CODE, DELIMITERS, REASONING, StepRule, rule_for_task, split_steps

TEXT = st.text(alphabet=st.sampled_from(list("ab \n\t.=1")), max_size=60)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.sampled_from([REASONING, CODE, StepRule("==", 8, "custom")]))
def test_split_round_trips_and_each_step_ends_at_a_delimiter(text, rule):
    steps = split_steps(text, rule)
    assert "".join(steps) == text
    assert all(steps)
    for step in steps[:-1]:
        assert step.endswith(rule.delimiter)
        assert rule.step_complete(step)
    # no complete step hides inside a step: its first delimiter after content ends it
    for step in steps:
        assert split_steps(step, rule) == [step]


def test_rules_on_examples():
    assert split_steps("a\n\nb\n\n\n\nc", REASONING) == ["a\n\n", "b\n\n\n\n", "c"]
    assert split_steps("\n\nintro\n\nnext", REASONING) == ["\n\nintro\n\n", "next"]
    assert split_steps("def f():\n    return 1\n", CODE) == ["def f():\n", "    return 1\n"]
    assert split_steps("", REASONING) == []
    assert REASONING.step_complete("x = 3.\n\n") and not REASONING.step_complete("\n\nx = 3.")
    assert rule_for_task("humaneval") == CODE and rule_for_task("arith", 9).max_step_tokens == 9
    with pytest.raises(ValueError):
        StepRule("", 4)
    with pytest.raises(ValueError):
        StepRule("\n", 0)


def test_named_delimiters_override_the_task_rule():
    newline = rule_for_task("arith", delimiter="newline")
    assert newline.delimiter == "\n" and newline.max_step_tokens == REASONING.max_step_tokens
    assert split_steps("1. add 3\n2. times 2\n", newline) == ["1. add 3\n", "2. times 2\n"]
    blank = rule_for_task("humaneval", 7, delimiter="blank-line")
    assert (blank.delimiter, blank.max_step_tokens) == ("\n\n", 7)
    assert rule_for_task("arith", delimiter=None) == REASONING and set(DELIMITERS) == {"blank-line", "newline"}
    with pytest.raises(ValueError, match="unknown step delimiter"):
        rule_for_task("arith", delimiter="tab")
