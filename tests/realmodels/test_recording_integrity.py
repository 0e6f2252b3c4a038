"""A stream recording's integrity (`specloop.realmodels.recording`): each shard's size
and sha256 in the manifest, verified on open and on resume (a damaged shard is named
with the command that rebuilds it, a resume re-records it byte for byte), one manifest
check shared by the reader and the recorder, and the compute dtype checked against
the stored features. Tiny random Llama models built here (no tokenizer)."""
from __future__ import annotations

import json

import pytest
import torch

from specloop.data.streams import StreamItem
from specloop.realmodels.recording import (DamagedShardError, RecordSettings, check_settings, open_recording,
                                           rebuild_command)
from specloop.realmodels.streams.record import record_stream

from .decoder_util import one_thread, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, EOS = 40, 39


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab=VOCAB, layers=3, hidden=16, max_positions=128, init_range=0.6)


def _items(count: int) -> list[StreamItem]:
    gen = torch.Generator().manual_seed(1)
    return [StreamItem(i, "tiny", f"p{i}", "", tuple(torch.randint(0, EOS, (3 + i % 5,), generator=gen).tolist()))
            for i in range(count)]


def _settings(count: int, **over) -> RecordSettings:
    base = dict(target="tiny", dtype="float32", datasets=("tiny",), split="heldout", order="shift", prompts=count,
                max_new_tokens=10, max_prompt_tokens=None, chat_template=False, top_m=4, layers=(1, -1),
                batch_size=2, shard_size=3)
    base.update(over)
    return RecordSettings(**base)


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        data = data[:1000]
    elif how == "flip":                         # same size, one byte of a member changed
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray()
    path.write_bytes(bytes(data))


@pytest.fixture
def recorded(model, tmp_path):
    record_stream(model, _items(8), tmp_path, _settings(8), check_prompts=0)
    return tmp_path


@pytest.mark.parametrize("how", ["truncate", "flip", "empty"])
def test_a_damaged_shard_is_named_with_its_command_and_a_resume_re_records_it(model, recorded, how):
    manifest = json.loads((recorded / "manifest.json").read_text())
    assert all(len(e["sha256"]) == 64 and e["bytes"] > 1000 for e in manifest["shards"])
    shard = recorded / "shard-0001.npz"
    original = shard.read_bytes()
    _damage(shard, how)
    with pytest.raises(DamagedShardError) as err:
        open_recording(recorded)
    text = str(err.value)
    assert "\n" not in text and "shard-0001.npz" in text and "is damaged" in text
    assert rebuild_command(recorded, manifest) in text and "--shard-size 3" in text and "--raw" in text
    result = record_stream(model, _items(8), recorded, _settings(8), check_prompts=0)    # the same command
    assert result["redone"] == [{"file": "shard-0001.npz", "identical": True}]
    assert shard.read_bytes() == original
    drop = lambda shards: [{k: v for k, v in e.items() if k != "seconds"} for e in shards]   # noqa: E731
    assert drop(json.loads((recorded / "manifest.json").read_text())["shards"]) == drop(manifest["shards"])
    assert open_recording(recorded).prompt(4)["tokens"].size > 0


def test_a_deleted_shard_is_named_and_re_recorded(model, recorded):
    (recorded / "shard-0002.npz").unlink()
    with pytest.raises(DamagedShardError, match="shard-0002.npz is listed in the manifest but missing"):
        open_recording(recorded)
    result = record_stream(model, _items(8), recorded, _settings(8), check_prompts=0)
    assert result["redone"] == [{"file": "shard-0002.npz", "identical": True}]


def test_a_recording_without_checksums_opens_and_is_checked_by_size(model, recorded):
    path = recorded / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["shards"]:
        del entry["sha256"]
    path.write_text(json.dumps(manifest))
    assert open_recording(recorded).num_prompts == 8
    shard = recorded / "shard-0000.npz"
    original = shard.read_bytes()
    _damage(shard, "flip")
    open_recording(recorded)                                      # same size: not detectable without a sha256
    _damage(shard, "truncate")
    with pytest.raises(DamagedShardError, match=r"shard-0000.npz is damaged \(1000 bytes"):
        open_recording(recorded)
    result = record_stream(model, _items(8), recorded, _settings(8), check_prompts=0)
    assert result["redone"] == [{"file": "shard-0000.npz", "identical": None}] and shard.read_bytes() == original


def test_reader_and_recorder_agree_on_the_format_version(model, recorded):
    path = recorded / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "format_version": 2}))
    with pytest.raises(ValueError, match="format version 2, this code reads and writes version 1"):
        open_recording(recorded)
    with pytest.raises(ValueError, match="format version 2"):
        record_stream(model, _items(8), recorded, _settings(8), check_prompts=0)
    with pytest.raises(ValueError, match="format version 2"):
        check_settings(recorded, _settings(8))


def test_a_truncated_manifest_is_named(model, recorded):
    path = recorded / "manifest.json"
    path.write_text(path.read_text()[:200])
    for call in (lambda: open_recording(recorded),
                 lambda: record_stream(model, _items(8), recorded, _settings(8), check_prompts=0)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(path) in str(err.value) and "not valid JSON" in str(err.value)


@pytest.mark.parametrize("feature_dtype", ["float16", "float32"])
def test_the_compute_dtype_is_checked_against_the_features(model, tmp_path, feature_dtype):
    cases = {"float32": model, "bfloat16": tiny_llama(vocab=VOCAB, layers=3, hidden=16, max_positions=128,
                                                      init_range=0.6).to(torch.bfloat16)}
    for dtype, target in cases.items():
        folder = tmp_path / dtype
        record_stream(target, _items(8), folder, _settings(8, dtype=dtype, feature_dtype=feature_dtype),
                      check_prompts=0)
        assert open_recording(folder).settings["dtype"] == dtype
        other = "float32" if dtype == "bfloat16" else "bfloat16"
        path = folder / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["settings"]["dtype"] = other                     # an edited claim
        path.write_text(json.dumps(manifest))
        with pytest.raises(ValueError, match=f"says dtype '{other}' but the recorded features were computed in "
                                             f"{dtype}"):
            open_recording(folder)


def test_stream_commands_report_a_damaged_recording_in_one_line(recorded, capsys, tmp_path):
    from specloop.cli import main
    _damage(recorded / "shard-0000.npz", "flip")
    for argv in (["stream", "check-replay", str(recorded), "--out", str(tmp_path / "check")],
                 ["stream", "--replay", str(recorded), "--out", str(tmp_path / "replay")],
                 ["stream", "scale", str(recorded), "--out", str(tmp_path / "scale")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "shard-0000.npz is damaged" in err[0], argv
        assert not (tmp_path / argv[-1].rsplit("/", 1)[-1]).exists()
