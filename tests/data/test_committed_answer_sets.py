"""The answer sets committed under ``data/answers/``: each opens (every piece's size and
sha256 verified), its prompts belong to the split it names, and no held-out prompt (by
dataset item, by conversation, or by its token ids) appears in a training set."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from specloop.data.prompts import SHAREGPT_TOPICS, load_prompts, related_keys
from specloop.realmodels.answers.answer_set import open_answer_set

ROOT = Path(__file__).resolve().parents[2] / "data" / "answers"
SETS = sorted(p.parent for p in ROOT.glob("*/manifest.json"))


def _base(dataset: str) -> str:
    return "sharegpt" if dataset in SHAREGPT_TOPICS else dataset


def _split_index(split: str) -> dict[tuple[str, str], object]:
    """(base dataset, id) -> Prompt over every dataset a committed set draws from."""
    index = {}
    for dataset in {_base(d) for s in SETS for d in open_answer_set(s).manifest["settings"]["datasets"]}:
        for prompt in load_prompts(dataset, split):
            index[(dataset, prompt.id)] = prompt
    return index


def test_the_committed_held_out_stream_is_there():
    assert any(open_answer_set(s).manifest["settings"]["split"] == "heldout" for s in SETS), \
        f"no held-out answer set under {ROOT}"


@pytest.mark.parametrize("folder", SETS, ids=[s.name for s in SETS])
def test_a_committed_set_opens_and_its_prompts_belong_to_its_split(folder):
    answers = open_answer_set(folder)
    split = answers.manifest["settings"]["split"]
    members = _split_index(split)
    for record in answers.records():
        key = (_base(str(record["dataset"])), str(record["prompt_id"]))
        assert key in members, f"{folder.name}: {key} is not in the {split} split"


def test_no_held_out_prompt_is_in_a_training_set():
    held = [s for s in SETS if open_answer_set(s).manifest["settings"]["split"] == "heldout"]
    train = [s for s in SETS if open_answer_set(s).manifest["settings"]["split"] != "heldout"]
    held_index = _split_index("heldout")
    held_keys, held_tokens = set(), set()
    for folder in held:
        for record in open_answer_set(folder).records():
            prompt = held_index[(_base(str(record["dataset"])), str(record["prompt_id"]))]
            held_keys.update(related_keys(prompt))
            held_tokens.add(hashlib.sha256(record["prompt"].tobytes()).hexdigest())
    assert held_keys and held_tokens
    all_index = _split_index("all")
    for folder in train:
        for record in open_answer_set(folder).records():
            prompt = all_index[(_base(str(record["dataset"])), str(record["prompt_id"]))]
            assert held_keys.isdisjoint(related_keys(prompt)), f"{folder.name}: {prompt.id} is a held-out item"
            digest = hashlib.sha256(record["prompt"].tobytes()).hexdigest()
            assert digest not in held_tokens, f"{folder.name}: {prompt.id} has a held-out prompt's token ids"
