"""Seeding and state-dict helpers shared by policies and learners (private)."""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

__all__ = ["make_rng", "rng_state", "set_rng_state", "check_state_keys"]


def make_rng(seed: int | None) -> np.random.Generator:
    """The object's own generator (PCG64) from ``seed`` (None = fresh entropy)."""
    if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
    return np.random.default_rng(seed)


def rng_state(rng: np.random.Generator) -> dict:
    """A deep copy of the generator's bit-generator state (plain dict)."""
    return copy.deepcopy(rng.bit_generator.state)


def set_rng_state(rng: np.random.Generator, state: dict) -> None:
    """Restore a state produced by `rng_state`."""
    rng.bit_generator.state = copy.deepcopy(state)


def check_state_keys(state: dict, expected: set[str], owner: str) -> None:
    """ValueError naming missing keys or the wrong owner class in a state dict."""
    if not isinstance(state, dict):
        raise ValueError(f"{owner}.load_state_dict needs a dict, got {type(state).__name__}")
    if state.get("class") not in (None, owner):
        raise ValueError(f"state dict belongs to {state.get('class')!r}, not {owner}")
    missing = expected - set(state)
    if missing:
        raise ValueError(f"{owner} state dict lacks keys {sorted(missing)}")


def copy_value(value: Any) -> Any:
    """Deep copy for state dicts (NumPy arrays copied too)."""
    return copy.deepcopy(value)
