"""`specloop.realmodels.streams.record`: recording of a stream's target side (the
answer-set generator's continuations, teacher-forced features; format:
`specloop.realmodels.recording`), on tiny random Llama / GPT-2 models built here (no
tokenizer: items carry token ids)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specloop.data.streams import StreamItem
from specloop.realmodels.recording import RecordSettings, check_settings, head_feature_layers, open_recording
from specloop.realmodels.streams.record import record_stream

from .decoder_util import one_thread, plain_greedy, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, EOS = 40, 39


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab=VOCAB, layers=4, hidden=16, max_positions=128, init_range=0.6)


def _tiny_gpt2():
    """Absolute position embeddings: a wrong position under left padding shows here
    (RoPE models are blind to a constant per-row offset)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=16, n_layer=2, n_head=2, eos_token_id=EOS,
                        bos_token_id=0, initializer_range=0.6)
    return GPT2LMHeadModel(config).eval()


def _items(count: int, seed: int = 1) -> list[StreamItem]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [1 + (7 * i) % 13 for i in range(count)]             # ragged: 1..13 tokens
    return [StreamItem(i, "tiny-a" if i < count // 2 else "tiny-b", f"p{i}", "",
                       tuple(torch.randint(0, EOS, (n,), generator=gen).tolist())) for i, n in enumerate(lengths)]


def _settings(count: int, **over) -> RecordSettings:
    base = dict(target="tiny", dtype="float32", datasets=("tiny-a", "tiny-b"), split="heldout", order="shift",
                prompts=count, max_new_tokens=12, max_prompt_tokens=None, chat_template=False, top_m=6,
                layers=(1, 2, -1), batch_size=3, shard_size=4)
    base.update(over)
    return RecordSettings(**base)


def test_head_feature_layers_union_of_eagle3_and_last():
    from transformers import LlamaConfig
    config = LlamaConfig(num_hidden_layers=30, hidden_size=64, num_attention_heads=4, vocab_size=50)
    assert head_feature_layers(config) == (2, 15, 27, -1)


def test_recorded_continuation_equals_batch1_greedy_ragged(model, tmp_path):
    items = _items(7)
    eos_model = tiny_llama(vocab=VOCAB, layers=4, hidden=16, max_positions=128, init_range=0.6, seed=3)
    stops = []
    for number, target in enumerate((model, eos_model, _tiny_gpt2())):
        record_stream(target, items, tmp_path / str(number), _settings(7, max_new_tokens=20, layers=(2, -1),
                                                                        top_m=5), check_prompts=0)
        rec = open_recording(tmp_path / str(number))
        for item in items:
            got = rec.prompt(item.index)
            expected = plain_greedy(target, list(item.ids), 20, EOS)
            assert got["tokens"][len(item.ids):].tolist() == expected
            assert got["new_tokens"] == len(expected)
            assert got["stop_reason"] == ("eos" if expected[-1] == EOS else "length")
            stops.append(got["stop_reason"])
    assert {"eos", "length"} <= set(stops)                # rows finishing early and rows running on


def test_features_and_topm_equal_a_direct_forward(model, tmp_path):
    items = _items(5)
    record_stream(model, items, tmp_path, _settings(5, max_new_tokens=10), check_prompts=0)
    rec = open_recording(tmp_path)
    for item in items:
        result = rec.prompt(item.index)
        with torch.no_grad():
            out = model(torch.tensor([result["tokens"].tolist()]), output_hidden_states=True)
        n = len(result["tokens"])
        for layer in (1, 2, -1):
            direct = out.hidden_states[layer][0].numpy()
            assert result["hidden"][layer].shape == (n, 16) and result["hidden"][layer].dtype == np.float16
            np.testing.assert_allclose(result["hidden"][layer].astype(np.float32), direct, rtol=2e-3, atol=2e-3)
        probs = torch.softmax(out.logits[0].float(), dim=-1)
        top = torch.topk(probs, 6, dim=-1)
        assert (result["topm_ids"] == top.indices.numpy()).mean() > 0.99       # ties at float16 may swap
        gathered = probs.gather(1, torch.from_numpy(result["topm_ids"]).long()).numpy()
        np.testing.assert_allclose(result["topm_probs"].astype(np.float32), gathered, rtol=2e-3, atol=1e-4)
        # a continuation token is the argmax after the previous position
        length = n - result["new_tokens"]
        assert (result["tokens"][length:] == result["topm_ids"][length - 1:-1, 0]).all()


