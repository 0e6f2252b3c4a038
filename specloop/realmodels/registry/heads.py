"""The trained-head drafters' factories, by name, for the decoder's drafter registry.

Read lazily by `specloop.realmodels.registry.drafters` (`head_drafter_factories`;
this module imports nothing from the registry, so the two form no import circle).
Names: ``eagle``, ``eagle3`` (trained EAGLE / EAGLE-3 heads, trained first if none
is saved; option ``dtype`` = the head's drafting dtype, default float32),
``hybrid`` (prompt lookup, else the EAGLE head; option ``head="eagle3"`` to use
EAGLE-3), ``medusa``, ``hydra`` and ``small-lm`` (the distilled small LM, which
replaces the registry's built-in separate-model entry and delegates to it when a
``model`` option names a model; `specloop.realmodels.registry.head_factories`).
Factories accept and ignore unknown options.
"""
from __future__ import annotations

from specloop.realmodels.registry.head_factories import (make_distilled_small_lm_drafter, make_hydra_drafter,
                                                         make_medusa_drafter)

__all__ = ["make_eagle", "make_eagle3", "make_hybrid", "head_drafter_factories"]


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
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    return load_eagle_drafter(target, "eagle", **_head_options(options))


def make_eagle3(target, **options):
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    return load_eagle_drafter(target, "eagle3", **_head_options(options))


def make_hybrid(target, **options):
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    from specloop.realmodels.heads.hybrid import HybridDrafter
    kind = options.get("head") or "eagle"
    head = load_eagle_drafter(target, kind, **_head_options(options))
    keys = ("min_ngram", "max_ngram", "max_matches")
    return HybridDrafter(head, **{k: int(options[k]) for k in keys if options.get(k) is not None})


def head_drafter_factories() -> dict:
    """Name -> ``factory(target, **options) -> Drafter`` of every trained-head drafter
    (the registry installs them over its built-ins of the same name)."""
    return {"eagle": make_eagle, "eagle3": make_eagle3, "hybrid": make_hybrid, "medusa": make_medusa_drafter,
            "hydra": make_hydra_drafter, "small-lm": make_distilled_small_lm_drafter}
