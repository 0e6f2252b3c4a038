"""Up-front checks of the commands' path arguments, before any model loads or any
result is written: each command names its output folders, output files, input folders
and input files, and a bad one is refused in one line (a ValueError, which `main`
reports with exit 2) instead of a traceback after the work.

Output folders may be missing (the commands create them with any missing parents);
an output path that exists as a file, lies under a file, or whose nearest existing
folder is not writable is refused. Input folders and files must exist and be of that
kind.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_output_folder", "check_output_file", "check_input_folder", "check_input_file", "check_paths"]


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def _check_writable_parent(path: Path, flag: str) -> None:
    base = _nearest_existing(path.parent if path.parent != path else path)
    if not base.is_dir():
        raise ValueError(f"{flag} {path}: {base} is a file, so no folder can be made under it")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {base} is not writable")


def check_output_folder(path, flag: str = "--out") -> None:
    """Refuse an output folder that cannot be made or written (None passes).

    Raises:
        ValueError: ``path`` exists and is not a folder, lies under a file, or it (or
            its nearest existing parent when missing) is not writable.
    """
    if path is None:
        return
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{flag} {path} exists and is not a folder; give a folder (it is created when missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path} is not writable")
        return
    _check_writable_parent(path, flag)


def check_output_file(path, flag: str = "--out") -> None:
    """Refuse an output file that cannot be written (None passes).

    Raises:
        ValueError: ``path`` is a folder, lies under a file, or cannot be written.
    """
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {path} is not writable")
        return
    _check_writable_parent(path, flag)


def check_input_folder(path, flag: str) -> None:
    """Refuse a missing input folder (None passes).

    Raises:
        ValueError: ``path`` does not exist or is not a folder.
    """
    _check_input(path, flag, folder=True)


def check_input_file(path, flag: str) -> None:
    """Refuse a missing input file (None passes).

    Raises:
        ValueError: ``path`` does not exist or is not a file.
    """
    _check_input(path, flag, folder=False)


def _check_input(path, flag: str, folder: bool) -> None:
    """The one check behind `check_input_folder` / `check_input_file`."""
    if path is None:
        return
    path, kind, other = Path(path), ("folder", "file")[not folder], ("file", "folder")[not folder]
    if not path.exists():
        raise ValueError(f"{flag} {path}: no such {kind}")
    if not (path.is_dir() if folder else path.is_file()):
        raise ValueError(f"{flag} {path} is a {other}, not a {kind}")


_CHECKS = {"out_folders": check_output_folder, "out_files": check_output_file, "in_folders": check_input_folder,
           "in_files": check_input_file}


def check_paths(args, **groups) -> None:
    """Check the named attributes of parsed ``args``: ``out_folders``, ``out_files``,
    ``in_folders``, ``in_files`` (each a tuple of attribute names; a list value, e.g.
    a repeatable flag, is checked item by item). The flag in a message is
    ``--name-with-dashes``, or the metavar for a positional given as ``name=METAVAR``.

    Raises:
        ValueError: the first bad path (one line). KeyError: an unknown group.
    """
    for group, names in groups.items():
        check = _CHECKS[group]
        for spec in names:
            name, _, metavar = spec.partition("=")
            flag = metavar or "--" + name.replace("_", "-")
            value = getattr(args, name, None)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                check(item, flag)
