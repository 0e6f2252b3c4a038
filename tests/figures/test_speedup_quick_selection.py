"""`benchmarks/decode.py --quick` (the speedup_table part of `reproduce --quick`): only the rows a
reader compares are timed; the full run keeps every method."""
from __future__ import annotations

import argparse

import pytest

from benchmarks.decode import QUICK_METHODS, apply_quick, select_methods

# every method name of a full run with the shipped heads (benchmarks/results/decode_heads*.json)
FULL_RUN = (["hf-greedy", "hf-prompt-lookup-3", "hf-prompt-lookup-10", "specloop-greedy", "specloop-ngram-chain",
             "specloop-ngram-tree", "specloop-ngram-learned", "specloop-datastore-chain",
             "specloop-datastore-tree-v8", "specloop-datastore-tree-v16", "specloop-hybrid-tree"]
            + [f"specloop-{h}-{kind}" for h in ("eagle3", "hydra", "eagle", "medusa", "small-lm")
               for kind in ("chain-k4", "tree")])


def _args(**kw) -> argparse.Namespace:
    base = {"quick": True, "only": "", "heads": "eagle3,hydra,eagle,medusa,small-lm", "datastore": True,
            "prompts": 5, "repeats": 3, "max_new_tokens": 128, "verify_repeats": 5}
    return argparse.Namespace(**{**base, **kw})


def test_quick_times_only_the_compared_rows():
    args = apply_quick(_args())
    assert (args.prompts, args.repeats, args.max_new_tokens) == (2, 1, 48)
    assert args.datastore is False and args.heads == "eagle3,hydra"      # eagle3: the hybrid's head
    chosen = select_methods(dict.fromkeys(FULL_RUN), args.only.split(","), strict=not args.quick_selection)
    assert list(chosen) == ["hf-greedy", "hf-prompt-lookup-3", "hf-prompt-lookup-10", "specloop-greedy",
                            "specloop-ngram-tree", "specloop-ngram-learned", "specloop-hybrid-tree",
                            "specloop-hydra-chain-k4", "specloop-hydra-tree"]


def test_quick_skips_a_head_that_is_not_shipped_but_only_is_strict():
    args = apply_quick(_args())
    without_hydra = [m for m in FULL_RUN if "hydra" not in m]
    chosen = select_methods(dict.fromkeys(without_hydra), args.only.split(","), strict=not args.quick_selection)
    assert "specloop-ngram-tree" in chosen and not any("hydra" in m for m in chosen)
    with pytest.raises(ValueError, match="unknown methods"):
        select_methods(dict.fromkeys(without_hydra), ["specloop-hydra-tree"])


def test_full_run_and_explicit_only_are_unchanged():
    full = apply_quick(_args(quick=False))
    assert full.quick_selection is False and full.datastore is True and full.prompts == 5
    assert list(select_methods(dict.fromkeys(FULL_RUN), [])) == FULL_RUN
    mine = apply_quick(_args(only="specloop-medusa-tree"))
    assert mine.only == "specloop-medusa-tree" and mine.datastore is True and mine.quick_selection is False
    assert set(QUICK_METHODS) >= {"specloop-greedy", "specloop-hybrid-tree"}


def test_head_spec_names_a_trained_folder():
    from benchmarks.decode import head_spec
    assert head_spec("eagle3") == ("eagle3", "eagle3", None)
    assert head_spec("warm=eagle3@/d/eagle3") == ("warm", "eagle3", "/d/eagle3")
    for bad in ("warm=eagle3", "=eagle3@/d", "warm=@/d"):
        with pytest.raises(ValueError, match="LABEL=KIND@FOLDER"):
            head_spec(bad)


def test_ratios_carry_paired_intervals():
    """`_ratios`: the paired ratio is the geometric mean of per-prompt ratios (not the
    ratio of pooled rates), its interval contains it, and a method that is exactly
    twice as fast on every prompt gets 2 with a zero-width interval."""
    import math

    from benchmarks.decode import _ratios
    greedy = [[10.0, 20.0, 40.0]]
    table = {"hf-greedy": {"tokens_per_s": 20.0, "tokens_per_s_per_prompt": greedy},
             "hf-prompt-lookup-3": {"tokens_per_s": 30.0, "tokens_per_s_per_prompt": [[12.0, 33.0, 44.0]]},
             "hf-prompt-lookup-10": {"tokens_per_s": 25.0, "tokens_per_s_per_prompt": [[11.0, 25.0, 41.0]]},
             "specloop-x": {"tokens_per_s": 40.0, "tokens_per_s_per_prompt": [[20.0, 40.0, 80.0]]},
             "specloop-y": {"tokens_per_s": 30.0, "tokens_per_s_per_prompt": [[15.0, 20.0, 60.0]]},
             "verify_cost": {}}
    _ratios({"bfloat16": table})
    x, y = table["specloop-x"], table["specloop-y"]
    assert x["speedup"] == 2.0 and x["vs_hf_prompt_lookup"] == 40.0 / 30.0
    assert x["speedup_paired"]["ratio"] == pytest.approx(2.0) and x["speedup_paired"]["pairs"] == 3
    assert x["speedup_paired"]["ci"] == pytest.approx([2.0, 2.0])
    geo = math.exp((math.log(1.5) + math.log(1.0) + math.log(1.5)) / 3)
    lo, hi = y["speedup_paired"]["ci"]
    assert y["speedup_paired"]["ratio"] == pytest.approx(geo) and lo < geo < hi
    lookup = x["vs_hf_prompt_lookup_paired"]      # against the best lookup row by pooled rate (-3)
    assert lookup["ratio"] == pytest.approx(math.exp((math.log(20 / 12) + math.log(40 / 33) + math.log(80 / 44)) / 3))


def test_ratios_without_per_prompt_rates_give_no_interval():
    from benchmarks.decode import _ratios
    table = {"hf-greedy": {"tokens_per_s": 20.0}, "specloop-x": {"tokens_per_s": 30.0}}
    _ratios({"float32": table})
    assert table["specloop-x"]["speedup"] == 1.5 and table["specloop-x"]["speedup_paired"] is None
    assert table["specloop-x"]["vs_hf_prompt_lookup_paired"] is None
