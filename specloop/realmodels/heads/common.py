"""Shared pieces of the trained draft heads: reduced output vocabulary and draft files.

Reduced vocabulary (EAGLE-3 ``d2t``/``t2d``; FR-Spec, Zhao et al. 2025): the draft
predicts over the V_draft most frequent target tokens only, so its LM head costs
V_draft / V_target of the full one. Frequencies come from the warm-up corpus (token
counts plus the target's top-1 predictions, which are what the draft must match).
``d2t[j]`` is the target id of draft index j (ranked by frequency); ``t2d[t]`` is
the draft index of target id t, or -1 outside the subset.

Draft files: ``<root>/drafts/<target>/<kind>/draft.safetensors`` (tensors) +
``draft.json`` (config, training config and results), where root is
``$SPECLOOP_CACHE`` or ``~/.cache/specloop``. A compact copy of a final draft (int8
matrices with row scales, `specloop.realmodels.heads.compact`, or float16) may ship in the package as ``specloop/realmodels/heads/pretrained/<target>-<kind>
.safetensors`` + ``.json``; `load_draft` reads the cache first, then that file.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

__all__ = ["ReducedVocab", "build_reduced_vocab", "draft_dir", "pretrained_path", "save_draft",
           "load_draft", "export_pretrained", "find_draft"]


@dataclass(frozen=True)
class ReducedVocab:
    """A frequency-ranked subset of the target vocabulary.

    Attributes:
        d2t: int64 tensor [V_draft]: target id of each draft index (most frequent first).
        target_vocab_size: V_target.
    """

    d2t: torch.Tensor
    target_vocab_size: int
    _on_device: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d2t = self.d2t
        if d2t.ndim != 1 or d2t.numel() == 0:
            raise ValueError("ReducedVocab.d2t must be a non-empty 1-D tensor")
        if int(d2t.min()) < 0 or int(d2t.max()) >= self.target_vocab_size:
            raise ValueError(f"ReducedVocab.d2t ids must lie in [0, {self.target_vocab_size})")
        if torch.unique(d2t).numel() != d2t.numel():
            raise ValueError("ReducedVocab.d2t has duplicate target ids")

    @property
    def size(self) -> int:
        """V_draft, in tokens."""
        return int(self.d2t.numel())

    @property
    def t2d(self) -> torch.Tensor:
        """int64 [V_target]: draft index of each target id, -1 where not in the subset."""
        out = torch.full((self.target_vocab_size,), -1, dtype=torch.long)
        out[self.d2t.long()] = torch.arange(self.size, dtype=torch.long)
        return out

    def _maps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(d2t, t2d) as int64 on ``device``, built once per device (a drafting step
        on an accelerator then copies nothing from the host)."""
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = (self.d2t.long().to(device), self.t2d.to(device))
        return self._on_device[key]

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft indices (any shape, int) to target ids (same device)."""
        return self._maps(draft_ids.device)[0][draft_ids.long()]

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Map target ids (any shape) to draft indices (-1 outside the subset; same device)."""
        return self._maps(target_ids.device)[1][target_ids.long()]

    def coverage(self, target_ids: np.ndarray | torch.Tensor) -> float:
        """Fraction of ``target_ids`` inside the subset (0..1)."""
        ids = torch.as_tensor(np.asarray(target_ids)).reshape(-1).long()
        if ids.numel() == 0:
            raise ValueError("coverage of an empty id array")
        return float((self.to_draft(ids) >= 0).float().mean())

    def scatter_probs(self, q_reduced: torch.Tensor) -> torch.Tensor:
        """Lift draft-vocabulary rows [..., V_draft] to target-vocabulary rows
        [..., V_target] (zeros outside the subset), for ``q_draft``."""
        out = q_reduced.new_zeros((*q_reduced.shape[:-1], self.target_vocab_size))
        out[..., self._maps(q_reduced.device)[0]] = q_reduced
        return out


