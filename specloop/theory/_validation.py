"""Input validation shared by every function of `specloop.theory`.

Every check raises ``ValueError`` with a message that names the argument, the
offending value (or its location) and what was expected, so nothing is lost.
"""
from __future__ import annotations

import numpy as np

__all__ = ["validate_distribution", "validate_pair", "validate_unit_interval", "UNIT_TOLERANCE",
           "validate_nonnegative", "validate_num_draft_tokens", "SUM_TOLERANCE"]

#: Largest accepted deviation of a probability vector's sum from 1.
SUM_TOLERANCE = 1e-6


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def validate_distribution(x, name: str = "p_target", axis: int = -1) -> np.ndarray:
    """Check that ``x`` holds probability vectors along ``axis`` and return it as float64.

    Args:
        x: array-like of shape (..., V) (V = vocabulary size along ``axis``), V >= 1.
        name: argument name used in error messages (``p_target``, ``q_draft``...).
        axis: the vocabulary axis (default last).

    Returns:
        ``np.ndarray`` float64 of the same shape (values are not renormalised).

    Raises:
        ValueError: 0-d input or empty vocabulary; NaN or infinite entries; a negative
            entry; a vector whose sum differs from 1 by more than ``SUM_TOLERANCE``
            (1e-6). The message gives the index of the first offending entry/vector.
    """
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array of probabilities: {exc}") from exc
    if arr.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension (the vocabulary), got a scalar")
    if not -arr.ndim <= int(axis) < arr.ndim:
        raise ValueError(f"axis {axis} is out of range for {name} with ndim {arr.ndim}")
    axis = int(axis) % arr.ndim
    if arr.shape[axis] == 0:
        raise ValueError(f"{name} has an empty vocabulary axis (shape {arr.shape})")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = _first_index(bad)
        raise ValueError(f"{name} contains NaN or infinite entries (first at index {idx}: "
                         f"{arr[idx]!r})")
    neg = arr < 0
    if neg.any():
        idx = _first_index(neg)
        raise ValueError(f"{name} has a negative probability {arr[idx]!r} at index {idx}")
    sums = arr.sum(axis=axis)
    off = np.abs(sums - 1.0) > SUM_TOLERANCE
    if np.any(off):
        idx = _first_index(off) if np.ndim(off) else ()
        value = float(sums[idx]) if idx else float(sums)
        raise ValueError(f"{name} must sum to 1 along axis {axis} (tolerance {SUM_TOLERANCE:g}); "
                         f"the vector at batch index {idx} sums to {value!r}")
    return arr


def validate_pair(p_target, q_draft) -> tuple[np.ndarray, np.ndarray]:
    """Validate a target/draft pair of shape (..., V) each and broadcast their batch dims.

    Raises:
        ValueError: either input invalid (see `validate_distribution`); vocabulary
            sizes (last axis) differ; leading batch dimensions cannot broadcast.
    """
    p = validate_distribution(p_target, "p_target")
    q = validate_distribution(q_draft, "q_draft")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"mismatched vocabularies: p_target has V={p.shape[-1]} "
                         f"(shape {p.shape}), q_draft has V={q.shape[-1]} (shape {q.shape})")
    try:
        shape = np.broadcast_shapes(p.shape, q.shape)
    except ValueError as exc:
        raise ValueError(f"shape mismatch: p_target {p.shape} and q_draft {q.shape} "
                         f"do not broadcast") from exc
    return np.broadcast_to(p, shape), np.broadcast_to(q, shape)


#: Round-off accepted (and clipped away) at the ends of [0, 1] for probabilities.
UNIT_TOLERANCE = 1e-12


def validate_unit_interval(x, name: str = "acceptance_rate") -> np.ndarray:
    """Return ``x`` as float64 in [0, 1].

    Values within ``UNIT_TOLERANCE`` (1e-12) outside [0, 1] are round-off from computed
    probabilities and are clipped; anything further out raises.

    Raises:
        ValueError: NaN, or a value outside [-1e-12, 1 + 1e-12].
    """
    arr = np.asarray(x, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    bad = (arr < -UNIT_TOLERANCE) | (arr > 1.0 + UNIT_TOLERANCE)
    if bad.any():
        raise ValueError(f"{name} must lie in [0, 1], got {arr[bad].ravel()[0]!r}")
    return np.clip(arr, 0.0, 1.0)


def validate_nonnegative(x, name: str, allow_inf: bool = False) -> np.ndarray:
    """Return ``x`` as float64, raising ValueError on NaN, negative (or infinite) values."""
    arr = np.asarray(x, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if (arr < 0).any():
        raise ValueError(f"{name} must be >= 0, got {arr[arr < 0].ravel()[0]!r}")
    if not allow_inf and np.isinf(arr).any():
        raise ValueError(f"{name} must be finite, got inf")
    return arr


def validate_num_draft_tokens(k, name: str = "num_draft_tokens") -> np.ndarray:
    """Return k as float64 (real k >= 0 allowed), ValueError on NaN, inf or k < 0."""
    arr = np.asarray(k, dtype=np.float64)
    if np.isnan(arr).any() or np.isinf(arr).any():
        raise ValueError(f"{name} must be finite, got {arr[~np.isfinite(arr)].ravel()[0]!r}")
    if (arr < 0).any():
        raise ValueError(f"{name} must be >= 0, got {arr[arr < 0].ravel()[0]!r}")
    return arr
