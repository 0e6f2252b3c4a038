"""Shared fixtures of the real-model tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_float32():
    """The embedded SmolLM2-135M-Instruct target in float32 (loaded once per session;
    tests must not modify it). A load failure fails the test: the embedded target is
    a declared dependency, never skipped. ``SPECLOOP_TEST_DEVICE=cuda`` loads it on
    that device instead of the CPU (``benchmarks/gpu_check.sh``)."""
    import os

    from specloop.realmodels.loading import load_model
    try:
        return load_model("smollm2-135m", dtype="float32", device=os.environ.get("SPECLOOP_TEST_DEVICE", "cpu"))
    except (FileNotFoundError, ImportError) as exc:
        pytest.fail(f"SmolLM2-135M could not be loaded: {exc}")
