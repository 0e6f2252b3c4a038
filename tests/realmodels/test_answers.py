"""Answer sets: the continuously batched generator against batch-1 greedy decoding, and
the folder format (resume, budget, integrity, refusals)."""
from __future__ import annotations

import json

import pytest
import torch

from specloop.data.streams import StreamItem
from specloop.realmodels.answers.answer_set import (AnswerSettings, DamagedPieceError, answer_set_info,
                                                    open_answer_set)
from specloop.realmodels.answers.generator import generate_greedy, length_order
from specloop.realmodels.answers.run import generate_answer_set
from specloop.realmodels.loading import LoadedModel
from tests.realmodels.decoder_util import one_thread, plain_greedy, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 40


def _prompts(count: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 14, (count,), generator=gen).tolist()
    return [torch.randint(0, VOCAB - 1, (n,), generator=gen).tolist() for n in lengths]


def _frequent_token(model, prompts, steps: int) -> int:
    """A token the model emits often: used as EOS so rows stop mid-batch."""
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for p in prompts:
        for t in plain_greedy(model, p, steps):
            counts[t] += 1
    return int(counts.argmax())


def test_length_order_is_longest_first_with_ties_in_input_order():
    assert length_order([3, 5, 3, 7]) == [3, 1, 0, 2]


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_float32_answers_equal_batch1_greedy_with_eos_mid_batch_and_slot_reuse(batch_size):
    model = tiny_llama(vocab=VOCAB, seed=3, layers=2, hidden=32, max_positions=64)
    prompts = _prompts(11)
    eos = _frequent_token(model, prompts[:4], 12)
    answers = generate_greedy(model, prompts, 12, [eos], batch_size=batch_size)
    stops = {a.stop_reason for a in answers}
    assert stops == {"eos", "length"}, "the case must stop some rows at EOS and some at the cap"
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        assert answer.index == i
        assert list(answer.tokens) == plain_greedy(model, prompt, 12, eos)
        assert (answer.stop_reason == "eos") == (answer.tokens[-1] == eos)


def test_generator_refuses_bad_input():
    model = tiny_llama(vocab=VOCAB, max_positions=16)
    with pytest.raises(ValueError, match="non-empty"):
        generate_greedy(model, [[1], []], 4, [0])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_greedy(model, [[1]], 0, [0])
    with pytest.raises(ValueError, match="context window"):
        generate_greedy(model, [[1] * 10], 10, [0])


class _Tokenizer:
    """The tokenizer surface an answer set reads (vocabulary, template, EOS)."""

    def __init__(self, template: str = "t"):
        self.chat_template = template
        self.eos_token_id = VOCAB - 1

    def get_vocab(self):
        return {f"tok{i}": i for i in range(VOCAB)}


def _items(prompts):
    return [StreamItem(i, "toy", f"id{i}", "", tuple(p)) for i, p in enumerate(prompts)]


def _settings(prompts: int, piece_size: int = 4) -> AnswerSettings:
    return AnswerSettings(target="tiny", dtype="float32", datasets=("toy",), split="heldout", order="shift",
                          prompts=prompts, max_new_tokens=8, max_prompt_tokens=None, chat_template=True,
                          batch_size=3, piece_size=piece_size, torch_threads=1)


def _target(seed: int = 3, template: str = "t") -> LoadedModel:
    model = tiny_llama(vocab=VOCAB, seed=seed, layers=2, hidden=32, max_positions=64)
    return LoadedModel(model=model, tokenizer=_Tokenizer(template), name="tiny", source="test")


