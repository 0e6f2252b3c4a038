"""Online-adaptation checkpoint files (`OnlineAdapter.state_dict` and the stream's
per-method state): written atomically, read back with ``torch.load``."""
from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["save_checkpoint", "load_checkpoint"]


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` with ``torch.save`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a `save_checkpoint` file.

    Raises:
        FileNotFoundError: no such file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no online checkpoint at {path}")
    return torch.load(path, weights_only=False)
