"""Files and checks shared by the published-checkpoint loaders and exporters
(`specloop.realmodels.heads.published`, ``published_hydra``, ``published_export``):
checkpoint directories (local or in the local HF cache), config / tensor reading,
shape-checked tensor takes, and the full-vocabulary stand-in for a reduced one.
Every check raises a one-line error naming the offending value.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

__all__ = ["resolve_checkpoint", "read_config", "read_tensors", "take", "no_leftovers", "require_equal",
           "target_shapes", "IdentityVocab"]

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def resolve_checkpoint(path: str, kind: str) -> Path:
    """A checkpoint directory: ``path`` itself when it is a local directory, else the
    snapshot of HF repo id ``path`` already in the local HF cache (nothing is
    downloaded: ``snapshot_download(local_files_only=True)``).

    Raises:
        FileNotFoundError: neither a local directory nor a cached HF repo.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(str(path), local_files_only=True))
    except Exception as exc:      # not an id, or not in the cache
        raise FileNotFoundError(f"{kind} checkpoint {path!r} is neither a local directory nor an HF repo in the "
                                f"local HF cache ({type(exc).__name__})") from None


def read_config(folder: Path, kind: str) -> dict:
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"{kind} checkpoint {folder} has no config.json")
    return json.loads(cfg.read_text(encoding="utf-8"))


def read_tensors(folder: Path, kind: str, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    for name in names:
        file = folder / name
        if file.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file
                tensors = load_file(str(file))
            else:
                tensors = torch.load(str(file), map_location="cpu", weights_only=True)
            return {k: v for k, v in tensors.items() if not k.endswith(_IGNORED_SUFFIXES)}
    raise FileNotFoundError(f"{kind} checkpoint {folder} has none of {', '.join(names)}")


def take(tensors: dict[str, torch.Tensor], key: str, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    if key not in tensors:
        raise ValueError(f"{kind} checkpoint lacks {key!r}")
    value = tensors.pop(key)
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{kind} checkpoint's {key} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    return value.float() if value.is_floating_point() else value


def no_leftovers(tensors: dict[str, torch.Tensor], kind: str) -> None:
    if tensors:
        raise ValueError(f"{kind} checkpoint has tensors this format does not define: {', '.join(sorted(tensors))}")


def require_equal(what: str, ckpt, target, kind: str) -> None:
    if ckpt != target:
        raise ValueError(f"{kind} checkpoint {what} {ckpt} does not match the target's {target}")


def target_shapes(model) -> tuple[int, int, int]:
    """(hidden size, vocabulary, layer count) of a transformers causal LM."""
    lm = model.get_output_embeddings().weight
    return int(lm.shape[1]), int(lm.shape[0]), int(model.config.num_hidden_layers)


class IdentityVocab(nn.Module):
    """The full vocabulary seen as a 'reduced' one (draft id = target id), with the
    ``proj`` the head drafters read the heads' dtype and device from."""

    def __init__(self, vocab: int, proj: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("draft_to_target", torch.arange(vocab))
        self.register_buffer("target_to_draft", torch.arange(vocab))
        self.proj = proj

    @property
    def draft_vocab_size(self) -> int:
        return int(self.draft_to_target.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.target_to_draft.numel())

    def to_target_probs(self, q: torch.Tensor) -> torch.Tensor:
        """(..., V) rows are already in the target vocabulary."""
        return q
