"""Drafters by name, for the ``specloop generate --draft D`` option and the benchmark.

``register_drafter(name, factory, options=OptionsDataclass)`` adds a drafter; a factory
is called as ``factory(target, **options) -> Drafter`` where ``target`` is the target's
`specloop.realmodels.loading.LoadedModel` and ``options`` are keyword arguments.

Options are typed: each built-in drafter declares them as a frozen dataclass
(`specloop.realmodels.drafters.options.ContextOptions` and a subclass per kind, below),
and `make_drafter` checks them before any model is loaded: an option the drafter does
not declare raises ValueError naming the drafter and the valid options (sorted), e.g.
``drafter 'suffix' has no option 'max_mach'; valid: build_if_missing, checkpoint,
corpus, depth, ...``; a value of the wrong type (a str where an int is declared ...)
raises a one-line ValueError too; None is always allowed and means the default. Every
drafter accepts the context options `CONTEXT_OPTIONS` (``dtype``, ``device``,
``checkpoint``, ``train_if_missing``, ``progress``, ``build_if_missing``), which
callers pass to any name; a kind that does not use one ignores it. A factory
registered with ``options=None`` (a third party's) gets every option unchecked, as
before: it must accept and ignore the options it does not know.
``drafter_options(name)`` lists a drafter's options: name -> `OptionInfo` (type,
default), sorted by name; `check_drafter_options` checks a set without building.

Built in, with their options dataclasses: ``ngram`` (prompt lookup, `NGramOptions`),
``ngram-datastore`` (REST retrieval from an n-gram index of the target's warm-up
corpus merged with prompt lookup, `drafters.datastore`; the index is built once and
cached, `registry.datastore`, `DatastoreOptions`), ``suffix`` (SuffixDecoding over
earlier outputs and the current request, `drafters.suffix`, `SuffixOptions`),
``hedge:SOURCE,SOURCE,...`` (exponential weights over those sources, `drafters.hedge`;
its own ``hedge_*`` options, `HedgeOptions`, plus the union of its sources' options,
each source given the ones it declares), ``eagle:PATH`` / ``eagle3:PATH`` /
``medusa:PATH`` / ``hydra:PATH`` (a published checkpoint: a local directory or an HF
id in the local HF cache, `specloop.realmodels.heads.published`, `PublishedOptions`)
and ``small-lm`` (a separate small LM; option ``model`` = registry name / HF id /
path, default ``smollm2-135m``, `SmallLMOptions`). Any name that is not registered is
treated as a model name or path for a plain (untrained) small-LM draft,
`drafters.small_lm.make_small_lm_drafter` (`SmallLMOptions` without ``model``), so
``--draft smollm2-135m`` works. The trained heads provide ``eagle``, ``eagle3``,
``medusa``, ``hydra`` (`HeadOptions`), ``hybrid`` (`HybridOptions`) and the distilled
``small-lm`` (`DistilledSmallLMOptions`; `specloop.realmodels.registry.heads`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from specloop.realmodels.drafters.options import (CONTEXT_OPTIONS, ContextOptions, OptionInfo, check_options,
                                                  option_table)

__all__ = ["register_drafter", "make_drafter", "drafter_names", "check_drafter_name", "check_drafter_options",
           "drafter_options", "CONTEXT_OPTIONS", "OptionInfo"]

DrafterFactory = Callable[..., Any]
_FACTORIES: dict[str, DrafterFactory] = {}
_OPTIONS: dict[str, type | None] = {}


def register_drafter(name: str, factory: DrafterFactory, *, options: type | None = None,
                     overwrite: bool = False) -> None:
    """Register ``factory(target, **options) -> Drafter`` under ``name``.

    Args:
        name: the drafter's name (non-empty).
        factory: called as ``factory(target, **options)``.
        options: the options dataclass (a frozen dataclass type, best a subclass of
            `ContextOptions`). `make_drafter` then refuses options it does not declare
            (the `CONTEXT_OPTIONS` are always accepted) and values of the wrong type,
            and passes the factory only the declared ones. None (default): every
            option is passed unchecked; the factory must ignore those it does not know.
        overwrite: replace a drafter of the same name.

    Raises:
        ValueError: empty name, or the name is taken and ``overwrite`` is False.
        TypeError: ``options`` is neither None nor a dataclass type.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("drafter name must be a non-empty string")
    if name in _FACTORIES and not overwrite:
        raise ValueError(f"drafter {name!r} is already registered")
    if options is not None and not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        raise TypeError(f"options of drafter {name!r} must be a dataclass type or None, got {options!r}")
    _FACTORIES[name] = factory
    _OPTIONS[name] = options


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
    HF id in the local cache, GGUF file or directory). The name and the options are
    checked before anything is loaded (`check_drafter_name`, `check_drafter_options`).

    Raises:
        ValueError: an unknown name; an option the drafter does not declare (naming
            the valid ones) or a value of the wrong type; FileNotFoundError /
            ValueError from the factory or model loading.
    """
    check_drafter_options(name, options)
    if name in _FACTORIES:
        cls = _OPTIONS.get(name)
        if cls is not None:                              # the factory gets only what it declares
            own = {f.name for f in dataclasses.fields(cls)}
            options = {k: v for k, v in options.items() if k in own}
        return _FACTORIES[name](target, **options)
    if name.startswith("hedge:"):
        from specloop.realmodels.drafters.hedge import make_hedge_drafter
        return make_hedge_drafter(target, name, _build_source, **options)
    published = _published_form(name)
    if published is not None:
        from specloop.realmodels.heads.published import make_published_drafter
        return make_published_drafter(target, published[0], published[1], **options)
    from specloop.realmodels.drafters.small_lm import make_small_lm_drafter
    return make_small_lm_drafter(target, model=name, **options)


def _build_source(source: str, target: Any, **options: Any):
    """A ``hedge:`` source, given the options it declares (all of them when undeclared)."""
    tables, open_ = _option_tables(source)
    if not open_:
        known = set().union(*tables)
        options = {k: v for k, v in options.items() if k in known}
    return make_drafter(source, target, **options)


def _option_tables(name: str) -> tuple[list[dict[str, OptionInfo]], bool]:
    """The option tables (`option_table`) that apply to drafter ``name``, and whether
    options outside them pass unchecked (a factory registered without options)."""
    _ensure_builtins()
    if name in _FACTORIES:
        cls = _OPTIONS.get(name)
        if cls is None:
            return [], True
        tables = [option_table(cls)]
        if not issubclass(cls, ContextOptions):
            tables.append(option_table(ContextOptions))
        return tables, False
    if name.startswith("hedge:"):
        from specloop.realmodels.drafters.hedge import HedgeOptions, parse_hedge_name
        tables, open_ = [option_table(HedgeOptions)], False
        for source in parse_hedge_name(name):
            more, more_open = _option_tables(source)
            tables += more
            open_ = open_ or more_open
        return tables, open_
    if _published_form(name) is not None:
        from specloop.realmodels.heads.published import PublishedOptions
        return [option_table(PublishedOptions)], False
    from specloop.realmodels.drafters.small_lm import SmallLMOptions
    table = option_table(SmallLMOptions)
    del table["model"]                                   # the name is the model
    return [table], False


def check_drafter_options(name: str, options: dict[str, Any]) -> None:
    """Refuse, before any model is loaded, options that drafter ``name`` does not
    declare or values of the wrong type (module docstring). A ``hedge:`` ensemble
    takes its own ``hedge_*`` options and the union of its sources' (a value must fit
    every source that declares it); with a source registered without options, any
    name but an unknown ``hedge_*`` one passes.

    Raises:
        ValueError: an unknown name (`check_drafter_name`); one line naming the
            drafter and listing its valid options (sorted), or naming the option, the
            declared type and the value given.
    """
    check_drafter_name(name)
    tables, open_ = _option_tables(name)
    if open_ and not name.startswith("hedge:"):
        return
    accept = (lambda key: not key.startswith("hedge_")) if open_ else None
    check_options(name, options, tables, accept_unknown=accept)


def drafter_options(name: str) -> dict[str, OptionInfo] | None:
    """The options drafter ``name`` accepts: option name -> `OptionInfo` (``type``,
    the declared annotation, and ``default``), sorted by name, the context options
    (`CONTEXT_OPTIONS`) included. For ``hedge:SOURCE,...`` the Hedge's and its
    sources' options (a default is the Hedge's own, else the first declaring
    source's). None for a drafter registered without options (it takes anything).

    Raises:
        ValueError: an unknown name (`check_drafter_name`).
    """
    check_drafter_name(name)
    tables, open_ = _option_tables(name)
    if open_ and not tables:
        return None
    merged: dict[str, OptionInfo] = {}
    for table in tables:
        for key, info in table.items():
            merged.setdefault(key, info)
    return dict(sorted(merged.items()))


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
    from specloop.realmodels.registry.datastore import DatastoreOptions, make_datastore_drafter
    from specloop.realmodels.drafters.ngram import NGramOptions, make_ngram_drafter
    from specloop.realmodels.drafters.small_lm import SmallLMOptions, make_small_lm_drafter
    from specloop.realmodels.drafters.suffix import SuffixOptions, make_suffix_drafter

    builtins = {"ngram": (make_ngram_drafter, NGramOptions),
                "ngram-datastore": (make_datastore_drafter, DatastoreOptions),
                "small-lm": (make_small_lm_drafter, SmallLMOptions),
                "suffix": (make_suffix_drafter, SuffixOptions)}
    for name, (factory, options) in builtins.items():
        if name not in _FACTORIES:                       # a drafter registered earlier keeps its name
            _FACTORIES[name], _OPTIONS[name] = factory, options
    try:  # the trained-heads package's drafters, if present (they replace built-ins of the same name)
        from specloop.realmodels.registry.heads import head_drafters
    except ModuleNotFoundError as exc:
        if exc.name not in ("specloop.realmodels.heads", "specloop.realmodels.registry.heads"):
            raise
    else:
        for name, (factory, options) in head_drafters().items():
            _FACTORIES[name], _OPTIONS[name] = factory, options
