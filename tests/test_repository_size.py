"""The working tree stays small enough to travel to a device machine (64 MiB there).

The shipped heads are the bulk of it; they are stored compactly
(`specloop.realmodels.heads.compact`). This sums the sizes of the tracked files so a
new artefact that would break the device check fails here first.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 64 * 2**20


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an installed copy has no working tree to send)")
    return [REPO / name for name in out.decode().split("\0") if name]


def test_tracked_tree_fits_the_device_transfer_limit():
    files = [f for f in _tracked_files() if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    largest = sorted(files, key=lambda f: f.stat().st_size)[-3:]
    assert total < LIMIT_BYTES, (f"tracked files are {total / 2**20:.1f} MiB (limit {LIMIT_BYTES / 2**20:.0f} MiB); "
                                 f"largest: {[str(f.relative_to(REPO)) for f in largest]}")
