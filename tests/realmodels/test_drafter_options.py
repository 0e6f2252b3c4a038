"""Typed drafter options (`specloop.realmodels.drafters.options`, the registry's
`make_drafter` / `drafter_options`): an unknown option is refused with the sorted list
of valid ones (several kinds, ``hedge:`` with a misspelt ``hedge_`` option, published
``KIND:PATH`` heads, unregistered model names), a value of the wrong type is refused,
every kind accepts the shared context options, the dataclass defaults are what the
factories use, and valid calls still build the same drafters. Nothing is downloaded:
the head kinds are only checked (before any load) with target None."""
from __future__ import annotations

import dataclasses
import inspect
import re

import numpy as np
import pytest
import torch

from specloop.realmodels.drafters.datastore import DatastoreDrafter, NGramIndex
from specloop.realmodels.drafters.hedge import HedgeDrafter, HedgeOptions
from specloop.realmodels.drafters.ngram import NGramDrafter, NGramOptions
from specloop.realmodels.drafters.options import (CONTEXT_OPTIONS, ContextOptions, OptionInfo, check_options,
                                                  conforms, option_table)
from specloop.realmodels.drafters.small_lm import SmallLMOptions
from specloop.realmodels.drafters.suffix import SuffixDrafter, SuffixOptions, verify_cost_for
from specloop.realmodels.heads.hybrid import HybridDrafter
from specloop.realmodels.heads.published import PublishedOptions
from specloop.realmodels.registry import drafters as registry
from specloop.realmodels.registry.datastore import DatastoreOptions
from specloop.realmodels.registry.drafters import (check_drafter_options, drafter_names, drafter_options,
                                                   make_drafter, register_drafter)
from specloop.realmodels.registry.head_factories import (DistilledSmallLMOptions, HeadOptions, HybridOptions,
                                                         load_eagle_drafter, load_or_train)
from tests.realmodels.decoder_util import as_loaded, one_thread, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

#: A value of every context option, as callers pass them to any drafter name.
CONTEXT_VALUES = {"dtype": "float32", "device": "cpu", "checkpoint": "/nonexistent/draft", "train_if_missing": False,
                  "progress": False, "build_if_missing": False}
HEAD_KINDS = ("eagle", "eagle3", "medusa", "hydra", "hybrid", "small-lm")
OPTION_CLASSES = (NGramOptions, SuffixOptions, HedgeOptions, SmallLMOptions, DatastoreOptions, HeadOptions,
                  HybridOptions, DistilledSmallLMOptions, PublishedOptions)


@pytest.fixture(autouse=True)
def _no_model_loads(monkeypatch):
    """No test here may load (or download) a model: option checks come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")
    monkeypatch.setattr("specloop.realmodels.loading.load_model", refuse)
    monkeypatch.setattr("specloop.realmodels.registry.head_factories.load_or_train", refuse)


@pytest.fixture
def isolated_registry(monkeypatch):
    """The registry's tables copied, so that test registrations do not leak."""
    drafter_names()
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    monkeypatch.setattr(registry, "_OPTIONS", dict(registry._OPTIONS))


def _valid_list(name: str) -> str:
    return ", ".join(sorted(drafter_options(name)))


# -- unknown options ---------------------------------------------------------------------
@pytest.mark.parametrize("name, bad", [("suffix", "max_mach"), ("ngram", "max_ngrams"),
                                       ("ngram-datastore", "indx"), ("eagle", "head"), ("eagle3", "dtyp"),
                                       ("medusa", "max_matches"), ("hydra", "train_cfg"), ("hybrid", "heads"),
                                       ("small-lm", "retokenise"), ("hedge:suffix,ngram", "hedge_seeed"),
                                       ("hedge:suffix,ngram", "max_mach"), ("smollm2-135m", "model")])
def test_unknown_option_is_refused_with_the_sorted_valid_list(name, bad):
    expected = f"drafter {name!r} has no option {bad!r}; valid: {_valid_list(name)}"
    with pytest.raises(ValueError) as err:
        make_drafter(name, None, **{bad: 3})
    assert str(err.value) == expected and "\n" not in str(err.value)
    listed = str(err.value).split("valid: ")[1].split(", ")
    assert listed == sorted(listed) and set(CONTEXT_OPTIONS) <= set(listed)


def test_the_example_message_and_several_unknown_names():
    with pytest.raises(ValueError, match=r"^drafter 'suffix' has no option 'max_mach'; valid: build_if_missing, "
                                         r"checkpoint, corpus, depth, "):
        make_drafter("suffix", None, max_mach=3)
    with pytest.raises(ValueError, match=r"^drafter 'ngram' has no options 'a', 'b'; valid: "):
        make_drafter("ngram", None, b=1, a=2)


