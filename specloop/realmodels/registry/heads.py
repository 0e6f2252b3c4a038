"""The trained-head drafters' factories, by name, for the decoder's drafter registry.

Read lazily by `specloop.realmodels.registry.drafters` (`head_drafters`; this module
imports nothing from the registry, so the two form no import circle).
Names: ``eagle``, ``eagle3`` (trained EAGLE / EAGLE-3 heads, trained first if none
is saved; option ``dtype`` = the head's drafting dtype, default float32),
``hybrid`` (prompt lookup or, ``lookup="suffix"``, the suffix tree, else the EAGLE
head; option ``head`` = eagle3, hydra or medusa for another head), ``medusa``,
``hydra`` and ``small-lm`` (the distilled small LM, which replaces the registry's
built-in separate-model entry and delegates to it when a ``model`` option names a
model; `specloop.realmodels.registry.head_factories`).
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
    """Registry factory ``hybrid``: a lookup (prompt lookup, or with ``lookup="suffix"``
    the suffix tree) where it proposes and scores ``min_score``, else the trained head
    ``head`` (EAGLE by default; EAGLE-3, Hydra or Medusa).

    Args:
        **options: the fields of `HybridOptions`.

    Raises:
        ValueError: an undeclared option or a wrong type, an unknown head or lookup,
            bad n-gram sizes or ``min_score`` (`HybridDrafter`); ValueError /
            FileNotFoundError from the head's loader.
    """
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    from specloop.realmodels.heads.hybrid import HybridDrafter
    opts = HybridOptions.from_options(options)
    if opts.lookup not in ("ngram", "suffix"):
        raise ValueError(f"hybrid lookup must be 'ngram' or 'suffix', got {opts.lookup!r}")
    kind = opts.head or HybridOptions.head
    if kind in ("eagle", "eagle3"):
        head = load_eagle_drafter(target, kind, **_eagle_options(opts))
    elif kind in ("hydra", "medusa"):
        own = {name: getattr(opts, name) for name in ("checkpoint", "train_if_missing", "progress", "train_config")}
        head = (make_hydra_drafter if kind == "hydra" else make_medusa_drafter)(target, **own)
    else:
        raise ValueError(f"hybrid head must be one of eagle, eagle3, hydra, medusa; got {kind!r}")
    lookup = None
    if opts.lookup == "suffix":
        from specloop.realmodels.drafters.suffix import make_suffix_drafter
        lookup = make_suffix_drafter(target, dtype=opts.suffix_dtype)
    return HybridDrafter(head, min_ngram=opts.min_ngram, max_ngram=opts.max_ngram, max_matches=opts.max_matches,
                         lookup_drafter=lookup, min_score=opts.min_score)


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
