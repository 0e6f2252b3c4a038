import pytest

from specloop.data.prompts import HELDOUT_EVERY, load_prompts, related_keys, warmup_texts

SIZES = {"humaneval": 164, "mt-bench": 80, "ifbench": 294, "sharegpt": 11139}
RELATED_DROPPED = {"humaneval": 0, "mt-bench": 0, "ifbench": 0, "sharegpt": 1667}


@pytest.mark.parametrize("dataset,total", sorted(SIZES.items()))
def test_splits_partition_the_dataset(dataset, total):
    heldout = load_prompts(dataset, "heldout")
    warmup = load_prompts(dataset, "warmup")
    everything = load_prompts(dataset, "all")
    assert len(everything) == total
    assert len(heldout) == len(range(0, total, HELDOUT_EVERY))
    assert len(heldout) + len(warmup) + RELATED_DROPPED[dataset] == total
    assert not {p.id for p in heldout} & {p.id for p in warmup}
    assert all(p.text and p.turns[0] == p.text for p in everything)
    held_keys = {key for p in heldout for key in related_keys(p)}
    assert all(held_keys.isdisjoint(related_keys(p)) for p in warmup)     # no part of a held-out item


def test_related_keys_catch_other_parts_and_near_copies():
    from specloop.data.prompts import Prompt
    first = Prompt("sharegpt", "AbC12_0", "Write  a Poem\nabout tea", ("x",))
    keys = set(related_keys(first))
    assert "root:AbC12" in keys and "head:write a poem about tea" in keys
    assert keys & set(related_keys(Prompt("sharegpt", "AbC12_4", "something else", ("x",))))
    assert keys & set(related_keys(Prompt("sharegpt", "zz_0", "WRITE a poem about   tea", ("x",))))
    long_tail = "x" * 1500 + " the same question"
    assert set(related_keys(Prompt("ifbench", "1", "A. " + long_tail, ("x",)))) & set(
        related_keys(Prompt("ifbench", "2", "B. " + long_tail, ("x",))))
    assert not keys & set(related_keys(Prompt("sharegpt", "AbC123_0", "another poem", ("x",))))


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


def test_truncated_json_array_keeps_only_complete_elements(tmp_path):
    import json

    from specloop.data.prompts import _sharegpt_rows, recover_json_array
    convs = [{"id": "a", "conversations": [{"from": "human", "value": "hi [there], {x}"}, {"from": "gpt", "value": "yo"}]},
             {"id": "b", "conversations": [{"from": "gpt", "value": "I start"}, {"from": "human", "value": "no"}]},
             {"id": "c", "conversations": [{"from": "human", "value": "   "}]},
             {"id": "d", "conversations": [{"from": "human", "value": "escaped \\\" quote ]"}]},
             {"id": "e", "conversations": [{"from": "human", "value": "cut off here"}]}]
    text = json.dumps(convs, indent=2)
    cut = text[:text.index("cut off") + 3]                     # truncated inside the last string
    elements, complete = recover_json_array(cut)
    assert elements == convs[:4] and not complete
    assert recover_json_array(text) == (convs, True)
    for end in range(1, len(text)):                             # every truncation point: a prefix of the list
        got, _ = recover_json_array(text[:end])
        assert got == convs[:len(got)]
    path = tmp_path / "share.json"
    path.write_text(cut)
    assert _sharegpt_rows(path) == [{"id": "a", "prompt": "hi [there], {x}"},
                                    {"id": "d", "prompt": convs[3]["conversations"][0]["value"]}]
    with pytest.raises(ValueError, match="not a JSON array"):
        recover_json_array('{"id": 1}')


def test_sharegpt_recovers_the_complete_conversations():
    from specloop.data.prompts import dataset_path, recover_json_array
    elements, complete = recover_json_array(dataset_path("sharegpt").read_text(encoding="utf-8"))
    assert not complete and len(elements) == 17671
    prompts = load_prompts("sharegpt", "all")
    assert len({p.id for p in prompts}) == len(prompts)


def test_sharegpt_topics_partition_sharegpt_and_keep_its_split():
    from specloop.data.prompts import SHAREGPT_TOPICS, sharegpt_topic
    for split in ("heldout", "warmup"):
        whole = load_prompts("sharegpt", split)
        parts = {topic: load_prompts(topic, split) for topic in SHAREGPT_TOPICS}
        assert sum(len(v) for v in parts.values()) == len(whole)
        ids = {topic: {p.id for p in v} for topic, v in parts.items()}
        assert set().union(*ids.values()) == {p.id for p in whole}
        for topic, prompts in parts.items():
            assert all(p.dataset == topic and sharegpt_topic(p.text) == topic for p in prompts)
    for topic in SHAREGPT_TOPICS:
        held = {p.id for p in load_prompts(topic, "heldout")}
        warm = {p.id for p in load_prompts(topic, "warmup")}
        assert not held & warm
        assert len(held) >= 300                      # a stream domain of the scale experiment


def test_sharegpt_topic_rule():
    from specloop.data.prompts import sharegpt_topic
    assert sharegpt_topic("How do I sort a list in Python?") == "sharegpt-code"
    assert sharegpt_topic("Write a poem about the sea") == "sharegpt-writing"
    assert sharegpt_topic("What is the capital of France?") == "sharegpt-chat"
    with pytest.raises(ValueError, match="sharegpt-code"):
        load_prompts("sharegpt-cod")
