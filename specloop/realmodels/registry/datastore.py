"""The ``ngram-datastore`` drafter's index, loaded or built: the n-gram index
(`specloop.realmodels.drafters.datastore.NGramIndex`) of a target's warm-up corpus,
built once from the corpus the feature pipeline keeps (`specloop.realmodels.training`)
and cached under `datastore_root`, and the registry factory that wraps it in a
`DatastoreDrafter`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from pathlib import Path

import numpy as np

from specloop.realmodels.drafters.datastore import DatastoreDrafter, NGramIndex
from specloop.realmodels.drafters.options import KEEP_NONE, ContextOptions

__all__ = ["datastore_root", "load_or_build_index", "make_datastore_drafter", "BUILD_COMMAND",
           "DatastoreOptions"]


def datastore_root(target: str) -> Path:
    """``$SPECLOOP_CACHE/datastore/<target>`` or ``~/.cache/specloop/datastore/<target>``."""
    root = os.environ.get("SPECLOOP_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "specloop"
    return base / "datastore" / re.sub(r"[^A-Za-z0-9._-]+", "_", target)


def _warmup_stream(loaded, target: str, total_tokens: int, include_chat: bool) -> tuple[np.ndarray, dict]:
    """The training split of the target's warm-up corpus (cached by the feature
    pipeline; built and saved there when missing), plus the target's own cached
    chat responses to warm-up prompts when present. Returns (int32 stream, provenance)."""
    from specloop.realmodels.training.corpus import build_corpus, chat_documents, load_corpus, save_corpus
    from specloop.realmodels.training.features import features_root
    root = features_root(target)
    try:
        corpus = load_corpus(root / "corpus")
        if corpus.requested_tokens != total_tokens:
            raise FileNotFoundError
    except FileNotFoundError:
        corpus = build_corpus(loaded.tokenizer, total_tokens)
        save_corpus(corpus, root / "corpus")
    parts = [np.asarray(corpus.train_ids, dtype=np.int32)]
    meta = {"corpus_fingerprint": corpus.fingerprint, "corpus_tokens": int(corpus.train_ids.size),
            "chat_responses": 0}
    chat_path = root / "chat_responses.jsonl"
    if include_chat and chat_path.is_file():
        records = [json.loads(line) for line in chat_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if records:
            eos = loaded.tokenizer.eos_token_id
            for doc in chat_documents(records, loaded.tokenizer):
                parts.append(np.asarray(loaded.tokenizer(doc.text, add_special_tokens=False)["input_ids"] + [eos],
                                        dtype=np.int32))
            meta["chat_responses"] = len(records)
            meta["chat_digest"] = hashlib.sha256(chat_path.read_bytes()).hexdigest()[:16]
    return np.concatenate(parts), meta


BUILD_COMMAND = "specloop draft datastore --target {target}"


def load_or_build_index(loaded, target: str, *, total_tokens: int = 1_200_000, include_chat: bool = True,
                        root: str | Path | None = None, build_if_missing: bool = True) -> NGramIndex:
    """The datastore index of ``target``'s warm-up corpus, built once and cached.

    The cache is keyed by the corpus fingerprint (and the chat responses' digest),
    so a changed corpus is re-indexed. Loading a cached index takes milliseconds;
    building one from a cached corpus about a second; a missing corpus is first
    built with `build_corpus` and saved where the feature pipeline keeps it
    (minutes: it tokenises about 1.2M tokens).

    Args:
        loaded: the target `LoadedModel` (its tokenizer builds a missing corpus).
        target: the target's name (cache folder).
        total_tokens: the corpus' training-token budget (as the feature pipeline).
        include_chat: also index the target's cached chat responses, if present.
        root: cache folder (default `datastore_root`).
        build_if_missing: build a missing index (False: raise instead; nothing is
            built, e.g. inside transformers' ``generate``).

    Raises:
        ValueError: an empty corpus. FileNotFoundError: no cached index and
            ``build_if_missing`` is False (the message names the command that builds it).
    """
    folder = Path(root) if root is not None else datastore_root(target)
    from specloop.realmodels.training.features import features_root
    corpus_meta = features_root(target) / "corpus" / "corpus.json"
    chat_path = features_root(target) / "chat_responses.jsonl"
    key = None
    if corpus_meta.is_file():
        meta = json.loads(corpus_meta.read_text(encoding="utf-8"))
        if int(meta.get("requested_tokens", 0)) == total_tokens:
            key = meta["fingerprint"]
            if include_chat and chat_path.is_file():
                key += "-" + hashlib.sha256(chat_path.read_bytes()).hexdigest()[:16]
    if key is not None:
        try:
            index = NGramIndex.load(folder / key)
            return index
        except (FileNotFoundError, ValueError):
            pass
    if not build_if_missing:
        raise FileNotFoundError(f"no n-gram datastore index for target {target!r} in {folder}; build it with: "
                                + BUILD_COMMAND.format(target=target))
    if getattr(loaded, "tokenizer", None) is None:
        raise ValueError(f"building the datastore index of {target!r} needs the target's tokenizer; build it with: "
                         + BUILD_COMMAND.format(target=target))
    t0 = time.perf_counter()
    stream, meta = _warmup_stream(loaded, target, total_tokens, include_chat)
    key = meta["corpus_fingerprint"] + ("-" + meta["chat_digest"] if "chat_digest" in meta else "")
    index = NGramIndex.build(stream, dict(meta, target=target, build_seconds=time.perf_counter() - t0))
    index.save(folder / key)
    return NGramIndex.load(folder / key)


@dataclasses.dataclass(frozen=True)
class DatastoreOptions(ContextOptions):
    """Options of ``--draft ngram-datastore`` (`make_datastore_drafter`): the
    `ContextOptions` (``build_if_missing`` used: default True builds a missing cached
    index; False makes `load_or_build_index` raise FileNotFoundError) and:

    Attributes:
        index (NGramIndex | str | None, "cached"): an `NGramIndex`; None or "none" =
            prompt lookup only (None is kept, not read as the default); "cached" =
            ``index_dir`` if given, else the target's cached warm-up index.
        index_dir (str | PathLike | None, None): a folder written by `NGramIndex.save`.
        max_ngram (int, 6), min_ngram (int, 1), context_max_ngram (int, 4),
        context_min_ngram (int, 1), max_matches (int, 128), default_nodes (int, 24):
            as `DatastoreDrafter`.
    """
    kind = "ngram-datastore"

    index: NGramIndex | str | None = dataclasses.field(default="cached", metadata={KEEP_NONE: True})
    index_dir: str | os.PathLike | None = None
    max_ngram: int = 6
    min_ngram: int = 1
    context_max_ngram: int = 4
    context_min_ngram: int = 1
    max_matches: int = 128
    default_nodes: int = 24


def make_datastore_drafter(target, **options) -> DatastoreDrafter:
    """Registry factory: ``DatastoreDrafter`` over ``target``'s cached warm-up index.

    Args:
        target: the target's `LoadedModel` (its ``name`` keys the cache).
        **options: the fields of `DatastoreOptions`.

    Raises:
        ValueError: an option `DatastoreOptions` does not declare, a wrong type, an
            index string other than "cached" / "none", bad sizes (`DatastoreDrafter`).
        FileNotFoundError: no cached index and ``build_if_missing`` is False.
    """
    opts = DatastoreOptions.from_options(options)
    sizes = ("max_ngram", "min_ngram", "context_max_ngram", "context_min_ngram", "max_matches", "default_nodes")
    kwargs = {k: getattr(opts, k) for k in sizes}
    index = opts.index
    if isinstance(index, str) and index not in ("cached", "none"):
        raise ValueError(f"drafter 'ngram-datastore' option 'index' must be an NGramIndex, None, 'none' or "
                         f"'cached', got {index!r}")
    if index == "none":
        index = None
    elif isinstance(index, str):
        if opts.index_dir:
            index = NGramIndex.load(opts.index_dir)
        else:
            name = getattr(target, "name", None) or "target"
            index = load_or_build_index(target, name, build_if_missing=bool(opts.build_if_missing))
    return DatastoreDrafter(index, **kwargs)