def build_reduced_vocab(counts: np.ndarray, size: int, *, always: tuple[int, ...] = ()) -> ReducedVocab:
    """The ``size`` most frequent target ids (ties broken by the smaller id), plus
    ``always`` (e.g. EOS) forced in.

    Args:
        counts: int/float [V_target] frequency of each target id.
        size: V_draft, 1 <= size <= V_target.
        always: target ids that must be in the subset.

    Raises:
        ValueError: size out of range, negative counts, or ``always`` out of range.
    """
    counts = np.asarray(counts, dtype=np.float64).reshape(-1)
    vocab = counts.size
    if not 1 <= size <= vocab:
        raise ValueError(f"reduced vocabulary size must be in [1, {vocab}], got {size}")
    if (counts < 0).any() or not np.isfinite(counts).all():
        raise ValueError("token counts must be finite and >= 0")
    if any(not 0 <= a < vocab for a in always):
        raise ValueError(f"forced ids {always} outside [0, {vocab})")
    score = counts.copy()
    score[list(always)] = np.inf
    order = np.lexsort((np.arange(vocab), -score))[:size]
    return ReducedVocab(torch.as_tensor(order, dtype=torch.long), vocab)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def draft_dir(target: str, kind: str) -> Path:
    """``$SPECLOOP_CACHE/drafts/<target>/<kind>`` or ``~/.cache/specloop/drafts/<target>/<kind>``."""
    root = os.environ.get("SPECLOOP_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "specloop"
    return base / "drafts" / _safe(target) / _safe(kind)


def pretrained_path(target: str, kind: str) -> Path:
    """Shipped draft (int8 row-wise or float16): ``specloop/realmodels/heads/pretrained/<target>-<kind>.safetensors``."""
    return Path(__file__).parent / "pretrained" / f"{_safe(target)}-{_safe(kind)}.safetensors"


def save_draft(tensors: dict[str, torch.Tensor], config: dict, target: str, kind: str,
               folder: str | Path | None = None) -> Path:
    """Write ``draft.safetensors`` + ``draft.json`` atomically.

    Args:
        tensors: name -> tensor (made contiguous, moved to CPU).
        config: JSON-serialisable dict (architecture, reduced vocab size, training
            config, training data size/time, held-out metrics).
        folder: default `draft_dir(target, kind)`.

    Returns:
        The folder.
    """
    from safetensors.torch import save_file
    folder = Path(folder) if folder is not None else draft_dir(target, kind)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(flat, str(folder / "draft.safetensors.tmp"))
    (folder / "draft.json.tmp").write_text(json.dumps({"target": target, "kind": kind, **config}, indent=1),
                                           encoding="utf-8")
    os.replace(folder / "draft.safetensors.tmp", folder / "draft.safetensors")
    os.replace(folder / "draft.json.tmp", folder / "draft.json")
    return folder


def find_draft(target: str, kind: str, folder: str | Path | None = None) -> Path | None:
    """Path of the draft's safetensors: the cache (or ``folder``) first, then the
    shipped pretrained file; None if neither exists."""
    cache = (Path(folder) if folder is not None else draft_dir(target, kind)) / "draft.safetensors"
    if cache.is_file() and cache.with_suffix(".json").is_file():
        return cache
    shipped = pretrained_path(target, kind)
    if folder is None and shipped.is_file() and shipped.with_suffix(".json").is_file():
        return shipped
    return None


def load_draft(target: str, kind: str, folder: str | Path | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a draft written by `save_draft` (or the shipped pretrained copy).

    Returns:
        (tensors as float32 where floating, config dict); a file in int8 row-wise
        storage (`specloop.realmodels.heads.compact`) is expanded to float32.

    Raises:
        FileNotFoundError: no draft saved for (target, kind) — train it with
            ``specloop draft train --target T --kind K`` (with ``--out folder``
            when ``folder`` was given: then the shipped copy is not used).
    """
    from safetensors.torch import load_file
    path = find_draft(target, kind, folder)
    if path is None and folder is not None:      # an explicit folder never falls back to the package's copy
        raise FileNotFoundError(f"no trained {kind!r} draft for target {target!r} in {Path(folder)}; train one "
                                f"with: specloop draft train --kind {kind} --target {target} --out {Path(folder)}")
    if path is None:
        raise FileNotFoundError(f"no trained {kind!r} draft for target {target!r} in "
                                f"{draft_dir(target, kind)} or the package; "
                                f"train one with: specloop draft train --target {target} --kind {kind}")
    from safetensors import safe_open
    from specloop.realmodels.heads.compact import expand_tensors
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    tensors = expand_tensors(load_file(str(path)), metadata)
    config = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    return tensors, config


def export_pretrained(target: str, kind: str, max_bytes: int = 25 * 2**20,
                      folder: str | Path | None = None, storage: str = "int8-grouped") -> Path | None:
    """Copy the cached draft (or the draft saved in ``folder``) to the package's
    ``pretrained/`` folder if it fits in ``max_bytes``; returns the path, or None when
    it is too large.

    Args:
        storage: "int8-grouped" (large matrices as int8 with a float32 scale per row,
            the rest float16: `specloop.realmodels.heads.compact`) or "float16".

    Raises:
        FileNotFoundError: no saved draft there.
        ValueError: an unknown ``storage``."""
    from safetensors.torch import save_file
    from specloop.realmodels.heads.compact import INT8_GROUPED, compact_tensors
    if storage not in (INT8_GROUPED, "float16"):
        raise ValueError(f"storage must be {INT8_GROUPED!r} or 'float16', got {storage!r}")
    tensors, config = load_draft(target, kind, folder if folder is not None else draft_dir(target, kind))
    if storage == INT8_GROUPED:
        packed, metadata = compact_tensors(tensors)
    else:
        packed, metadata = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}, None
    size = sum(v.numel() * v.element_size() for v in packed.values())
    if size > max_bytes:
        return None
    out = pretrained_path(target, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(packed, str(out), metadata=metadata)
    out.with_suffix(".json").write_text(json.dumps({**config, "exported_dtype": storage}, indent=1),
                                        encoding="utf-8")
    return out
