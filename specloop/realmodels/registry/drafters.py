"""Drafters by name, for the ``specloop generate --draft D`` option and the benchmark.

``register_drafter(name, factory)`` adds a drafter; a factory is called as
``factory(target, **options) -> Drafter`` where ``target`` is the target's
`specloop.realmodels.loading.LoadedModel` and ``options`` are drafter-specific
keyword arguments (``dtype``, ``device``, ``checkpoint`` ...; a factory must accept
and ignore options it does not know). Built in: ``ngram`` (prompt lookup),
``ngram-datastore`` (REST retrieval from an n-gram index of the target's warm-up
corpus merged with prompt lookup, `drafters.datastore`; the index is built once and
cached, `registry.datastore`), ``suffix`` (SuffixDecoding over earlier outputs and the current request,
`drafters.suffix`), ``hedge:SOURCE,SOURCE,...`` (exponential weights over those sources,
`drafters.hedge`), ``eagle:PATH`` / ``eagle3:PATH`` / ``medusa:PATH`` / ``hydra:PATH`` (a published
checkpoint: a local directory or an HF id in the local HF cache,
`specloop.realmodels.heads.published`) and ``small-lm`` (a separate small LM; option ``model`` = registry name /
HF id / path, default ``smollm2-135m``). Any name that is not registered is treated as a
model name or path for a plain (untrained) small-LM draft,
`drafters.small_lm.make_small_lm_drafter`, so ``--draft smollm2-135m`` works.
The trained heads provide ``eagle``, ``eagle3``, ``medusa``, ``hydra``, ``hybrid`` and
the distilled ``small-lm`` (`specloop.realmodels.registry.heads`).
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["register_drafter", "make_drafter", "drafter_names", "check_drafter_name"]

DrafterFactory = Callable[..., Any]
_FACTORIES: dict[str, DrafterFactory] = {}


def register_drafter(name: str, factory: DrafterFactory, *, overwrite: bool = False) -> None:
    """Register ``factory(target, **options) -> Drafter`` under ``name``.

    Raises:
        ValueError: empty name, or the name is taken and ``overwrite`` is False.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("drafter name must be a non-empty string")
    if name in _FACTORIES and not overwrite:
        raise ValueError(f"drafter {name!r} is already registered")
    _FACTORIES[name] = factory


def drafter_names() -> list[str]:
    """Registered drafter names (built-ins first)."""
    _ensure_builtins()
    return list(_FACTORIES)


def check_drafter_name(name: str) -> None:
    """Refuse, before any model is loaded, a ``name`` that is neither a registered
    drafter nor a draft model `load_model` can find (`loading.model_exists_locally`).

    Raises:
        ValueError: naming the registered drafters and the embedded model names.
    """
    _ensure_builtins()
    if name in _FACTORIES:
        return
    if name.startswith("hedge:"):                   # an ensemble: check every source
        from specloop.realmodels.drafters.hedge import parse_hedge_name
        for source in parse_hedge_name(name):
            check_drafter_name(source)
        return
    published = _published_form(name)
    if published is not None:                       # KIND:PATH, a published checkpoint
        from specloop.realmodels.heads.published import resolve_checkpoint
        try:
            resolve_checkpoint(published[1], published[0])
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
        return
    from specloop.realmodels.loading import model_exists_locally, registry_names
    if not model_exists_locally(name):
        raise ValueError(f"unknown drafter {name!r}: registered drafters are {', '.join(_FACTORIES)}; "
                         f"or give a draft model: {', '.join(registry_names())}, a local path "
                         "or an HF id in the local HF cache")


def make_drafter(name: str, target: Any, **options: Any):
    """Build a drafter by name for ``target`` (a `LoadedModel`).

    An unregistered ``name`` is loaded as a small-LM draft model (registry name,
    HF id in the local cache, GGUF file or directory).

    Raises:
        ValueError: an unknown name (`check_drafter_name`); FileNotFoundError /
            ValueError from the factory or model loading.
    """
    check_drafter_name(name)
    if name in _FACTORIES:
        return _FACTORIES[name](target, **options)
    if name.startswith("hedge:"):
        from specloop.realmodels.drafters.hedge import make_hedge_drafter
        return make_hedge_drafter(target, name, make_drafter, **options)
    published = _published_form(name)
    if published is not None:
        from specloop.realmodels.heads.published import make_published_drafter
        return make_published_drafter(target, published[0], published[1], **options)
    from specloop.realmodels.drafters.small_lm import make_small_lm_drafter
    return make_small_lm_drafter(target, model=name, **options)


PUBLISHED_PREFIXES = ("eagle", "eagle3", "medusa", "hydra")


def _published_form(name: str) -> tuple[str, str] | None:
    """(kind, path) of a ``KIND:PATH`` name (a published EAGLE / EAGLE-3 / Medusa
    checkpoint, `specloop.realmodels.heads.published`), else None."""
    kind, sep, path = name.partition(":")
    return (kind, path) if sep and kind in PUBLISHED_PREFIXES and path else None


_BUILTINS_DONE = False


def _ensure_builtins() -> None:
    global _BUILTINS_DONE
    if _BUILTINS_DONE:
        return
    _BUILTINS_DONE = True
    from specloop.realmodels.registry.datastore import make_datastore_drafter
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.drafters.small_lm import make_small_lm_drafter
    from specloop.realmodels.drafters.suffix import make_suffix_drafter

    def ngram_factory(target, **options):
        keys = ("max_ngram", "min_ngram", "max_matches")
        return NGramDrafter(**{k: v for k, v in options.items() if k in keys and v is not None})

    _FACTORIES.setdefault("ngram", ngram_factory)
    _FACTORIES.setdefault("ngram-datastore", make_datastore_drafter)
    _FACTORIES.setdefault("small-lm", make_small_lm_drafter)
    _FACTORIES.setdefault("suffix", make_suffix_drafter)
    try:  # the trained-heads package's drafters, if present (they replace built-ins of the same name)
        from specloop.realmodels.registry.heads import head_drafter_factories
    except ModuleNotFoundError as exc:
        if exc.name not in ("specloop.realmodels.heads", "specloop.realmodels.registry.heads"):
            raise
    else:
        _FACTORIES.update(head_drafter_factories())
