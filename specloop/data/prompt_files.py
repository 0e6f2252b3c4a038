"""A researcher's own prompts: a local file or a dataset in the local Hugging Face cache,
read with the ``datasets`` library, wherever a registered dataset name goes
(``--datasets`` of ``specloop stream``, ``stream record``, ``answers generate``;
``--tasks`` of ``specloop reason``).

Sources (`is_prompt_source` tells one from a registered name):

* a local ``.jsonl`` / ``.json`` (JSON lines, or one JSON array of objects), ``.csv``
  or ``.parquet`` file (``.gz`` / ``.bz2`` / ``.xz`` / ``.zst`` compressed JSON and CSV
  too), given by its path;
* a dataset already in the local Hugging Face cache, by its hub id (``owner/name``,
  optionally ``owner/name:SPLIT``; without a split, its only split, else ``train``).
  It is opened with the hub offline: nothing is downloaded.

Rows. Each row needs a ``prompt`` (a non-empty string: one user turn) or ``messages`` (a
chat: a non-empty list of ``{"role", "content"}`` objects; trailing assistant turns are
dropped, so a conversation with its answer is a prompt for the answer; at least one
user turn). Optional: ``id`` (the row's own id, default its row number counted from
1) and ``domain`` (the domain the row counts under in per-domain results and
recordings, default the file's name without its suffix, or the dataset's name).

A ``messages`` prompt is rendered with the target's chat template as a whole
conversation (`specloop.data.streams.encode_prompt`); without a template (or raw) its
turns' contents are joined by blank lines. `specloop reason` takes its last user turn.

Splits are the registered datasets' (`specloop.data.prompts`): rows with
``row_index % 4 == 0`` are held out, the warm-up split is the rest less the rows
related to a held-out row, ``all`` is every row; so a stream (held out) never sees a
row a draft warmed up on.

Refused, in one line naming the source and the row (ValueError): an empty file or
dataset, a file that is not valid JSON / CSV / Parquet, a row with neither field, an
empty prompt, malformed messages.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

__all__ = ["FILE_SUFFIXES", "is_prompt_source", "source_rows", "source_label"]

#: file suffixes read as prompt files, and the ``datasets`` builder of each
FILE_SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")


def _file_suffix(path: Path) -> str | None:
    """The prompt-file suffix of ``path`` ('.jsonl', ...; a compression suffix skipped)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSED:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes and suffixes[-1] in FILE_SUFFIXES else None


def is_prompt_source(name: str) -> bool:
    """Whether ``name`` reads as a prompt file or a Hugging Face dataset: an existing
    file, a name with a prompt-file suffix, or a name with a ``/`` (a path or a hub
    id). Callers look registered names up first (`specloop.data.prompts.load_prompts`
    does): no registered name has a suffix or a ``/``."""
    return Path(name).is_file() or _file_suffix(Path(name)) is not None or "/" in name or os.sep in name