def test_hedge_accepts_its_own_options_and_the_union_of_its_sources():
    names = set(drafter_options("hedge:suffix,ngram"))
    own = {f.name for f in dataclasses.fields(HedgeOptions)}
    assert names == own | set(drafter_options("suffix")) | set(drafter_options("ngram"))
    with pytest.raises(ValueError, match="has no option 'hedge_seeed'; valid: .*hedge_seed"):
        make_drafter("hedge:suffix,ngram", None, hedge_seeed=1)
    with pytest.raises(ValueError, match="has no option 'index'"):   # a datastore option, no datastore source
        make_drafter("hedge:suffix@1ms,ngram@1ms", None, index=None)
    check_drafter_options("hedge:suffix,ngram-datastore", {"index": None, "depth": 8, "hedge_seed": 3})


def test_published_head_options_are_checked_before_the_checkpoint_is_read(tmp_path):
    name = f"eagle3:{tmp_path}"                  # an empty folder: loading it would fail otherwise
    assert set(drafter_options(name)) == set(CONTEXT_OPTIONS)
    with pytest.raises(ValueError, match=re.escape(f"drafter {name!r} has no option 'depth'; valid: build_if_missing")):
        make_drafter(name, None, depth=4)
    with pytest.raises(ValueError, match="option 'dtype' must be str | torch.dtype | None, got int 16"):
        make_drafter(name, None, dtype=16)


def test_unregistered_model_names_take_the_small_lm_options_but_model():
    table = drafter_options("smollm2-135m")
    assert set(table) == set(option_table(SmallLMOptions)) - {"model"}
    assert table["dtype"].default == "float32" and table["retokenize"] == OptionInfo(bool | None, None)
    with pytest.raises(ValueError, match="option 'retokenize' must be bool"):
        make_drafter("smollm2-135m", None, retokenize="yes")


def test_an_unknown_name_is_still_refused_first():
    with pytest.raises(ValueError, match="unknown drafter 'no-such-drafter'"):
        make_drafter("no-such-drafter", None, max_mach=3)


# -- wrong types -------------------------------------------------------------------------
@pytest.mark.parametrize("name, option, value, declared", [
    ("suffix", "depth", "8", "int"), ("suffix", "max_match", 4.0, "int"), ("suffix", "use_global", 1, "bool"),
    ("suffix", "verify_cost", 0.5, "Sequence | str | None"), ("ngram", "max_ngram", 2.5, "int"),
    ("ngram-datastore", "max_matches", "3", "int"), ("hedge:suffix,ngram", "hedge_explore", "x", "float"),
    ("hedge:suffix,ngram", "depth", True, "int"),
    ("hedge:suffix,ngram", "hedge_draft_seconds", "1ms", "Sequence | None"),
    ("eagle", "train_if_missing", "no", "bool"), ("hybrid", "head", 3, "str"),
    ("hydra", "train_config", [1], "dict | None"), ("small-lm", "model", 135, "str | None"),
    ("medusa", "checkpoint", 3, "str | PathLike | None")])
def test_a_value_of_the_wrong_type_is_refused_in_one_line(name, option, value, declared):
    with pytest.raises(ValueError) as err:
        make_drafter(name, None, **{option: value})
    message = str(err.value)
    assert message.startswith(f"drafter {name!r} option {option!r} must be {declared}, got {type(value).__name__}")
    assert "\n" not in message


def test_none_means_the_default_and_numbers_widen():
    drafter = make_drafter("suffix", None, depth=None, max_match=None, prior_count=2, min_prob=np.float32(0.05),
                           max_tokens=np.int64(500))
    assert drafter.cache.depth == SuffixOptions.depth and drafter.max_match == SuffixOptions.max_match
    assert drafter.prior_count == 2.0 and drafter.cache.max_tokens == 500
    assert conforms(np.arange(3, dtype=np.float64), option_table(SuffixOptions)["verify_cost"].type)
    assert conforms(torch.tensor([1.0]), option_table(HedgeOptions)["hedge_draft_seconds"].type)
    assert not conforms(True, int) and not conforms(1, bool) and conforms(3, float) and not conforms("ab", list)


