"""The trained-head drafters' factories, by name, for the decoder's drafter registry.

Read lazily by `specloop.realmodels.registry.drafters` (`head_drafters`; this module
imports nothing from the registry, so the two form no import circle).
Names: ``eagle``, ``eagle3`` (trained EAGLE / EAGLE-3 heads, trained first if none
is saved; option ``dtype`` = the head's drafting dtype, default float32),
``hybrid`` (prompt lookup, else the EAGLE head; option ``head="eagle3"`` to use
EAGLE-3), ``medusa``, ``hydra`` and ``small-lm`` (the distilled small LM, which
replaces the registry's built-in separate-model entry and delegates to it when a
``model`` option names a model; `specloop.realmodels.registry.head_factories`).
Each name's options are a dataclass (`HeadOptions`, `HybridOptions`,
`DistilledSmallLMOptions`); a factory refuses an option its dataclass does not declare.
"""
from __future__ import annotations

from specloop.realmodels.registry.head_factories import (DistilledSmallLMOptions, HeadOptions, HybridOptions,
                                                         loader_options, make_distilled_small_lm_drafter,
                                                         make_hydra_drafter, make_medusa_drafter)

__all__ = ["make_eagle", "make_eagle3", "make_hybrid", "head_drafter_factories", "head_drafters"]


def _eagle_options(opts: HeadOptions) -> dict:
    """`load_eagle_drafter`'s keyword arguments (`loader_options` and the drafting dtype)."""
    return dict(loader_options(opts), dtype=opts.dtype)


def make_eagle(target, **options):
    """Registry factory ``eagle``: the trained EAGLE head of ``target``.

    Args:
        **options: the fields of `HeadOptions` (``dtype`` = the drafting dtype).

    Raises:
        ValueError: an undeclared option or a wrong type; ValueError /
            FileNotFoundError from `load_eagle_drafter`.
    """
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    return load_eagle_drafter(target, "eagle", **_eagle_options(HeadOptions.from_options(options, drafter="eagle")))


def make_eagle3(target, **options):
    """Registry factory ``eagle3`` (options and errors as `make_eagle`)."""
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    opts = HeadOptions.from_options(options, drafter="eagle3")
    return load_eagle_drafter(target, "eagle3", **_eagle_options(opts))


def make_hybrid(target, **options):
    """Registry factory ``hybrid``: prompt lookup, else the EAGLE (``head="eagle3"``:
    EAGLE-3) head.

    Args:
        **options: the fields of `HybridOptions`.

    Raises:
        ValueError: an undeclared option or a wrong type, bad n-gram sizes
            (`HybridDrafter`); ValueError / FileNotFoundError from `load_eagle_drafter`.
    """
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    from specloop.realmodels.heads.hybrid import HybridDrafter
    opts = HybridOptions.from_options(options)
    head = load_eagle_drafter(target, opts.head or HybridOptions.head, **_eagle_options(opts))
    return HybridDrafter(head, min_ngram=opts.min_ngram, max_ngram=opts.max_ngram, max_matches=opts.max_matches)


def head_drafters() -> dict:
    """Name -> (``factory(target, **options) -> Drafter``, options dataclass) of every
    trained-head drafter (the registry installs them over its built-ins of the same name)."""
    return {"eagle": (make_eagle, HeadOptions), "eagle3": (make_eagle3, HeadOptions),
            "hybrid": (make_hybrid, HybridOptions), "medusa": (make_medusa_drafter, HeadOptions),
            "hydra": (make_hydra_drafter, HeadOptions),
            "small-lm": (make_distilled_small_lm_drafter, DistilledSmallLMOptions)}


def head_drafter_factories() -> dict:
    """Name -> ``factory(target, **options) -> Drafter`` of every trained-head drafter
    (`head_drafters` without the options dataclasses)."""
    return {name: factory for name, (factory, _) in head_drafters().items()}