def source_label(name: str) -> str:
    """The default domain of a source's rows: a file's name without its suffixes, or a
    hub dataset's name (``owner/name:split`` -> ``name``)."""
    path = Path(name)
    if path.is_file() or _file_suffix(path) is not None:
        base = path.name
        for suffix in reversed(path.suffixes):
            if suffix.lower() in FILE_SUFFIXES or suffix.lower() in _COMPRESSED:
                base = base[: -len(suffix)]
        return base or path.name
    return name.split(":", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def source_rows(name: str) -> list[dict]:
    """The rows of a prompt source, in its order: per row ``id``, ``domain``, ``text``
    (the prompt, or the last user turn of ``messages``), ``turns`` (the user turns) and
    ``messages`` (tuple of (role, content) pairs, or None for a plain prompt).

    Raises:
        FileNotFoundError: a file path (a prompt-file suffix) that does not exist.
        ValueError: an unreadable, empty or malformed source (the source and the row
            named), a hub id that is not in the local cache.
    """
    path = Path(name)
    if path.is_file() or _file_suffix(path) is not None:
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {name}: no such file")
        table, where = _read_file(path), name
    else:
        table, where = _read_cached_dataset(name), f"dataset {name!r}"
    if len(table) == 0:
        raise ValueError(f"{where}: no rows")
    label = source_label(name)
    return [_row(where, i, row, label) for i, row in enumerate(table)]


def _read_file(path: Path):
    """The ``datasets`` table of a local prompt file (a ``Dataset``)."""
    suffix = _file_suffix(path)
    if suffix is None:
        raise ValueError(f"prompt file {path}: unknown format; use .jsonl, .json, .csv or .parquet")
    if path.stat().st_size == 0:
        raise ValueError(f"prompt file {path}: empty (no rows)")
    datasets = _datasets()
    try:
        with _offline(datasets):
            return datasets.load_dataset(FILE_SUFFIXES[suffix], data_files=str(path), split="train")
    except Exception as err:                      # the library's errors differ by format and version
        raise ValueError(f"prompt file {path}: {_where_unreadable(path, suffix, err)}") from None


def _where_unreadable(path: Path, suffix: str, err: Exception) -> str:
    """Why a file did not load, with the first offending row of a JSON file when the
    standard library can point at it (only to name the row; the table is the library's)."""
    cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
    if suffix not in (".json", ".jsonl") or path.suffixes[-1].lower() in _COMPRESSED:
        return f"cannot be read as {suffix[1:]} ({cause})"
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        json.loads(text)
        whole = True
    except json.JSONDecodeError as whole_err:
        whole = False
        if text.lstrip().startswith("["):
            return f"not valid JSON at line {whole_err.lineno} column {whole_err.colno} ({whole_err.msg})"
    if not whole:
        row = 0
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            row += 1
            try:
                value = json.loads(line)
            except json.JSONDecodeError as line_err:
                return f"row {row} (line {number}) is not valid JSON ({line_err.msg})"
            if not isinstance(value, dict):
                return f"row {row} (line {number}) is not a JSON object"
    return f"cannot be read as JSON rows ({cause})"


def _read_cached_dataset(name: str):
    """A hub dataset from the local Hugging Face cache (hub offline), one split."""
    repo, _, split = name.partition(":")
    datasets = _datasets()
    try:
        with _offline(datasets):
            loaded = datasets.load_dataset(repo, split=split or None)
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"dataset {name!r} is not a registered dataset, a prompt file (.jsonl, .json, .csv, "
                         f".parquet) or a dataset in the local Hugging Face cache ({first[:200]})") from None
    if isinstance(loaded, datasets.DatasetDict):                    # no split named: pick one
        splits = list(loaded.keys())
        if len(splits) == 1 or "train" in splits:
            return loaded[splits[0] if len(splits) == 1 else "train"]
        raise ValueError(f"dataset {name!r} has splits {splits}; name one as {repo}:SPLIT")
    return loaded


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ValueError("reading a prompt file needs the 'datasets' package: pip install datasets") from None
    return datasets


@contextmanager
def _offline(datasets):
    """The hub offline for the duration (nothing is downloaded: the flags the
    ``datasets`` library and ``huggingface_hub`` read at call time), and the library
    quiet (no progress bars or warnings on stderr); everything restored after."""
    import huggingface_hub.constants as hub_constants
    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    bars_were_on, verbosity = not datasets.utils.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
        datasets.logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and value != value)     # None / NaN: absent


def _row(where: str, index: int, row: dict, label: str) -> dict:
    """One validated row (see `source_rows`); ``index`` counts from 0."""
    at = f"{where}: row {index + 1}"
    prompt, messages = row.get("prompt"), row.get("messages")
    if _present(messages):
        turns = _messages(at, messages)
        users = [content for role, content in turns if role == "user"]
        text, user_turns = users[-1], tuple(users)
    elif _present(prompt):
        if not isinstance(prompt, str):
            raise ValueError(f"{at}: 'prompt' must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError(f"{at}: empty prompt")
        turns, text, user_turns = None, prompt, (prompt,)
    else:
        raise ValueError(f"{at} has neither a 'prompt' nor a 'messages' field")
    ident, domain = row.get("id"), row.get("domain")
    domain = str(domain).strip() if _present(domain) else ""
    return {"id": str(ident) if _present(ident) else str(index + 1), "domain": domain or label,
            "text": text, "turns": user_turns, "messages": turns}


def _messages(at: str, messages) -> tuple[tuple[str, str], ...]:
    """A row's chat as (role, content) pairs, trailing assistant turns dropped."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{at}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    turns = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise ValueError(f"{at}: every message needs a string 'role' and 'content', got {message!r}"[:300])
        turns.append((message["role"], message["content"]))
    while turns and turns[-1][0] == "assistant":
        turns.pop()
    if not any(role == "user" and content.strip() for role, content in turns):
        raise ValueError(f"{at}: 'messages' has no non-empty user turn")
    return tuple(turns)