# -- the context options -----------------------------------------------------------------
def test_every_kind_accepts_the_context_options(tmp_path):
    assert CONTEXT_OPTIONS == ("dtype", "device", "checkpoint", "train_if_missing", "progress", "build_if_missing")
    names = drafter_names() + ["hedge:suffix,ngram", "hedge:suffix@1ms,ngram-datastore@1ms", f"medusa:{tmp_path}",
                               "smollm2-135m"]
    assert set(HEAD_KINDS) <= set(names)
    for name in names:
        check_drafter_options(name, CONTEXT_VALUES)
        check_drafter_options(name, {k: None for k in CONTEXT_VALUES})
        assert set(CONTEXT_OPTIONS) <= set(drafter_options(name)), name
    for cls in OPTION_CLASSES:
        assert issubclass(cls, ContextOptions) and cls.__dataclass_params__.frozen
        table, context = option_table(cls), option_table(ContextOptions)
        assert all(table[k].type == context[k].type for k in CONTEXT_OPTIONS), cls


def test_the_model_free_kinds_build_with_the_context_options():
    loaded = as_loaded(tiny_llama(12))
    assert isinstance(make_drafter("ngram", loaded, **CONTEXT_VALUES), NGramDrafter)
    assert isinstance(make_drafter("suffix", loaded, **CONTEXT_VALUES), SuffixDrafter)
    assert isinstance(make_drafter("hedge:suffix,ngram", loaded, **CONTEXT_VALUES), HedgeDrafter)
    assert make_drafter("ngram-datastore", loaded, index=None, **CONTEXT_VALUES).index is None
    with pytest.raises(FileNotFoundError):              # build_if_missing=False: nothing is built
        make_drafter("ngram-datastore", as_loaded(tiny_llama(12), name="no-such-target"), **CONTEXT_VALUES)


