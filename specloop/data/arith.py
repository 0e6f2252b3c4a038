"""A seeded stream of GSM8K-like arithmetic word problems with exact answers
(a stand-in for GSM8K, Cobbe et al. 2021, in OnlineSpec Table 2; no download).

Each problem is a short story over one quantity: a start value and 2-4 operations
(buy / receive = +, give away / lose = -, "times as many" = *, share equally = /),
sometimes a final price per item (*). The story is built from an expression tree
(`Node`); the answer is the tree evaluated in exact arithmetic (`fractions.Fraction`),
and every intermediate value is a non-negative integer (divisions are chosen exact).
``expression`` is the same tree written as a Python arithmetic expression, so the
answer can be checked by an independent evaluation.

`extract_answer` reads a model's final answer: the last ``\\boxed{...}``, else the
number after the last "answer is", else the last number in the text; commas,
currency signs and units are ignored, fractions "a/b" and decimals are exact.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Node", "ArithProblem", "generate_problems", "extract_answer", "check_answer", "parse_number"]

_NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "cards", "shells", "coins", "stamps"]


@dataclass(frozen=True)
class Node:
    """Expression tree node: ``op`` in "+-*/" with two children, or a leaf
    (``op`` "n") holding ``value``."""

    op: str
    left: "Node | None" = None
    right: "Node | None" = None
    value: int = 0

    def evaluate(self) -> Fraction:
        """Exact value (ZeroDivisionError on a zero divisor)."""
        if self.op == "n":
            return Fraction(self.value)
        a, b = self.left.evaluate(), self.right.evaluate()
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else _zero_division()}[self.op]

    def expression(self) -> str:
        """Fully parenthesised infix form, e.g. "((12 + 5) * 3)"."""
        if self.op == "n":
            return str(self.value)
        return f"({self.left.expression()} {self.op} {self.right.expression()})"


def _zero_division():
    raise ZeroDivisionError("division by zero in an arithmetic problem")


@dataclass(frozen=True)
class ArithProblem:
    """One problem: ``id`` ("arith/<seed>/<i>"), ``question`` text, exact
    ``answer``, its ``expression`` (Python infix) and ``tree``."""

    id: str
    question: str
    answer: Fraction
    expression: str
    tree: Node


def _step(rng: random.Random, tree: Node, value: int, who: str, item: str) -> tuple[Node, int, str]:
    """One more operation on the running quantity: (new tree, new value, sentence)."""
    kinds = ["+", "-", "*"] + (["/"] if value >= 4 else [])
    op = rng.choice(kinds)
    if op == "+":
        b = rng.randint(2, 30)
        sentence = rng.choice([f"{who} buys {b} more {item}.", f"A friend gives {who} {b} {item}."])
        return Node("+", tree, Node("n", value=b)), value + b, sentence
    if op == "-" and value >= 2:
        b = rng.randint(1, value - 1)
        sentence = rng.choice([f"{who} gives away {b} {item}.", f"{who} loses {b} {item}."])
        return Node("-", tree, Node("n", value=b)), value - b, sentence
    if op == "/":
        divisors = [d for d in range(2, 7) if value % d == 0]
        if divisors:
            d = rng.choice(divisors)
            sentence = f"{who} shares the {item} equally among {d} boxes and keeps one box."
            return Node("/", tree, Node("n", value=d)), value // d, sentence
    k = rng.randint(2, 4)
    sentence = f"Then {who} ends up with {k} times as many {item} as before."
    return Node("*", tree, Node("n", value=k)), value * k, sentence


def generate_problems(count: int, seed: int = 0) -> list[ArithProblem]:
    """``count`` problems from ``random.Random(seed)`` (same seed, same problems).

    Raises:
        ValueError: count < 0.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    problems = []
    for i in range(count):
        who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        value = rng.randint(3, 40)
        tree, sentences = Node("n", value=value), [f"{who} has {value} {item}."]
        for _ in range(rng.randint(2, 4)):
            tree, value, sentence = _step(rng, tree, value, who, item)
            sentences.append(sentence)
        if rng.random() < 0.3:
            price = rng.randint(2, 9)
            tree = Node("*", tree, Node("n", value=price))
            sentences.append(f"Each of the {item} sells for ${price}.")
            sentences.append(f"How many dollars does {who} get by selling all of the {item}?")
        else:
            sentences.append(f"How many {item} does {who} have now?")
        problems.append(ArithProblem(f"arith/{seed}/{i}", " ".join(sentences), tree.evaluate(),
                                     tree.expression(), tree))
    return problems


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")


def parse_number(text: str) -> Fraction | None:
    """The last number in ``text`` as an exact Fraction ("1,234", "2.5", "3/4",
    "$12"); None if there is none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    token = found[-1].replace(",", "").replace(" ", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    begin = i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin: i - 1] if depth == 0 else text[begin:]


def extract_answer(text: str) -> Fraction | None:
    """A model's final answer (module docstring), or None."""
    boxed = _last_boxed(text)
    if boxed is not None:
        inner = re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"\1/\2", boxed)
        value = parse_number(inner)
        if value is not None:
            return value
    lowered = text.lower()
    at = lowered.rfind("answer is")
    if at >= 0:
        value = parse_number(text[at: at + 60].split("\n")[0])
        if value is not None:
            return value
    return parse_number(text)


def check_answer(text: str, answer: Fraction) -> bool:
    """Whether the extracted answer equals ``answer`` exactly."""
    value = extract_answer(text)
    return value is not None and value == Fraction(answer)
