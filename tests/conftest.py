"""Shared pytest set-up: Hypothesis profiles and the shared strategies module.

Profiles: "dev" (default) and "ci" (derandomised, loaded when the environment
variable CI is set). Override with HYPOTHESIS_PROFILE=<name>.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("ci", derandomize=True, max_examples=60, deadline=None,
                          print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _expose_shared_strategies() -> None:
    """Make tests/strategies.py importable as ``tests.strategies`` despite the package.

    ``tests/strategies/`` (the tests of ``specloop.strategies``) shadows the file of the
    same name, so load the file as ``tests._shared_strategies`` and copy its public
    names onto the package.
    """
    path = pathlib.Path(__file__).with_name("strategies.py")
    spec = importlib.util.spec_from_file_location("tests._shared_strategies", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    import tests.strategies as package
    for name, value in vars(module).items():  # every public name, listed in __all__ or not
        if not name.startswith("_"):
            setattr(package, name, value)


_expose_shared_strategies()
