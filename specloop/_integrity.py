"""File integrity of the resumable folder formats (answer sets, stream recordings):
each data file's size and sha256 are kept in the folder's manifest when the file is
written, and checked against it on open and on resume (`verify_listed_file`).

numpy- and torch-free (standard library only), so every format module can use it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["DamagedFileError", "file_sha256", "file_entry", "verify_listed_file", "read_json_manifest"]


class DamagedFileError(ValueError):
    """A file listed in a manifest that is missing, or whose size or sha256 differ from
    the manifest's (a ValueError, so the commands report it as bad input, exit 2)."""


def file_sha256(path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path) -> dict:
    """``{"bytes": size, "sha256": hex}`` of a file just written (for its manifest entry)."""
    return {"bytes": Path(path).stat().st_size, "sha256": file_sha256(path)}


def verify_listed_file(folder, entry: dict, redo: str, error=DamagedFileError) -> None:
    """Check a manifest entry (``file``, ``bytes``, optional ``sha256``) against the
    file in ``folder``: present, of that size, and of that sha256 when the entry has
    one (entries written before checksums were kept are checked by size only).

    Args:
        folder: the folder holding the file. entry: its manifest entry.
        redo: how to rebuild the file (ends the message, e.g. "delete it and rerun ...").
        error: the `DamagedFileError` subclass to raise.

    Raises:
        DamagedFileError (``error``): one line naming the file, what is wrong, and ``redo``.
    """
    path = Path(folder) / entry["file"]
    if not path.is_file():
        raise error(f"{path} is listed in the manifest but missing; {redo}")
    size = path.stat().st_size
    if "bytes" in entry and size != int(entry["bytes"]):
        raise error(f"{path} is damaged ({size} bytes, the manifest says {int(entry['bytes'])}); {redo}")
    if entry.get("sha256") and file_sha256(path) != entry["sha256"]:
        raise error(f"{path} is damaged (its sha256 differs from the manifest's); {redo}")


def read_json_manifest(path) -> dict:
    """A manifest's JSON object.

    Raises:
        ValueError: the file is not valid JSON or not an object (one line naming it).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); it is damaged or was cut short") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a manifest (a JSON {type(data).__name__}, not an object)")
    return data
