"""The machine and software a report was produced on."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["machine_info", "git_commit"]

_PACKAGES = ("specloop", "numpy", "scipy", "numba", "torch", "transformers", "matplotlib",
             "stable-baselines3", "gymnasium")


def git_commit(repo: str | os.PathLike | None = None) -> str:
    """The git commit of the specloop checkout (with ``-dirty`` if the tree has
    uncommitted changes to tracked files), or ``"unknown"`` outside a git checkout."""
    root = Path(repo) if repo else Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], check=True, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _load_average() -> str:
    """The 1/5/15-minute load averages (timings on a shared machine depend on them)."""
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - platforms without getloadavg
        return "unknown"


def machine_info() -> dict:
    """Platform, Python, CPU count, accelerator, package versions, git commit and
    the UTC time, as a JSON-serialisable dict."""
    info = {
        "utc_time": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15min": _load_average(),
        "git_commit": git_commit(),
    }
    try:
        import torch
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:  # pragma: no cover - torch is a hard dependency
        info["cuda"] = "unknown"
    info["versions"] = {name: _version(name) for name in _PACKAGES}
    return info
