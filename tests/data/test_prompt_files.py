"""A researcher's own prompts (`specloop.data.prompt_files`): JSONL / JSON / CSV /
Parquet files read through ``datasets``, chat ``messages``, ids and domains carried into
streams, the packaged datasets' split, and the one-line refusals of malformed files."""
from __future__ import annotations

import csv
import json

import pytest

from specloop.data.prompts import load_prompts
from specloop.data.streams import build_stream, stream_prompts

pytest.importorskip("datasets")        # a declared dependency; the skip only guards a broken install

ROWS = [{"id": f"q{i}", "prompt": f"question number {i} about topic {i % 3}", "domain": ("alg", "geo")[i % 2]}
        for i in range(8)]


class ChatTokenizer:
    """Character-code tokenizer whose chat template renders every message."""

    chat_template = "t"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write(kind: str, path, rows):
    if kind == "jsonl":
        return _jsonl(path, rows)
    if kind == "json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif kind == "csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import datasets
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet"])
def test_each_format_reads_ids_domains_and_texts(tmp_path, kind):
    path = _write(kind, tmp_path / f"mine.{kind}", ROWS)
    prompts = load_prompts(str(path), "all")
    assert [(p.id, p.dataset, p.text) for p in prompts] == [(r["id"], r["domain"], r["prompt"]) for r in ROWS]
    assert all(p.messages is None and p.turns == (p.text,) for p in prompts)


def test_the_split_is_the_packaged_datasets_and_items_carry_ids_and_domains(tmp_path):
    path = str(_jsonl(tmp_path / "mine.jsonl", ROWS))
    assert [p.id for p in load_prompts(path, "heldout")] == ["q0", "q4"]           # every 4th row held out
    assert [p.id for p in load_prompts(path, "warmup")] == ["q1", "q2", "q3", "q5", "q6", "q7"]
    items = build_stream([path], 6, ChatTokenizer(), split="warmup", chat_template=False)
    assert [(it.prompt_id, it.dataset) for it in items] == [(f"q{i}", ("alg", "geo")[i % 2]) for i in (1, 2, 3, 5, 6, 7)]
    assert items[0].ids == tuple(ord(c) for c in ROWS[1]["prompt"])
    with pytest.raises(ValueError, match="has 2 held-out prompts, the stream needs 3 .*every 4th row"):
        stream_prompts([path], 3)


def test_default_ids_and_domain_are_the_row_number_and_the_file_name(tmp_path):
    path = str(_jsonl(tmp_path / "my-prompts.jsonl", [{"prompt": "a"}, {"prompt": "b"}]))
    assert [(p.id, p.dataset) for p in load_prompts(path, "all")] == [("1", "my-prompts"), ("2", "my-prompts")]


def test_messages_become_one_chat_prompt_without_the_trailing_answer(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4"}]
    path = str(_jsonl(tmp_path / "chats.jsonl", [{"messages": chat, "id": 7}, {"prompt": "plain one"}]))
    prompts = load_prompts(path, "all")
    assert prompts[0].text == "2 + 2?" and prompts[0].turns == ("hi", "2 + 2?") and prompts[0].id == "7"
    assert prompts[0].messages == tuple((m["role"], m["content"]) for m in chat[:4])
    items = build_stream([path], 2, ChatTokenizer(), split="all")
    rendered = "<system>be brief<user>hi<assistant>hello<user>2 + 2?<assistant>"
    assert items[0].ids == tuple(ord(c) for c in rendered)
    assert items[1].ids == tuple(ord(c) for c in "<user>plain one<assistant>")
    raw = build_stream([path], 2, ChatTokenizer(), split="all", chat_template=False)
    assert raw[0].ids == tuple(ord(c) for c in "be brief\n\nhi\n\nhello\n\n2 + 2?")


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "fine"}\n{"text": "no prompt here"}\n', r"bad\.jsonl: row 2 has neither a 'prompt' nor a 'messages'"),
    ('{"prompt": "fine"}\n{"prompt": "cut\n', r"bad\.jsonl: row 2 \(line 2\) is not valid JSON"),
    ('{"prompt": "fine"}\n{"prompt": "   "}\n', r"bad\.jsonl: row 2: empty prompt"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}\n', r"bad\.jsonl: row 1: 'messages' has no non-empty user"),
    ('{"messages": "hi"}\n', r"bad\.jsonl: row 1: 'messages' must be a non-empty list"),
    ("", r"bad\.jsonl: empty"),
])
def test_malformed_jsonl_is_refused_naming_file_and_row(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        load_prompts(str(path), "all")
    assert "\n" not in str(err.value)


def test_malformed_json_csv_and_a_missing_file_are_refused(tmp_path):
    broken = tmp_path / "bad.json"
    broken.write_text('[{"prompt": "a"},\n {"prompt": ]', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON at line 2"):
        load_prompts(str(broken), "all")
    table = _write("csv", tmp_path / "bad.csv", [{"question": "a", "id": "1"}])
    with pytest.raises(ValueError, match=r"bad\.csv: row 1 has neither"):
        load_prompts(str(table), "all")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_prompts(str(tmp_path / "missing.jsonl"), "all")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_prompts("no-such-registered-name", "all")


def test_a_changed_file_is_read_again(tmp_path):
    path = _jsonl(tmp_path / "mine.jsonl", [{"prompt": "first"}])
    assert load_prompts(str(path), "all")[0].text == "first"
    _jsonl(path, [{"prompt": "second, longer"}])
    assert load_prompts(str(path), "all")[0].text == "second, longer"


def test_cli_refuses_a_malformed_file_in_one_line_with_exit_2(tmp_path, capsys):
    from specloop.cli import main
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"text": "x"}])
    for argv in (["answers", "generate", "--datasets", str(bad), "--split", "all", "--prompts", "2",
                  "--out", str(tmp_path / "set")],
                 ["stream", "record", "--datasets", str(bad), "--split", "all", "--prompts", "2",
                  "--out", str(tmp_path / "rec")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "bad.jsonl: row 2 has neither" in err[0]


def test_reason_takes_a_prompt_file_in_place_of_a_task(tmp_path):
    from specloop.cli.reason_cmd import build_stream as reason_stream
    path = str(_jsonl(tmp_path / "mine.jsonl", ROWS))
    items = reason_stream(f"arith,{path}", 4)
    own = [it for it in items if it.task != "arith"]
    assert [(it.task, it.id, it.text) for it in own] == [("alg", "q0", ROWS[0]["prompt"]), ("alg", "q4", ROWS[4]["prompt"])]
    with pytest.raises(ValueError, match="--tasks must list"):
        reason_stream("arith,nonsense", 2)


def test_a_dataset_folder_opens_through_datasets_with_its_split_chosen(tmp_path):
    """The path the local Hugging Face cache takes (`datasets.load_dataset` by name, hub
    offline), on a local dataset folder: its ``train`` split, or the one named."""
    folder = tmp_path / "ds"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", ROWS[:4])
    _jsonl(folder / "test.jsonl", ROWS[4:])
    assert [p.id for p in load_prompts(str(folder), "all")] == ["q0", "q1", "q2", "q3"]
    assert [p.id for p in load_prompts(f"{folder}:test", "all")] == ["q4", "q5", "q6", "q7"]
    with pytest.raises(ValueError, match="not a registered dataset, a prompt file"):
        load_prompts("nobody-here/no-such-dataset", "all")          # not cached: refused, nothing fetched