def test_direct_recording_equals_the_rebuild_of_its_answers(model, tmp_path):
    """One generator: the shards `record_stream` writes are the teacher-forced rebuild's
    of the same continuations, byte for byte (same settings)."""
    import dataclasses

    from specloop.realmodels.answers.rebuild import write_shards
    items = _items(9)
    settings = _settings(9)
    record_stream(model, items, tmp_path / "direct", settings, check_prompts=0)
    rec = open_recording(tmp_path / "direct")
    records = []
    for item in items:
        got = rec.prompt(item.index)
        records.append({"prompt": list(item.ids), "answer": got["tokens"][got["prompt_length"]:].tolist(),
                        "stop_reason": got["stop_reason"], "dataset": item.dataset, "prompt_id": item.prompt_id})
    (tmp_path / "again").mkdir()
    full = dataclasses.replace(settings, prompts_sha256=rec.settings["prompts_sha256"])
    write_shards(model, tmp_path / "again", full, {EOS}, lambda first, n: records[first:first + n])
    for name in ("shard-0000.npz", "shard-0001.npz", "shard-0002.npz"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes()


def test_recording_round_trip_and_batch1_check(model, tmp_path):
    items = _items(9)
    manifest = record_stream(model, items, tmp_path, _settings(9), check_prompts=3)
    assert manifest["complete"] and len(manifest["shards"]) == 3
    assert manifest["check"]["matching"] == 3 and manifest["check"]["divergent"] == []
    rec = open_recording(tmp_path)
    for item in items:
        got = rec.prompt(item.index)
        assert got["tokens"][:got["prompt_length"]].tolist() == list(item.ids)
        assert got["tokens"][got["prompt_length"]:].tolist() == plain_greedy(model, list(item.ids), 12, EOS)
        assert got["dataset"] == item.dataset and got["prompt_id"] == item.prompt_id
        assert set(got["hidden"]) == {1, 2, -1} and got["topm_probs"].shape == (len(got["tokens"]), 6)
    assert manifest["total_bytes"] == sum(p.stat().st_size for p in tmp_path.iterdir())


def test_killed_recording_resumes_to_identical_files(model, tmp_path):
    items, settings = _items(10), _settings(10)
    whole = tmp_path / "whole"
    record_stream(model, items, whole, settings, check_prompts=0)

    class Killed(Exception):
        pass

    def kill_mid_second_shard(done, total):
        if done >= 6:                           # shard 1 holds prompts 4..7: killed after its first batch
            raise Killed

    part = tmp_path / "part"
    with pytest.raises(Killed):
        record_stream(model, items, part, settings, check_prompts=0, progress=kill_mid_second_shard)
    assert sorted(p.name for p in part.glob("shard-*.npz")) == ["shard-0000.npz"]
    (part / "shard-0001.npz.tmp").write_bytes(b"half a shard")          # a write cut short
    calls = []
    record_stream(model, items, part, settings, check_prompts=0, progress=lambda *a: calls.append(a))
    assert calls[0] == (4, 10) and calls[-1] == (10, 10)      # a resumed bar starts at the recorded prompts
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    names = sorted(p.name for p in whole.glob("shard-*.npz"))
    assert names == ["shard-0000.npz", "shard-0001.npz", "shard-0002.npz"]
    for name in names:
        assert (part / name).read_bytes() == (whole / name).read_bytes()
    assert [s["file"] for s in json.loads((part / "manifest.json").read_text())["shards"]] == names


def test_mismatched_settings_are_refused(model, tmp_path):
    items = _items(4)
    record_stream(model, items, tmp_path, _settings(4), check_prompts=0)
    before = (tmp_path / "shard-0000.npz").read_bytes()
    for change in ({"top_m": 8}, {"max_new_tokens": 13}, {"layers": (2, -1)}, {"dtype": "bfloat16"}):
        with pytest.raises(ValueError, match="other settings"):
            record_stream(model, items, tmp_path, _settings(4, **change), check_prompts=0)
    with pytest.raises(ValueError, match="other settings"):                 # other prompts, same count
        record_stream(model, _items(4, seed=2), tmp_path, _settings(4), check_prompts=0)
    with pytest.raises(ValueError, match="max_new_tokens: recorded 12, asked 20"):
        check_settings(tmp_path, {"max_new_tokens": 20}, keys=("max_new_tokens",))
    assert (tmp_path / "shard-0000.npz").read_bytes() == before


def test_cli_refuses_other_settings_with_exit_2(tmp_path, capsys):
    from specloop.cli import main
    from specloop.cli.stream_record_cmd import _flag_settings
    from specloop.cli import build_parser
    args = build_parser().parse_args(["stream", "record", "--out", str(tmp_path), "--prompts", "3"])
    flags = _flag_settings(args)
    manifest = {"format": "specloop.stream_record", "settings": {**flags, "max_new_tokens": 64}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert main(["stream", "record", "--out", str(tmp_path), "--prompts", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_new_tokens: recorded 64, asked 128" in err[0]


def test_stream_flags_unchanged_by_the_record_action():
    from specloop.cli import build_parser
    from specloop.cli.stream_cmd import run
    args = build_parser().parse_args(["stream", "--method", "hydra", "--prompts", "3", "--json", "--out", "x"])
    assert args.func is run and args.method == "hydra" and args.prompts == 3 and args.json and args.out == "x"


@pytest.mark.slow
def test_cli_records_smollm2_and_resumes(tmp_path, smollm2_float32, capsys):
    from specloop.cli import main
    argv = ["stream", "record", "--datasets", "humaneval,sharegpt", "--prompts", "2", "--max-new-tokens", "6",
            "--batch-size", "2", "--check-prompts", "2", "--json", "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["settings"]["layers"] == [2, 15, 27, -1] and result["settings"]["top_m"] == 32
    assert result["check"] == {"stream_indices": [0, 1], "matching": 2, "divergent": []}
    assert result["total_bytes"] == sum(p.stat().st_size for p in tmp_path.iterdir()) and result["tokens_per_s"] > 0
    shard = (tmp_path / "shard-0000.npz").read_bytes()
    rec = open_recording(tmp_path).prompt(1)
    assert rec["dataset"] == "sharegpt" and rec["new_tokens"] == 6
    with torch.no_grad():
        out = smollm2_float32.model(torch.tensor([rec["tokens"].tolist()], dtype=torch.long),
                                    output_hidden_states=True)
    for layer in (2, 15, 27, -1):
        np.testing.assert_allclose(rec["hidden"][layer].astype(np.float32), out.hidden_states[layer][0].numpy(),
                                   rtol=1e-2, atol=2e-2)
    assert main(argv) == 0 and (tmp_path / "shard-0000.npz").read_bytes() == shard      # nothing left to do


def test_float32_features_and_older_float16_manifests(model, tmp_path):
    items = _items(4)
    record_stream(model, items, tmp_path / "f32", _settings(4, feature_dtype="float32"), check_prompts=0)
    rec = open_recording(tmp_path / "f32")
    got = rec.prompt(1)
    assert got["hidden"][-1].dtype == np.float32 and got["topm_probs"].dtype == np.float32
    with torch.no_grad():
        out = model(torch.tensor([got["tokens"].tolist()]), output_hidden_states=True)
    assert np.abs(got["hidden"][-1] - out.hidden_states[-1][0].numpy()).max() < 1e-5       # float32, not float16
    with pytest.raises(ValueError, match="feature_dtype: recorded 'float32', asked 'float16'"):
        record_stream(model, items, tmp_path / "f32", _settings(4), check_prompts=0)
    # a recording made before the setting existed is float16 and resumes under the default
    record_stream(model, items, tmp_path / "old", _settings(4), check_prompts=0)
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    del manifest["settings"]["feature_dtype"]
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    before = (tmp_path / "old" / "shard-0000.npz").read_bytes()
    record_stream(model, items, tmp_path / "old", _settings(4), check_prompts=0)   # resumes: nothing to redo
    assert (tmp_path / "old" / "shard-0000.npz").read_bytes() == before
    with pytest.raises(ValueError, match="feature_dtype"):
        _settings(1, feature_dtype="bfloat16")


def test_first_difference():
    from specloop.realmodels.recording import first_difference
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([], [4]) == 0
