"""Answer sets: the target's greedy answers to a list of prompts, as compact token ids.

An answer set is the target's side of an experiment in the smallest form that lets
everything else be rebuilt: per prompt its templated token ids, the target's greedy
continuation, the stop reason, dataset and id. Features and top-m distributions are
not stored (a teacher-forced prefill rebuilds them in one batched pass).

Folder format (``format_version`` 1), e.g. ``data/answers/<name>/``::

    manifest.json   {"format": "specloop.answers", "format_version": 1,
                     "settings": {target, dtype, datasets [..], split, order, prompts,
                                  max_new_tokens, max_prompt_tokens, chat_template,
                                  batch_size, piece_size, torch_threads, prompts_sha256},
                     "target_fingerprint": sha256 of the weights (names, dtypes, shapes, bytes),
                     "tokenizer_sha256": sha256 of the vocabulary and chat template,
                     "eos_ids": [..],
                     "pieces": [{"file", "first_index", "prompts", "answer_positions",
                                 "bytes", "sha256", "seconds"}, ...],
                     "complete": bool}
    piece-NNNN.npz  a deflated zip of .npy members with fixed timestamps (a rerun writes
                    the same bytes), ``piece_size`` prompts each (the last may be shorter):

=================  ============  ===================================================
key                dtype, shape  meaning
=================  ============  ===================================================
prompt_offsets     int64 (P+1,)  prompt j's ids are prompt_tokens[po[j]:po[j+1]]
prompt_tokens      int32 (Np,)   templated (and truncated) prompt ids, concatenated
answer_offsets     int64 (P+1,)  prompt j's answer is answer_tokens[ao[j]:ao[j+1]]
answer_tokens      int32 (Na,)   greedy continuations (EOS included), concatenated
stream_index       int64 (P,)    position of the prompt in the set
dataset            str (P,)      dataset name
prompt_id          str (P,)      the dataset's own id
stop_reason        str (P,)      "eos" or "length"
=================  ============  ===================================================

Integrity: every piece's size and sha256 are in the manifest and are verified when the
set is opened and when a run resumes; a damaged piece is refused with one line naming
the file. A run writes each piece to ``*.tmp``, fsyncs and renames it, then rewrites the
manifest atomically, so a run killed at any point resumes to byte-identical pieces.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specloop._integrity import DamagedFileError, file_sha256, read_json_manifest, verify_listed_file

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "AnswerSettings", "AnswerSet", "open_answer_set", "piece_name",
           "write_piece", "file_sha256", "target_fingerprint", "tokenizer_sha256", "answer_set_info",
           "DamagedPieceError"]

FORMAT_NAME = "specloop.answers"
FORMAT_VERSION = 1


class DamagedPieceError(DamagedFileError):
    """A piece whose size or sha256 differs from the manifest."""


@dataclass(frozen=True)
class AnswerSettings:
    """Everything that decides an answer set's content (stored in ``manifest.json``).

    Attributes:
        target: target name (registry name, HF id or path). dtype: "float32" / "bfloat16".
        datasets: dataset names in domain order. split: "heldout" / "warmup" / "all".
        order: "shift" / "interleave". prompts: prompts in the set.
        max_new_tokens: cap per answer (EOS stops earlier). max_prompt_tokens: prompts
            keep their last this many tokens (None: whole). chat_template: templated.
        batch_size: decode slots (changes bfloat16 rounding, hence recorded).
        piece_size: prompts per piece file. torch_threads: intra-op threads of the run
            (bfloat16 rounding can depend on it). prompts_sha256: hash of the prompt ids.
    """

    target: str
    dtype: str
    datasets: tuple[str, ...]
    split: str
    order: str
    prompts: int
    max_new_tokens: int
    max_prompt_tokens: int | None
    chat_template: bool
    batch_size: int
    piece_size: int
    torch_threads: int
    prompts_sha256: str = ""
    format_version: int = field(default=FORMAT_VERSION)

    def __post_init__(self):
        for name in ("prompts", "max_new_tokens", "batch_size", "piece_size", "torch_threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        object.__setattr__(self, "datasets", tuple(self.datasets))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["datasets"] = list(self.datasets)
        return out


def piece_name(number: int) -> str:
    return f"piece-{int(number):04d}.npz"


def target_fingerprint(model) -> str:
    """sha256 over the model's named parameters and buffers (name, dtype, shape, bytes):
    the same weights in the same dtype give the same fingerprint."""
    import torch
    digest = hashlib.sha256()
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id) and chat template."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    payload = json.dumps({"vocab": vocab, "chat_template": getattr(tokenizer, "chat_template", None)},
                         ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def write_piece(path: Path, items, answers) -> dict:
    """Write one piece (``items``: `StreamItem` s, ``answers``: `GreedyAnswer` s in the
    same order) atomically. Returns {"bytes", "sha256", "answer_positions"}."""
    arrays = {
        "prompt_offsets": np.cumsum([0] + [len(it.ids) for it in items]).astype(np.int64),
        "prompt_tokens": np.asarray([t for it in items for t in it.ids], dtype=np.int32),
        "answer_offsets": np.cumsum([0] + [len(a.tokens) for a in answers]).astype(np.int64),
        "answer_tokens": np.asarray([t for a in answers for t in a.tokens], dtype=np.int32),
        "stream_index": np.asarray([it.index for it in items], dtype=np.int64),
        "dataset": np.asarray([it.dataset for it in items], dtype=str),
        "prompt_id": np.asarray([str(it.prompt_id) for it in items], dtype=str),
        "stop_reason": np.asarray([a.stop_reason for a in answers], dtype=str)}
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            archive.writestr(info, buffer.getvalue())
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path),
            "answer_positions": int(arrays["answer_tokens"].size)}


def write_manifest(folder: Path, manifest: dict) -> None:
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / "manifest.json")


def read_manifest(folder: Path) -> dict:
    """The manifest of an answer set folder.

    Raises:
        FileNotFoundError: no manifest. ValueError: unreadable JSON (naming the file),
            another format, a format version this reader does not know.
    """
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no answer set at {folder} (manifest.json missing)")
    manifest = read_json_manifest(path)
    if manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not an answer set manifest")
    if int(manifest.get("format_version", 0)) != FORMAT_VERSION:
        raise ValueError(f"{path} has format version {manifest.get('format_version')}, this reader knows "
                         f"{FORMAT_VERSION}")
    return manifest


def verify_piece(folder: Path, entry: dict) -> None:
    """Raise `DamagedPieceError` (one line naming the file) when a listed piece is
    missing or its size / sha256 differ from the manifest."""
    verify_listed_file(folder, entry, "delete it (or its manifest entry) and rerun the command that made the set "
                       "to redo it", error=DamagedPieceError)


class AnswerSet:
    """An answer set opened for reading (`open_answer_set`; every piece verified).

    Attributes:
        folder: the folder. manifest: its ``manifest.json``. settings: its settings.
    """

    def __init__(self, folder: Path, manifest: dict):
        self.folder, self.manifest = Path(folder), manifest
        self.settings = manifest["settings"]

    @property
    def num_prompts(self) -> int:
        return sum(int(p["prompts"]) for p in self.manifest["pieces"])

    @property
    def answer_positions(self) -> int:
        return sum(int(p["answer_positions"]) for p in self.manifest["pieces"])

    def records(self):
        """Yield per prompt a dict: ``stream_index``, ``dataset``, ``prompt_id``,
        ``prompt`` int32 (L,), ``answer`` int32 (T,), ``stop_reason``; in set order."""
        for entry in self.manifest["pieces"]:
            with np.load(self.folder / entry["file"], allow_pickle=False) as data:
                po, ao = data["prompt_offsets"], data["answer_offsets"]
                pt, at = data["prompt_tokens"], data["answer_tokens"]
                for j in range(int(entry["prompts"])):
                    yield {"stream_index": int(data["stream_index"][j]), "dataset": str(data["dataset"][j]),
                           "prompt_id": str(data["prompt_id"][j]), "prompt": pt[po[j]:po[j + 1]],
                           "answer": at[ao[j]:ao[j + 1]], "stop_reason": str(data["stop_reason"][j])}


def open_answer_set(folder) -> AnswerSet:
    """Open and verify an answer set (every listed piece's size and sha256).

    Raises:
        FileNotFoundError / ValueError: as `read_manifest`; `DamagedPieceError`.
    """
    manifest = read_manifest(Path(folder))
    for entry in manifest["pieces"]:
        verify_piece(Path(folder), entry)
    return AnswerSet(Path(folder), manifest)


def answer_set_info(folder) -> dict:
    """Summary of an answer set: ``prompts``, ``answer_positions``, ``complete``,
    ``split``, ``target_fingerprint``, plus ``prompt_positions``, ``pieces``, ``bytes``,
    ``dtype``, ``datasets``, ``stop_reasons`` {eos, length}, ``seconds``, ``target``."""
    answers = open_answer_set(folder)
    stops = {"eos": 0, "length": 0}
    prompt_positions = 0
    for record in answers.records():
        stops[record["stop_reason"]] = stops.get(record["stop_reason"], 0) + 1
        prompt_positions += int(record["prompt"].size)
    pieces = answers.manifest["pieces"]
    return {"prompts": answers.num_prompts, "prompts_planned": int(answers.settings["prompts"]),
            "answer_positions": answers.answer_positions, "prompt_positions": prompt_positions,
            "complete": bool(answers.manifest["complete"]), "split": answers.settings["split"],
            "target_fingerprint": answers.manifest["target_fingerprint"], "target": answers.settings["target"],
            "dtype": answers.settings["dtype"], "datasets": list(answers.settings["datasets"]),
            "pieces": len(pieces), "bytes": sum(int(p["bytes"]) for p in pieces),
            "seconds": sum(float(p["seconds"]) for p in pieces), "stop_reasons": stops}
