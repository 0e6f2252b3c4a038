"""Step segmentation: exact round trips (Hypothesis) and the delimiter rules."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from specloop.realmodels.reasoning.steps import CODE, REASONING, StepRule, rule_for_task, split_steps

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
