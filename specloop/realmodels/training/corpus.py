"""Warm-up corpus of real offline text for training draft heads.

Sources (all on disk, no downloads):

* ``stdlib`` — the Python standard library's source (``sysconfig.get_paths()["stdlib"]``,
  ``*.py`` outside ``site-packages`` and the ``test`` packages);
* ``docs`` — documentation text Debian packages ship under ``/usr/share/doc``
  (README / FAQ / ``*.txt`` / ``*.md`` / ``*.rst`` / examples; copyright, changelog,
  NEWS, AUTHORS and binary files are skipped; ``.gz`` is decompressed);
* ``man`` — man pages under ``/usr/share/man`` (zcat), roff markup stripped to text;
* ``prompts`` — `specloop.data.prompts.warmup_texts` of HumanEval, MT-bench and IFBench
  (the warm-up split only: the held-out split never enters a corpus);
* ``chat`` — the target's own greedy chat responses to warm-up prompts, generated once
  and cached (`generate_chat_responses`); kept as a separate, minority part.

Determinism: file lists are sorted, documents are shuffled with a seeded
``np.random.Generator`` and taken until each source's token quota is met. A document
goes to the **validation** slice iff ``crc32(doc_id) % VAL_EVERY == 0`` — a pure
function of its id, so the slice never depends on the quota or the order.
The training stream interleaves sources at the document level, so any prefix of it
has the full mixture (training can start on the first chunks while extraction runs).
Documents are joined with the tokenizer's EOS token and packed into one id stream.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import sysconfig
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

__all__ = ["Document", "Corpus", "DEFAULT_MIX", "VAL_EVERY", "MAX_DOC_CHARS", "SOURCES",
           "iter_documents", "build_corpus", "strip_roff", "chat_documents",
           "save_corpus", "load_corpus", "parse_mix", "check_mix", "normalise_mix", "mix_tag"]

VAL_EVERY = 40               # 1 document in 40 (by id hash) is validation
MAX_DOC_CHARS = 12_000       # long files are cut so no single file dominates
DEFAULT_MIX = {"stdlib": 0.45, "docs": 0.2, "man": 0.2, "prompts": 0.15}

_DOC_SKIP = re.compile(r"^(copyright|changelog|news|authors|thanks|credits|license|copying)",
                       re.IGNORECASE)
_DOC_EXT = {"", ".txt", ".md", ".rst", ".markdown", ".py", ".c", ".h", ".sh", ".pl", ".conf",
            ".example", ".awk", ".debian", ".el", ".rb", ".js", ".tex", ".org", ".cfg"}


@dataclass(frozen=True)
class Document:
    """One text document. ``id`` is stable across machines with the same files."""

    id: str
    source: str
    text: str

    @property
    def is_validation(self) -> bool:
        return zlib.crc32(self.id.encode("utf-8")) % VAL_EVERY == 0


@dataclass
class Corpus:
    """A tokenised corpus.

    Attributes:
        train_ids: int32 [N_train] token ids (documents joined by EOS).
        val_ids: int32 [N_val] held-out validation ids (same layout).
        docs: per document ``{"id", "source", "tokens", "split"}``.
        fingerprint: sha256 of the document list and counts (16 hex chars); the
            feature cache stores it to detect a changed corpus.
    """

    train_ids: np.ndarray
    val_ids: np.ndarray
    docs: list[dict] = field(default_factory=list)
    fingerprint: str = ""
    requested_tokens: int = 0
    mix: dict[str, float] = field(default_factory=dict)

    def tokens_by_source(self, split: str = "train") -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.docs:
            if d["split"] == split:
                out[d["source"]] = out.get(d["source"], 0) + int(d["tokens"])
        return out


def strip_roff(text: str) -> str:
    """Turn man-page roff source into plain text (macros dropped, escapes removed);
    section headers (``.SH``/``.SS``) and macro arguments that are prose are kept."""
    lines = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            if not parts:
                continue
            macro = parts[0]
            arg = parts[1] if len(parts) > 1 else ""
            if macro in ("SH", "SS", "B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "TP", "IP", "Nm",
                         "Nd", "Sh", "Ss", "It", "Fl", "Ar", "Op", "Pa", "Xr"):
                arg = arg.replace('"', "")
                if macro in ("BR", "IR", "RB", "RI", "BI", "IB"):
                    arg = arg.replace(" ", "")
                line = arg
            else:
                continue
        line = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", line)
        line = re.sub(r"\\\(..|\\\[[^\]]*\]", "", line)
        line = line.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "").replace("\\ ", " ")
        line = re.sub(r"\\[*n]\(?\w{1,2}", "", line)
        line = re.sub(r"\\.", "", line)
        lines.append(line)
    return "\n".join(lines).strip()


def _read_text(path: Path) -> str | None:
    """UTF-8 text of a (possibly gzipped) file, or None if binary / unreadable."""
    try:
        data = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error):
        return None
    if b"\x00" in data[:4096]:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    printable = sum(ch.isprintable() or ch in "\n\t\r" for ch in text[:4096])
    if not text.strip() or printable < 0.97 * min(len(text), 4096):
        return None
    return text[:MAX_DOC_CHARS]


def _stdlib_docs() -> Iterator[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or rel.startswith(("test/", "idlelib/idle_test/")) or "/tests/" in rel:
            continue
        text = _read_text(path)
        if text:
            yield Document(f"stdlib:{rel}", "stdlib", text)


def _doc_files(root: Path) -> Iterator[Document]:
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.name[:-3] if path.name.endswith(".gz") else path.name
        if _DOC_SKIP.match(name) or Path(name).suffix.lower() not in _DOC_EXT:
            continue
        text = _read_text(path)
        if text and len(text) > 200:
            yield Document(f"docs:{path.relative_to(root).as_posix()}", "docs", text)


def _man_pages(root: Path) -> Iterator[Document]:
    for path in sorted(root.glob("man*/*")):
        if not path.is_file() or path.is_symlink():
            continue
        text = _read_text(path)
        if not text or text.startswith(".so "):
            continue
        plain = strip_roff(text)
        if len(plain) > 200:
            yield Document(f"man:{path.relative_to(root).as_posix()}", "man", plain)


def _prompt_docs() -> Iterator[Document]:
    from specloop.data.prompts import warmup_texts
    for dataset in ("humaneval", "mt-bench", "ifbench"):
        for i, text in enumerate(warmup_texts(dataset)):
            yield Document(f"prompts:{dataset}:{i}", "prompts", text)


SOURCES: dict[str, Callable[[], Iterable[Document]]] = {
    "stdlib": _stdlib_docs,
    "docs": lambda: _doc_files(Path("/usr/share/doc")),
    "man": lambda: _man_pages(Path("/usr/share/man")),
    "prompts": _prompt_docs,
}


def iter_documents(source: str) -> list[Document]:
    """Every document of one source, in sorted (deterministic) order.

    Raises:
        ValueError: unknown source name.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown corpus source {source!r}; choose from {sorted(SOURCES)}")
    return list(SOURCES[source]())