# -- one home for the defaults -----------------------------------------------------------
def _signature_defaults(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def _own_defaults(cls, rename=lambda k: k) -> dict:
    return {rename(k): info.default for k, info in option_table(cls).items() if k not in CONTEXT_OPTIONS}


def test_the_dataclass_defaults_match_the_drafters_arguments():
    for cls, ctor in ((SuffixOptions, SuffixDrafter), (NGramOptions, NGramDrafter),
                      (DatastoreOptions, DatastoreDrafter), (HybridOptions, HybridDrafter)):
        own, ctor_defaults = _own_defaults(cls), _signature_defaults(ctor)
        for key, default in own.items():
            if key in ctor_defaults:
                assert ctor_defaults[key] == default, (cls.__name__, key)
    hedge = _own_defaults(HedgeOptions, lambda k: k.removeprefix("hedge_"))
    ctor = _signature_defaults(HedgeDrafter)
    assert {k: ctor[k] for k in hedge if k != "verify_cost"} == {k: v for k, v in hedge.items() if k != "verify_cost"}
    assert _signature_defaults(SuffixDrafter)["dtype"] == SuffixOptions.dtype
    for fn in (load_or_train, load_eagle_drafter):
        defaults = _signature_defaults(fn)
        assert defaults["train_if_missing"] is HeadOptions.train_if_missing is True
        assert defaults["progress"] is HeadOptions.progress is True
        assert defaults["train_config"] is HeadOptions.train_config is None


def test_a_suffix_drafter_without_options_has_the_dataclass_defaults():
    drafter, opts = make_drafter("suffix", None), SuffixOptions()
    assert (drafter.cache.depth, drafter.max_match, drafter.cache.max_requests, drafter.cache.max_tokens) == \
        (opts.depth, opts.max_match, opts.max_requests, opts.max_tokens)
    assert (drafter.prior_count, drafter.min_prob, drafter.use_global, drafter.use_local, drafter.prompt_tail) == \
        (opts.prior_count, opts.min_prob, opts.use_global, opts.use_local, opts.prompt_tail)
    assert np.allclose(drafter.verify_cost, SuffixDrafter(verify_cost=verify_cost_for(None, opts.dtype)).verify_cost)
    assert drafter.cache.num_tokens == 0


def test_ngram_hedge_and_datastore_without_options_have_the_dataclass_defaults():
    ngram, opts = make_drafter("ngram", None), NGramOptions()
    assert (ngram.max_ngram, ngram.min_ngram, ngram.max_matches) == (opts.max_ngram, opts.min_ngram, opts.max_matches)
    hedge, h = make_drafter("hedge:suffix,ngram", None), HedgeOptions()
    assert (hedge.mode, hedge.feedback, hedge.explore, hedge.draft_seconds) == \
        (h.hedge_mode, h.hedge_feedback, h.hedge_explore, h.hedge_draft_seconds)
    assert hedge.per == "request" and hedge.loss == "time"          # what None resolves to with shadow feedback
    again = HedgeDrafter([SuffixDrafter(), NGramDrafter()], ["suffix", "ngram"],
                         verify_cost=verify_cost_for(None, h.dtype))
    assert hedge.hedge.state_dict() == again.hedge.state_dict()      # same seed, horizon, choice
    store, d = make_drafter("ngram-datastore", None, index=None), DatastoreOptions()
    assert (store.max_ngram, store.min_ngram, store.context_max_ngram, store.context_min_ngram, store.max_matches,
            store.default_nodes) == (d.max_ngram, d.min_ngram, d.context_max_ngram, d.context_min_ngram,
                                     d.max_matches, d.default_nodes)


# -- valid calls -------------------------------------------------------------------------
def test_valid_calls_still_build_what_they_did():
    drafter = make_drafter("suffix", None, dtype="bfloat16", depth=16, max_match=8, device="cpu")
    assert drafter.cache.depth == 16 and drafter.max_match == 8
    hedge = make_drafter("hedge:suffix,ngram", None, dtype="bfloat16", hedge_mode="merge",
                         hedge_draft_seconds=[0.0, 0.0], hedge_max_nodes=4, depth=24, max_ngram=2, hedge_seed=5)
    assert hedge.mode == "merge" and hedge.sources[0].cache.depth == 24 and hedge.sources[1].max_ngram == 2
    fixed = make_drafter("hedge:suffix@1ms,ngram@1ms", None)
    assert fixed.draft_seconds == [1e-3, 1e-3]
    with pytest.raises(ValueError, match="fixes the drafting seconds"):
        make_drafter("hedge:suffix@1ms,ngram@1ms", None, hedge_draft_seconds=[0.0, 0.0])
    index = NGramIndex.build(np.array([1, 2, 3, 4, 1, 2, 3, 5] * 4, dtype=np.int32))
    store = make_drafter("ngram-datastore", None, index=index, max_ngram=4, dtype="float32")
    assert store.index is index and store.max_ngram == 4
    assert make_drafter("ngram", None, min_ngram=2, max_ngram=2).min_ngram == 2


def test_the_factories_check_their_options_when_called_directly():
    from specloop.realmodels.drafters.hedge import make_hedge_drafter
    from specloop.realmodels.drafters.suffix import make_suffix_drafter
    from specloop.realmodels.registry.heads import make_eagle
    with pytest.raises(ValueError, match="drafter 'suffix' has no option 'max_mach'"):
        make_suffix_drafter(None, max_mach=3)
    with pytest.raises(ValueError, match="has no option 'hedge_seeed'"):
        make_hedge_drafter(None, "hedge:suffix,ngram", make_drafter, hedge_seeed=1)
    with pytest.raises(ValueError, match="drafter 'eagle' has no option 'head'"):
        make_eagle(None, head="eagle3")


# -- registration ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _PlainOptions:                       # a third party's dataclass, not a ContextOptions
    width: int = 2


def test_third_party_registration(isolated_registry):
    seen = {}

    def factory(target, **options):
        seen.clear()
        seen.update(options)
        return NGramDrafter()

    register_drafter("anything-goes", factory)                      # no options: everything passes
    make_drafter("anything-goes", None, whatever=1, dtype="float32")
    assert seen == {"whatever": 1, "dtype": "float32"} and drafter_options("anything-goes") is None
    register_drafter("typed", factory, options=_PlainOptions)
    make_drafter("typed", None, width=3, **CONTEXT_VALUES)          # context options accepted, not passed on
    assert seen == {"width": 3}
    assert set(drafter_options("typed")) == {"width", *CONTEXT_OPTIONS}
    with pytest.raises(ValueError, match="drafter 'typed' has no option 'widht'; valid: build_if_missing, "
                                         "checkpoint, device, dtype, progress, train_if_missing, width"):
        make_drafter("typed", None, widht=3)
    with pytest.raises(ValueError, match="option 'width' must be int, got str"):
        make_drafter("typed", None, width="3")
    with pytest.raises(TypeError, match="dataclass type"):
        register_drafter("bad", factory, options={"width": int})
    check_drafter_options("hedge:anything-goes,ngram", {"whatever": 1})   # an undeclared source takes anything
    with pytest.raises(ValueError, match="has no option 'hedge_whatever'"):
        check_drafter_options("hedge:anything-goes,ngram", {"hedge_whatever": 1})


def test_check_options_names_every_table():
    tables = [option_table(NGramOptions), {"extra": OptionInfo(int, 0)}]
    check_options("x", {"extra": 1, "max_ngram": 2}, tables)
    with pytest.raises(ValueError, match=r"^drafter 'x' has no option 'y'; valid: build_if_missing, .*extra, "):
        check_options("x", {"y": 1}, tables)
