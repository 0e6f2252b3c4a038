"""The machine and software a report was produced on."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["machine_info", "git_commit", "LoadMonitor", "load_summary", "UNDER_LOAD_FACTOR", "cores"]

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


UNDER_LOAD_FACTOR = 1.25
"""A timed part ran *under load* when the mean of its 1-minute load averages exceeds
``UNDER_LOAD_FACTOR`` x the usable cores: the part's own threads account for up to the
core count, anything well above it is another job taking the cores the timings need."""


def cores() -> int:
    """Usable CPU cores of this process (its affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1


class LoadMonitor:
    """Samples the 1-minute load average every ``interval_s`` seconds in a daemon
    thread while a part runs (``with LoadMonitor() as load: ...``), so that a part's
    timings carry the load they were measured under.

    After the block, `summary` is ``{"start", "end", "mean", "max"}`` (1-minute load
    averages; ``mean`` over every sample, the start and end included), ``samples``
    (count), ``cores`` and ``under_load`` (``mean > UNDER_LOAD_FACTOR * cores``); all
    loads None where the platform has no `os.getloadavg`.

    Raises:
        ValueError: ``interval_s`` not positive.
    """

    def __init__(self, interval_s: float = 5.0):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = float(interval_s)
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.summary: dict = {}

    @staticmethod
    def _sample() -> float | None:
        try:
            return float(os.getloadavg()[0])
        except OSError:  # pragma: no cover - platforms without getloadavg
            return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self._sample()
            if value is not None:
                self._samples.append(value)

    def __enter__(self) -> "LoadMonitor":
        start = self._sample()
        self._start = start
        if start is not None:
            self._samples.append(start)
        self._thread = threading.Thread(target=self._run, name="specloop-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        end = self._sample()
        if end is not None:
            self._samples.append(end)
        self.summary = load_summary(self._samples, self._start, end, cores())


def load_summary(samples: list[float], start: float | None, end: float | None, n_cores: int) -> dict:
    """The `LoadMonitor.summary` dict of 1-minute load ``samples`` (see there)."""
    if not samples:
        return {"start": None, "end": None, "mean": None, "max": None, "samples": 0,
                "cores": n_cores, "under_load": False}
    mean = sum(samples) / len(samples)
    return {"start": start, "end": end, "mean": round(mean, 2), "max": round(max(samples), 2),
            "samples": len(samples), "cores": n_cores,
            "under_load": bool(mean > UNDER_LOAD_FACTOR * n_cores)}
