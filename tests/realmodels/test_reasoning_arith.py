"""The arithmetic problem generator against an independent evaluation, answer
extraction, and the task items / HumanEval scoring through the harness."""
from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

import pytest

from specloop.data.arith import check_answer, extract_answer, generate_problems, parse_number
from specloop.realmodels.reasoning.tasks import (extract_code, humaneval_passes, interleave, load_task_items,
                                                 score)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _independent(expression: str) -> Fraction:
    """Evaluate the problem's infix expression with Python's own parser (not the
    generator's tree walk), in Fractions."""
    def walk(node):
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        return _OPS[type(node.op)](walk(node.left), walk(node.right))
    return walk(ast.parse(expression, mode="eval").body)


def _story_replay(question: str) -> Fraction:
    """A third path: re-read the story's sentences and apply them in order."""
    value = None
    for sentence in re.split(r"(?<=[.?])\s+", question):
        numbers = [int(n) for n in re.findall(r"\d+", sentence)]
        if " has " in sentence and value is None:
            value = Fraction(numbers[0])
        elif "buys" in sentence or "gives " in sentence and "A friend" in sentence:
            value += numbers[0]
        elif "gives away" in sentence or "loses" in sentence:
            value -= numbers[0]
        elif "times as many" in sentence:
            value *= numbers[0]
        elif "equally among" in sentence:
            value /= numbers[0]
        elif "sells for" in sentence:
            value *= numbers[0]
    return value


def test_answers_match_independent_evaluations():
    problems = generate_problems(300, seed=7)
    for p in problems:
        assert _independent(p.expression) == p.answer == p.tree.evaluate()
        assert _story_replay(p.question) == p.answer
        assert p.answer.denominator == 1 and p.answer >= 0
    assert len({p.question for p in problems}) > 290
    assert [p.question for p in generate_problems(5, seed=7)] == [p.question for p in problems[:5]]
    assert generate_problems(5, seed=8)[0].question != problems[0].question
    ops = "".join(p.expression for p in problems)
    assert all(op in ops for op in " + - * /".split())


def test_answer_extraction():
    assert extract_answer("... so she has \\boxed{1,234} apples") == 1234
    assert extract_answer("\\boxed{\\frac{3}{4}}") == Fraction(3, 4)
    assert extract_answer("The answer is $12.50.\nCheck: 3 + 4") == Fraction(25, 2)
    assert extract_answer("first 3 then 7 coins") == 7
    assert extract_answer("no numbers") is None
    assert parse_number("-5 and 2/3") == Fraction(2, 3)
    assert check_answer("\\boxed{42}", Fraction(42)) and not check_answer("\\boxed{41}", Fraction(42))


def test_task_items_and_scores():
    arith = load_task_items("arith", 3, seed=1)
    assert all("\\boxed{}" in item.text for item in arith)
    assert score(arith[0], f"\\boxed{{{arith[0].answer}}}") == 1.0 and score(arith[0], "\\boxed{-1}") == 0.0
    human = load_task_items("humaneval", 2)
    problem = human[0].problem
    good = "```python\n" + problem["prompt"] + problem["canonical_solution"] + "```"
    assert score(human[0], good) == 1.0
    assert score(human[0], "```python\ndef " + problem["entry_point"] + "(*a):\n    return None\n```") == 0.0
    assert not humaneval_passes(problem, "```python\nwhile True:\n    pass\n```", timeout=0.5)   # timed out
    assert extract_code("text\n```python\nx = 1\n```\nmore") == "x = 1\n"
    assert extract_code("```python\ny = 2\n") == "y = 2\n" and extract_code("z = 3") == "z = 3"
    mt = load_task_items("mt-bench", 2)
    assert score(mt[0], "anything") is None
    mixed = interleave([arith, human, mt])
    assert [i.task for i in mixed[:3]] == ["arith", "humaneval", "mt-bench"] and len(mixed) == 7
    with pytest.raises(ValueError, match="unknown task"):
        load_task_items("gsm-hard", 1)
    with pytest.raises(ValueError, match="has"):
        load_task_items("mt-bench", 1000)
