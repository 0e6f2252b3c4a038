import pytest

from specloop.data.prompts import HELDOUT_EVERY, load_prompts, warmup_texts

SIZES = {"humaneval": 164, "mt-bench": 80, "ifbench": 294}


@pytest.mark.parametrize("dataset,total", sorted(SIZES.items()))
def test_splits_partition_the_dataset(dataset, total):
    heldout = load_prompts(dataset, "heldout")
    warmup = load_prompts(dataset, "warmup")
    everything = load_prompts(dataset, "all")
    assert len(everything) == total
    assert len(heldout) == len(range(0, total, HELDOUT_EVERY))
    assert len(heldout) + len(warmup) == total
    assert not {p.id for p in heldout} & {p.id for p in warmup}
    assert all(p.text and p.turns[0] == p.text for p in everything)


def test_mt_bench_has_two_turns_and_humaneval_references():
    assert all(len(p.turns) == 2 for p in load_prompts("mt-bench", "all"))
    assert all(p.reference for p in load_prompts("humaneval", "all"))


def test_warmup_text_excludes_heldout():
    heldout = load_prompts("humaneval", "heldout")
    texts = warmup_texts("humaneval")
    assert len(texts) == SIZES["humaneval"] - len(heldout)
    joined = "\n".join(texts)
    assert all(p.text not in joined for p in heldout)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown dataset"):
        load_prompts("nope")
    with pytest.raises(ValueError, match="split"):
        load_prompts("humaneval", "train")
    with pytest.raises(ValueError, match="limit"):
        load_prompts("humaneval", limit=-1)
    assert len(load_prompts("humaneval", limit=3)) == 3
