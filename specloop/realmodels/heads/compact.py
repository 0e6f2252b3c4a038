"""Compact storage of the shipped draft heads: int8 weight matrices with a scale per row group.

The heads that ship in the package (``heads/pretrained/``) are the bulk of the
repository, and a working tree that travels to a device machine must stay small. A
matrix W (float, shape (rows, cols), at least ``min_elements`` entries) is stored as

    q[r, c] = round(W[r, c] / s[r, g(c)]),  s[r, j] = max_{c in group j} |W[r, c]| / 127,
    q in [-127, 127] (int8), g(c) = c // group_size,

under its own name, with ``s`` (float32, shape (rows, cols / group_size)) under
``<name>.row_scale``; loading gives ``W'[r, c] = q[r, c] * s[r, g(c)]`` (float32), whose
error per entry is at most s[r, g(c)] / 2. With one group per row this is the
symmetric per-channel weight quantisation of LLM.int8() (Dettmers et al. 2022) without
its outlier split; smaller groups (GPTQ / AWQ's group-wise scales) bound the error by
the group's own largest entry, at 4 / group_size extra bytes an entry. It is applied applied to draft heads
to draft heads only, whose argmax decides a proposal, never to the target, so losslessness is
untouched (the verifier corrects any draft). Vectors, small matrices and integer
tensors (norm weights, biases, ``d2t``/``t2d``) are kept as they are (float16 or int64).
A file so written carries ``{"specloop_storage": "int8-grouped"}`` in its safetensors
metadata; `expand_tensors` is what `load_draft` runs on it. What it costs in mean
accepted length is measured, not assumed: ``benchmarks/heads_compact_tau.py``.
"""
from __future__ import annotations

import torch

__all__ = ["STORAGE_KEY", "INT8_GROUPED", "compact_tensors", "expand_tensors", "storage_of"]

STORAGE_KEY = "specloop_storage"
INT8_GROUPED = "int8-grouped"
_SCALE = ".row_scale"


def compact_tensors(tensors: dict[str, torch.Tensor], min_elements: int = 65536, group_size: int = 64,
                    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Int8 copies (a scale per row group) of the large float matrices of ``tensors``.

    Args:
        tensors: name -> tensor (any float dtype / integer), on any device.
        min_elements: a 2-D float tensor with at least this many entries is quantised;
            everything else is kept (floating tensors as float16).
        group_size: columns sharing one scale (a matrix whose column count it does not
            divide gets one scale per row); 0 = one scale per row.

    Returns:
        (tensors to save, CPU and contiguous; safetensors metadata).

    Raises:
        ValueError: a name already ends in ``.row_scale``, or a matrix has a non-finite entry.
    """
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if name.endswith(_SCALE):
            raise ValueError(f"tensor name {name!r} ends in {_SCALE!r}, which int8 storage reserves for scales")
        value = value.detach().to("cpu")
        if value.is_floating_point() and value.dim() == 2 and value.numel() >= int(min_elements):
            weight = value.float()
            if not torch.isfinite(weight).all():
                raise ValueError(f"tensor {name!r} has non-finite entries; it cannot be stored as int8")
            rows, cols = weight.shape
            groups = cols // group_size if group_size and cols % group_size == 0 else 1
            blocks = weight.view(rows, groups, cols // groups)
            scale = blocks.abs().amax(dim=2) / 127.0
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))
            q = torch.round(blocks / safe[:, :, None]).clamp_(-127, 127).to(torch.int8)
            out[name] = q.view(rows, cols).contiguous()
            out[name + _SCALE] = scale.contiguous()
        else:
            out[name] = (value.half() if value.is_floating_point() else value).contiguous()
    return out, {STORAGE_KEY: INT8_GROUPED}


def expand_tensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> dict[str, torch.Tensor]:
    """Float32 tensors from a file's tensors and metadata (int8 row-wise or plain).

    Args:
        tensors: as read from the file.
        metadata: the file's safetensors metadata (None or without ``specloop_storage``:
            a plain file, returned with floats as float32).

    Returns:
        name -> tensor, floating tensors float32, scales folded in and dropped.

    Raises:
        ValueError: an unknown storage tag, or an int8 matrix without its scales.
    """
    storage = (metadata or {}).get(STORAGE_KEY)
    if storage not in (None, INT8_GROUPED):
        raise ValueError(f"unknown draft storage {storage!r} (known: {INT8_GROUPED!r})")
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if name.endswith(_SCALE):
            continue
        if storage == INT8_GROUPED and value.dtype == torch.int8:
            scale = tensors.get(name + _SCALE)
            rows, cols = value.shape
            if scale is None or scale.dim() != 2 or scale.shape[0] != rows or cols % scale.shape[1]:
                raise ValueError(f"int8 tensor {name!r} has no row-group scales of shape ({rows}, G) with G dividing {cols}")
            groups = int(scale.shape[1])
            out[name] = (value.float().view(rows, groups, cols // groups) * scale.float()[:, :, None]).view(rows, cols)
        else:
            out[name] = value.float() if value.is_floating_point() else value
    return out


def storage_of(path) -> str:
    """``"int8-grouped"`` or ``"float"``: how a draft safetensors file stores its weights."""
    from safetensors import safe_open
    with safe_open(str(path), "pt") as handle:
        return (handle.metadata() or {}).get(STORAGE_KEY) or "float"
