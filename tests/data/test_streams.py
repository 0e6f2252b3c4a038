"""Prompt streams: domain-shift and interleaved order, held-out only, chat templating."""
import pytest

from specloop.data.prompts import load_prompts
from specloop.data.streams import build_stream, encode_prompt_text, split_counts, stream_prompts


class FakeTokenizer:
    """Character-code tokenizer with an optional chat template (no downloads)."""

    def __init__(self, template: bool):
        self.chat_template = "<user>{content}</user><assistant>" if template else None
        self.calls = []

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize and messages[0]["role"] == "user"
        self.calls.append(messages)
        return f"<u>{messages[0]['content']}</u><a>"

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 97 for c in text]


def test_split_counts():
    assert split_counts(10, 3) == [4, 3, 3]
    assert split_counts(3, 3) == [1, 1, 1]
    assert sum(split_counts(17, 4)) == 17
    with pytest.raises(ValueError):
        split_counts(0, 3)
    with pytest.raises(ValueError):
        split_counts(3, 0)


def test_shift_order_is_dataset_blocks_from_heldout():
    prompts = stream_prompts("humaneval,mt-bench,ifbench", 7, "shift")
    assert [p.dataset for p in prompts] == ["humaneval"] * 3 + ["mt-bench"] * 2 + ["ifbench"] * 2
    heldout = {d: [p.id for p in load_prompts(d, "heldout")] for d in ("humaneval", "mt-bench", "ifbench")}
    assert [p.id for p in prompts[:3]] == heldout["humaneval"][:3]
    assert all(p.id in heldout[p.dataset] for p in prompts)
    warm = {p.id for p in load_prompts("humaneval", "warmup")}
    assert not warm & {p.id for p in prompts if p.dataset == "humaneval"}


def test_interleaved_order_round_robin():
    prompts = stream_prompts(["ifbench", "humaneval"], 5, "interleave")
    assert [p.dataset for p in prompts] == ["ifbench", "humaneval", "ifbench", "humaneval", "ifbench"]
    assert sorted(p.id for p in prompts) == sorted(p.id for p in stream_prompts(["ifbench", "humaneval"], 5))


def test_bad_streams():
    with pytest.raises(ValueError, match="order"):
        stream_prompts("humaneval", 2, "random")
    with pytest.raises(ValueError, match="repeat"):
        stream_prompts("humaneval,humaneval", 2)
    with pytest.raises(ValueError, match="held-out prompts"):
        stream_prompts("mt-bench", 1000)
    with pytest.raises(ValueError, match="unknown dataset"):
        stream_prompts("nope", 2)


def test_chat_template_applied_when_present():
    tok = FakeTokenizer(template=True)
    ids = encode_prompt_text(tok, "hi")
    assert ids == tok.encode("<u>hi</u><a>") and tok.calls
    assert encode_prompt_text(tok, "hi", chat_template=False) == tok.encode("hi")
    assert encode_prompt_text(FakeTokenizer(template=False), "hi") == tok.encode("hi")
    with pytest.raises(ValueError, match="empty"):
        encode_prompt_text(tok, "  ")


def test_build_stream_items_and_truncation():
    tok = FakeTokenizer(template=True)
    items = build_stream("mt-bench,humaneval", 4, tok, max_prompt_tokens=16)
    assert [i.index for i in items] == [0, 1, 2, 3]
    assert [i.dataset for i in items] == ["mt-bench", "mt-bench", "humaneval", "humaneval"]
    for item in items:
        full = encode_prompt_text(tok, item.text)
        assert list(item.ids) == full[-16:]
        assert item.ids[-3:] == tuple(tok.encode("<a>"))  # the generation prompt survives truncation
    with pytest.raises(ValueError):
        build_stream("humaneval", 2, tok, max_prompt_tokens=0)


def test_stream_of_the_warmup_split_is_disjoint_from_the_heldout_stream():
    from specloop.data.streams import stream_prompts
    heldout = stream_prompts("sharegpt,humaneval", 40, split="heldout")
    warmup = stream_prompts("sharegpt,humaneval", 40, split="warmup")
    assert len(warmup) == 40 and [p.dataset for p in warmup] == ["sharegpt"] * 20 + ["humaneval"] * 20
    assert not {(p.dataset, p.id) for p in heldout} & {(p.dataset, p.id) for p in warmup}
    with pytest.raises(ValueError, match="split"):
        stream_prompts("humaneval", 2, split="train")
