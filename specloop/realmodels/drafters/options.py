"""Typed drafter options: each built-in drafter declares the keyword options of its
registry factory as a frozen dataclass (a subclass of `ContextOptions`), so that a
misspelt option or a value of the wrong type is refused before any model is loaded.

* `ContextOptions` -- the options every drafter accepts, whatever its kind, because
  callers pass them to any name (`CONTEXT_OPTIONS`): ``dtype``, ``device``,
  ``checkpoint``, ``train_if_missing``, ``progress``, ``build_if_missing``. A kind
  that does not use one accepts and ignores it; a kind that uses one may redeclare
  it with its own default (e.g. `SuffixOptions`' ``dtype="float32"``).
* `ContextOptions.from_options` (inherited by every kind's dataclass) -- a factory's
  ``**options`` as its dataclass: unknown names and wrong types refused
  (`check_options`), None read as "the default".
* `option_table` -- name -> `OptionInfo` (type, default) of a dataclass, what
  `specloop.realmodels.registry.drafters.drafter_options` lists.

Types are checked shallowly (`conforms`): ``int`` takes any integral number but not a
bool, ``float`` any real number but not a bool, ``bool`` only a bool, a sequence or
iterable anything iterable but a string, a mapping a mapping, a class an instance.
None is always allowed and means the field's default, except for a field whose
metadata sets `KEEP_NONE` (None is then a value of its own, e.g. the datastore's
``index=None``: no index).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import numbers
import os
import types
import typing
from typing import Any, Callable, ClassVar, Literal, Mapping, NamedTuple, Sequence, Union

import numpy as np
import torch

__all__ = ["ContextOptions", "CONTEXT_OPTIONS", "KEEP_NONE", "OptionInfo", "option_table",
           "check_options", "conforms", "type_name", "field_names"]

#: Field metadata key: None is a value of this field, not "the default".
KEEP_NONE = "keep_none"


class OptionInfo(NamedTuple):
    """One declared option: its type (the resolved annotation, e.g. ``int`` or
    ``str | None``) and its default."""
    type: Any
    default: Any

    def __repr__(self) -> str:
        return f"OptionInfo(type={type_name(self.type)}, default={self.default!r})"


@dataclasses.dataclass(frozen=True)
class ContextOptions:
    """The options every drafter accepts (`CONTEXT_OPTIONS`), passed by callers to any
    drafter name (``specloop generate``, the stream runner, the HF and vLLM
    integrations, the benchmarks). A kind that does not use one ignores it.

    Attributes:
        dtype: the draft's dtype (str such as "float32", or a torch.dtype); None =
            the drafter's own default (float32 where it matters).
        device: the draft's device; None = the target's.
        checkpoint: a trained head's draft folder; None = the draft cache, then the
            package's shipped copy.
        train_if_missing: train a missing head first (default True).
        progress: show training progress bars (default True).
        build_if_missing: build a missing datastore index (default True).
    """
    kind: ClassVar[str] = "drafter"

    dtype: str | torch.dtype | None = None
    device: str | torch.device | None = None
    checkpoint: str | os.PathLike | None = None
    train_if_missing: bool = True
    progress: bool = True
    build_if_missing: bool = True

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, drafter: str | None = None):
        """``options`` (a factory's keyword options) as an instance of this dataclass.

        None values take the field's default (unless the field keeps None, `KEEP_NONE`).

        Args:
            options: option name -> value.
            drafter: the drafter's name for the error messages (default ``cls.kind``).

        Raises:
            ValueError: an option this dataclass does not declare (naming the valid
                ones, sorted) or a value of the wrong type (`check_options`).
        """
        check_options(drafter or cls.kind, options, [option_table(cls)])
        keep = {f.name for f in dataclasses.fields(cls) if f.metadata.get(KEEP_NONE)}
        return cls(**{k: v for k, v in options.items() if v is not None or k in keep})


#: The names of the options every drafter accepts (the fields of `ContextOptions`).
CONTEXT_OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ContextOptions))


def field_names(cls) -> tuple[str, ...]:
    """The field names of dataclass ``cls``."""
    return tuple(f.name for f in dataclasses.fields(cls))


_TABLES: dict[type, dict[str, OptionInfo]] = {}


def option_table(cls) -> dict[str, OptionInfo]:
    """Name -> `OptionInfo` of every field of dataclass ``cls``, in field order
    (annotations resolved with `typing.get_type_hints`; a copy, cached per class).

    Raises:
        TypeError: ``cls`` is not a dataclass type.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"drafter options must be a dataclass type, got {cls!r}")
    if cls not in _TABLES:
        hints = typing.get_type_hints(cls)
        table = {}
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            table[f.name] = OptionInfo(hints.get(f.name, Any), default)
        _TABLES[cls] = table
    return dict(_TABLES[cls])


def check_options(drafter: str, options: Mapping[str, Any], tables: Sequence[Mapping[str, OptionInfo]], *,
                  accept_unknown: Callable[[str], bool] | None = None) -> None:
    """Refuse an option that no table declares, or a value of the wrong type.

    Args:
        drafter: the drafter's name, for the messages.
        options: option name -> value (None always passes the type check).
        tables: the option tables that apply (`option_table`); a name may be in
            several (a ``hedge:`` ensemble's sources), its value must fit each.
        accept_unknown: names outside every table for which this returns True pass
            unchecked (None: none pass).

    Raises:
        ValueError: one line, ``drafter 'suffix' has no option 'max_mach'; valid:
            corpus, depth, ...`` (valid options sorted), or ``drafter 'suffix' option
            'depth' must be int, got str 'x'``.
    """
    known = set().union(*[set(t) for t in tables]) if tables else set()
    unknown = sorted(k for k in options if k not in known and not (accept_unknown and accept_unknown(k)))
    if unknown:
        what = "option " + repr(unknown[0]) if len(unknown) == 1 else "options " + ", ".join(map(repr, unknown))
        raise ValueError(f"drafter {drafter!r} has no {what}; valid: {', '.join(sorted(known)) or '(none)'}")
    for key, value in options.items():
        if value is None:
            continue
        for table in tables:
            if key in table and not conforms(value, table[key].type):
                shown = repr(value)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise ValueError(f"drafter {drafter!r} option {key!r} must be {type_name(table[key].type)}, "
                                 f"got {type(value).__name__} {shown}")


_ITERABLES = (collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection, list, tuple)
_MAPPINGS = (collections.abc.Mapping, dict)


def conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits annotation ``hint`` (shallow; module docstring)."""
    if value is None or hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(conforms(value, arg) for arg in typing.get_args(hint) if arg is not type(None))
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin is not None:
        hint = origin
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if hint in _ITERABLES:
        return isinstance(value, (collections.abc.Iterable, np.ndarray, torch.Tensor)) \
            and not isinstance(value, (str, bytes))
    if hint in _MAPPINGS:
        return isinstance(value, collections.abc.Mapping)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def type_name(hint: Any) -> str:
    """A short name of annotation ``hint``: ``int``, ``str | None``, ``torch.dtype``, ``Sequence``."""
    if hint is type(None):
        return "None"
    if hint is Any:
        return "any"
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(hint))
    if origin is not None:
        hint = origin
    if isinstance(hint, type):
        module = getattr(hint, "__module__", "")
        return f"torch.{hint.__name__}" if module.startswith("torch") else hint.__qualname__
    return str(hint).replace("typing.", "")