def test_a_budget_stopped_run_resumes_to_the_same_bytes_and_info_reports_the_set(tmp_path):
    prompts, target = _prompts(10), _target()
    whole = generate_answer_set(target, _items(prompts), tmp_path / "whole", _settings(10))
    assert whole["complete"] and len(whole["pieces"]) == 3
    part = generate_answer_set(target, _items(prompts), tmp_path / "part", _settings(10), budget_minutes=1e-9)
    assert not part["complete"] and len(part["pieces"]) == 1                  # stopped at a piece boundary
    (tmp_path / "part" / "piece-0001.npz.tmp").write_bytes(b"half a piece")   # a run killed mid-write
    resumed = generate_answer_set(target, _items(prompts), tmp_path / "part", _settings(10))
    assert resumed["complete"]
    for a, b in zip(whole["pieces"], resumed["pieces"]):
        assert a["sha256"] == b["sha256"] and a["bytes"] == b["bytes"]
    info = answer_set_info(tmp_path / "part")
    assert info["prompts"] == 10 and info["complete"] and info["split"] == "heldout"
    assert info["answer_positions"] == sum(len(plain_greedy(target.model, p, 8, VOCAB - 1)) for p in prompts)
    assert len(info["target_fingerprint"]) == 64
    records = list(open_answer_set(tmp_path / "part").records())
    assert [r["prompt"].tolist() for r in records] == prompts


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_damaged_piece_is_named_and_never_reused(tmp_path, damage):
    prompts, target = _prompts(6), _target()
    generate_answer_set(target, _items(prompts), tmp_path, _settings(6))
    piece = tmp_path / "piece-0000.npz"
    data = bytearray(piece.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray()
    piece.write_bytes(bytes(data))
    with pytest.raises(DamagedPieceError, match="piece-0000.npz"):
        open_answer_set(tmp_path)
    with pytest.raises(DamagedPieceError, match="piece-0000.npz"):
        generate_answer_set(target, _items(prompts), tmp_path, _settings(6))


def test_another_target_tokenizer_or_setting_is_refused(tmp_path):
    prompts = _prompts(4)
    generate_answer_set(_target(), _items(prompts), tmp_path, _settings(4, piece_size=2), budget_minutes=1e-9)
    with pytest.raises(ValueError, match="fingerprint"):
        generate_answer_set(_target(seed=4), _items(prompts), tmp_path, _settings(4, piece_size=2))
    with pytest.raises(ValueError, match="tokenizer"):
        generate_answer_set(_target(template="other"), _items(prompts), tmp_path, _settings(4, piece_size=2))
    with pytest.raises(ValueError, match="piece_size"):
        generate_answer_set(_target(), _items(prompts), tmp_path, _settings(4, piece_size=3))


def test_the_check_before_tokenizing_accepts_the_same_settings_and_names_another(tmp_path):
    """The CLI checks a folder before the model loads, when the prompts' hash is not known yet."""
    from specloop.realmodels.answers.run import check_resumable
    prompts = _prompts(4)
    generate_answer_set(_target(), _items(prompts), tmp_path, _settings(4, piece_size=2), budget_minutes=1e-9)
    assert check_resumable(tmp_path, _settings(4, piece_size=2))["pieces"][0]["file"] == "piece-0000.npz"
    with pytest.raises(ValueError, match="piece_size: recorded 2, asked 3"):
        check_resumable(tmp_path, _settings(4, piece_size=3))


def test_a_truncated_manifest_is_named(tmp_path):
    prompts = _prompts(2)
    generate_answer_set(_target(), _items(prompts), tmp_path, _settings(2))
    path = tmp_path / "manifest.json"
    path.write_text(path.read_text()[:40])
    with pytest.raises(ValueError, match="manifest.json"):
        open_answer_set(tmp_path)
    path.write_text(json.dumps({"format": "specloop.answers", "format_version": 2}))
    with pytest.raises(ValueError, match="format version 2"):
        open_answer_set(tmp_path)


def test_smollm2_float32_answers_equal_the_decoders_batch1_greedy(smollm2_float32):
    """The embedded target on ragged ShareGPT prompts: continuously batched answers
    equal `SpeculativeDecoder` with no draft (k = 0), token for token."""
    from specloop.data.streams import build_stream
    from specloop.realmodels.decoder import SpeculativeDecoder, eos_ids_of
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.drafters.base import NoDraft
    items = build_stream(["sharegpt"], 5, smollm2_float32.tokenizer, split="heldout", max_prompt_tokens=96)
    prompts = [list(it.ids) for it in items]
    assert len({len(p) for p in prompts}) > 1, "ragged prompts"
    eos = sorted(eos_ids_of(smollm2_float32.model, smollm2_float32.tokenizer))
    answers = generate_greedy(smollm2_float32.model, prompts, 20, eos, batch_size=2)
    decoder = SpeculativeDecoder(smollm2_float32, NoDraft(), policy=FixedDraftPolicy(0), eos_token_id=eos, seed=0)
    for prompt, answer in zip(prompts, answers):
        assert list(answer.tokens) == list(decoder.generate(torch.tensor(prompt), 20).new_tokens)


def test_a_recording_rebuilt_from_answers_equals_a_direct_recording(tmp_path):
    """One generator for the target's side: the direct recorder generates with the
    answer-set generator and takes features from the same teacher-forced prefill, so
    with the same settings the shards are the same bytes (tokens, features, top-m)."""
    import numpy as np

    from specloop.realmodels.answers.rebuild import rebuild_recording
    from specloop.realmodels.recording import RecordSettings, head_feature_layers, open_recording
    from specloop.realmodels.streams.record import record_stream
    prompts, target = _prompts(7), _target()
    generate_answer_set(target, _items(prompts), tmp_path / "answers", _settings(7))
    rebuilt = open_recording(tmp_path / "rec") if rebuild_recording(
        target, tmp_path / "answers", tmp_path / "rec", top_m=5, batch_size=3, shard_size=4)["complete"] else None
    direct_settings = RecordSettings(target="tiny", dtype="float32", datasets=("toy",), split="heldout",
                                     order="shift", prompts=7, max_new_tokens=8, max_prompt_tokens=None,
                                     chat_template=True, top_m=5, layers=head_feature_layers(target.model.config),
                                     batch_size=3, shard_size=4)
    record_stream(target.model, _items(prompts), tmp_path / "direct", direct_settings, check_prompts=0)
    direct = open_recording(tmp_path / "direct")
    assert rebuilt.settings["prompts_sha256"] == direct.settings["prompts_sha256"]
    for i in range(7):
        a, b = rebuilt.prompt(i), direct.prompt(i)
        assert a["tokens"].tolist() == b["tokens"].tolist() and a["prompt_length"] == b["prompt_length"]
        assert a["stop_reason"] == b["stop_reason"]
        for layer in rebuilt.layers:
            np.testing.assert_allclose(a["hidden"][layer].astype(np.float32), b["hidden"][layer].astype(np.float32),
                                       atol=2e-2, rtol=0)
        assert (a["topm_ids"][:, 0] == b["topm_ids"][:, 0]).all()
        np.testing.assert_allclose(a["topm_probs"].astype(np.float32), b["topm_probs"].astype(np.float32), atol=1e-2)
    for name in ("shard-0000.npz", "shard-0001.npz"):
        assert (tmp_path / "rec" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes()
    with pytest.raises(ValueError, match="fingerprint"):
        rebuild_recording(_target(seed=5), tmp_path / "answers", tmp_path / "rec2")
    with pytest.raises(ValueError, match="holds 7"):
        rebuild_recording(target, tmp_path / "answers", tmp_path / "rec3", prompts=8)


def test_a_sub_stream_rebuild_keeps_every_nth_prompt_in_order(tmp_path):
    """``every=N``: the recording of prompts 0, N, 2N, ... of the set, equal prompt for
    prompt to the full rebuild's; its size bound and the manifest's ``every``."""
    from specloop.realmodels.answers.rebuild import rebuild_recording
    from specloop.realmodels.recording import open_recording
    prompts, target = _prompts(7), _target()
    generate_answer_set(target, _items(prompts), tmp_path / "answers", _settings(7))
    full = rebuild_recording(target, tmp_path / "answers", tmp_path / "full", top_m=5, batch_size=3, shard_size=4)
    sub = rebuild_recording(target, tmp_path / "answers", tmp_path / "sub", top_m=5, batch_size=3, shard_size=4,
                            every=3)
    assert full["complete"] and sub["complete"] and sub["every"] == 3 and "every" not in full
    a, b = open_recording(tmp_path / "full"), open_recording(tmp_path / "sub")
    assert b.num_prompts == 3                        # prompts 0, 3, 6
    for j, i in enumerate((0, 3, 6)):
        assert b.prompt(j)["tokens"].tolist() == a.prompt(i)["tokens"].tolist()
    with pytest.raises(ValueError, match="3 at every 3-th"):
        rebuild_recording(target, tmp_path / "answers", tmp_path / "sub2", prompts=4, every=3)
    with pytest.raises(ValueError, match="every must be"):
        rebuild_recording(target, tmp_path / "answers", tmp_path / "sub3", every=0)
