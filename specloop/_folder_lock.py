"""One writer per results folder: an advisory ``flock`` on ``<folder>/.lock``.

A resumable run (a stream method's folder, a recording) is written by one process
at a time. Two writers on one folder -- e.g. a `specloop stream scale` grid killed
while its process-pool workers kept running, then restarted -- append the same
rounds twice and save interleaved states. `folder_lock` makes the second writer
fail at once with `FolderInUseError` naming the holder's PID. The lock is the
kernel's (`fcntl.flock`), so it is released when the holder exits or is killed,
and a stale ``.lock`` file left by a dead process does not block anyone; a holder
that exits normally removes the file. On a
platform without ``fcntl`` (Windows) the lock is a no-op.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

try:
    import fcntl
except ImportError:                                 # pragma: no cover - Windows
    fcntl = None

__all__ = ["FolderInUseError", "folder_lock"]


class FolderInUseError(ValueError):
    """Another live process holds the folder's lock (a ValueError, so the commands that
    report bad input per method report this too)."""


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike):
    """Hold ``<folder>/.lock`` exclusively for the ``with`` block (creates the folder).

    Raises:
        FolderInUseError: another process holds it (the message names its PID).
        ValueError: ``folder`` exists as a file or lies under one (one line).
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"{folder} is not a folder (it or a parent exists as a file)") from None
    if fcntl is None:                               # pragma: no cover
        yield
        return
    path = folder / ".lock"
    handle = _acquire(path, folder)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)                # leave the folder as it was, then
        handle.close()                              # release (closing drops the flock)


def _acquire(path: Path, folder: Path):
    """Open and flock ``path``; retry when the file was unlinked by its releasing holder
    between our open and our flock (we would hold a lock nobody else can see)."""
    for _ in range(8):
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise FolderInUseError(f"{folder} is being written by another process (pid {holder}); "
                                   "stop it or wait for it before resuming this folder") from None
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle
        except FileNotFoundError:
            pass
        handle.close()
    raise FolderInUseError(f"{folder}: could not take its lock (another process keeps replacing {path.name})")