def chat_documents(records: Iterable[dict], tokenizer) -> list[Document]:
    """Chat-formatted documents from cached target responses (``{"id", "prompt",
    "response"}``), rendered with the tokenizer's chat template so the text matches
    what the decoder sees at generation time."""
    docs = []
    for rec in records:
        messages = [{"role": "user", "content": rec["prompt"]},
                    {"role": "assistant", "content": rec["response"]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        docs.append(Document(f"chat:{rec['id']}", "chat", text))
    return docs


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_corpus(tokenizer, total_tokens: int = 1_200_000, *, mix: dict[str, float] | None = None,
                 seed: int = 0, documents: dict[str, list[Document]] | None = None,
                 progress: bool = False) -> Corpus:
    """Select, tokenise and pack a deterministic training + validation corpus.

    Args:
        tokenizer: the target's tokenizer (a ``PreTrainedTokenizerBase``; must have an
            EOS token).
        total_tokens: training-token budget (validation documents are taken on top,
            about 1/VAL_EVERY as many), in tokens; must be >= 1.
        mix: fraction of ``total_tokens`` per source (default `DEFAULT_MIX`); a source
            with fewer tokens than its quota contributes all it has.
        seed: document shuffle seed.
        documents: source -> documents, overriding `SOURCES` (tests).
        progress: show a tqdm bar while tokenising.

    Returns:
        `Corpus` with train/val int32 id streams.

    Raises:
        ValueError: total_tokens < 1, a negative or all-zero mix, no EOS token, or no
            documents at all.
    """
    if total_tokens < 1:
        raise ValueError(f"total_tokens must be >= 1, got {total_tokens}")
    mix = dict(DEFAULT_MIX if mix is None else mix)
    if any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix fractions must be >= 0 with a positive sum, got {mix}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token to separate documents")
    norm = sum(mix.values())
    rng = np.random.default_rng(seed)
    chosen: list[tuple[Document, list[int]]] = []
    from tqdm.auto import tqdm
    for source in sorted(mix):
        docs = documents[source] if documents is not None else iter_documents(source)
        order = rng.permutation(len(docs))
        quota, used = total_tokens * mix[source] / norm, 0
        for j in tqdm(order, desc=f"corpus {source}", disable=not progress, leave=False):
            if used >= quota:
                break
            ids = _encode(tokenizer, docs[j].text)
            chosen.append((docs[j], ids))
            if not docs[j].is_validation:
                used += len(ids) + 1
    if not chosen:
        raise ValueError("the corpus is empty: no documents found in any source")
    corpus = _pack(chosen, eos, rng)
    corpus.requested_tokens = int(total_tokens)
    corpus.mix = normalise_mix(mix)
    return corpus


def _pack(chosen: list[tuple[Document, list[int]]], eos: int, rng: np.random.Generator) -> Corpus:
    """Interleave documents of all sources and join them with EOS."""
    order = rng.permutation(len(chosen))
    train: list[int] = []
    val: list[int] = []
    meta = []
    for j in order:
        doc, ids = chosen[j]
        split = "val" if doc.is_validation else "train"
        (val if split == "val" else train).extend(ids + [eos])
        meta.append({"id": doc.id, "source": doc.source, "tokens": len(ids) + 1, "split": split})
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    return Corpus(np.asarray(train, dtype=np.int32), np.asarray(val, dtype=np.int32), meta, digest)


def save_corpus(corpus: Corpus, folder: str | Path) -> Path:
    """Write ``train_ids.npy``, ``val_ids.npy`` and ``corpus.json`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "train_ids.npy", corpus.train_ids)
    np.save(folder / "val_ids.npy", corpus.val_ids)
    meta = {"fingerprint": corpus.fingerprint, "docs": corpus.docs, "requested_tokens": corpus.requested_tokens,
            "mix": corpus.mix,
            "train_tokens": int(corpus.train_ids.size), "val_tokens": int(corpus.val_ids.size),
            "train_tokens_by_source": corpus.tokens_by_source("train")}
    tmp = folder / "corpus.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
    tmp.replace(folder / "corpus.json")
    return folder


def load_corpus(folder: str | Path) -> Corpus:
    """Read a corpus written by `save_corpus`.

    Raises:
        FileNotFoundError: ``corpus.json`` or an id file is missing.
    """
    folder = Path(folder)
    meta_path = folder / "corpus.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no corpus at {folder} (corpus.json missing)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return Corpus(np.load(folder / "train_ids.npy"), np.load(folder / "val_ids.npy"),
                  meta["docs"], meta["fingerprint"], int(meta.get("requested_tokens", 0)),
                  normalise_mix(meta.get("mix") or DEFAULT_MIX))


def parse_mix(text: str) -> dict[str, float]:
    """Parse a corpus mix ``"stdlib=0.6,docs=0.2,man=0.2"`` (source=weight pairs;
    weights are relative and need not sum to 1), checked by `check_mix`.

    Raises:
        ValueError: a malformed pair, a weight that is not a number, a repeated
            source, or what `check_mix` refuses.
    """
    mix: dict[str, float] = {}
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"corpus mix entry {item!r} is not source=weight (e.g. stdlib=0.6)")
        if name in mix:
            raise ValueError(f"corpus source {name!r} given twice")
        try:
            mix[name] = float(value)
        except ValueError:
            raise ValueError(f"corpus mix weight {value!r} of {name!r} is not a number") from None
    return check_mix(mix)


def check_mix(mix: dict[str, float]) -> dict[str, float]:
    """Return ``mix`` (source -> relative weight) if it is a usable corpus mix.

    Raises:
        ValueError: an unknown source, a negative or non-finite weight, or no
            positive weight.
    """
    for name, weight in mix.items():
        if name not in SOURCES:
            raise ValueError(f"unknown corpus source {name!r}; choose from {sorted(SOURCES)}")
        if not np.isfinite(weight) or weight < 0:
            raise ValueError(f"corpus mix weight of {name!r} must be finite and >= 0, got {weight}")
    if sum(mix.values()) <= 0:
        raise ValueError(f"corpus mix {mix!r} has no positive weight")
    return mix


def normalise_mix(mix: dict[str, float]) -> dict[str, float]:
    """Weights as fractions of their sum, sorted by source, zero weights dropped (a
    zero quota selects no document), so equal mixes compare equal however written."""
    total = float(sum(mix.values()))
    return {k: float(v) / total for k, v in sorted(mix.items()) if v > 0}


def mix_tag(mix: dict[str, float] | None) -> str:
    """A short stable name for a mix: ``""`` for the default mix, else e.g.
    ``"mix-docs20-man20-stdlib60"`` (weights in percent). Used to keep feature
    caches of different mixes apart."""
    if mix is None:
        return ""
    percent = {k: round(100 * v) for k, v in normalise_mix(mix).items()}
    if percent == {k: round(100 * v) for k, v in normalise_mix(DEFAULT_MIX).items()}:
        return ""
    return "mix-" + "-".join(f"{k}{v}" for k, v in percent.items())
