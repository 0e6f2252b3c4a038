"""Registers the trained-head drafters with the decoder's drafter registry.

Imported lazily by `specloop.realmodels.drafters.registry`. Names: ``eagle``,
``eagle3`` (trained EAGLE / EAGLE-3 heads, trained first if none is saved; option
``dtype`` = the head's drafting dtype, default float32),
``hybrid`` (prompt lookup, else the EAGLE head; option ``head="eagle3"`` to use
EAGLE-3). Factories accept and ignore unknown options. Medusa / Hydra / small-LM
drafters register from their own modules when they provide ``register_drafters()``.
"""
from __future__ import annotations

import importlib

from specloop.realmodels.drafters.registry import register_drafter

__all__ = ["make_eagle", "make_eagle3", "make_hybrid"]


def _head_options(options: dict) -> dict:
    keep = {}
    if options.get("checkpoint"):
        keep["folder"] = options["checkpoint"]
    if "train_if_missing" in options:
        keep["train_if_missing"] = bool(options["train_if_missing"])
    if "progress" in options:
        keep["progress"] = bool(options["progress"])
    if options.get("dtype") is not None:
        keep["dtype"] = options["dtype"]
    return keep


def make_eagle(target, **options):
    from specloop.realmodels.heads.eagle_drafter import load_eagle_drafter
    return load_eagle_drafter(target, "eagle", **_head_options(options))


def make_eagle3(target, **options):
    from specloop.realmodels.heads.eagle_drafter import load_eagle_drafter
    return load_eagle_drafter(target, "eagle3", **_head_options(options))


def make_hybrid(target, **options):
    from specloop.realmodels.heads.eagle_drafter import load_eagle_drafter
    from specloop.realmodels.heads.hybrid import HybridDrafter
    kind = options.get("head") or "eagle"
    head = load_eagle_drafter(target, kind, **_head_options(options))
    keys = ("min_ngram", "max_ngram", "max_matches")
    return HybridDrafter(head, **{k: int(options[k]) for k in keys if options.get(k) is not None})


register_drafter("eagle", make_eagle, overwrite=True)
register_drafter("eagle3", make_eagle3, overwrite=True)
register_drafter("hybrid", make_hybrid, overwrite=True)

for _module in ("medusa", "hydra", "small_lm"):
    try:
        _mod = importlib.import_module(f"specloop.realmodels.heads.{_module}")
    except ImportError:
        continue
    if hasattr(_mod, "register_drafters"):
        _mod.register_drafters()
