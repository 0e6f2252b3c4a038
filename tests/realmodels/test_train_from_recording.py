"""Draft heads trained on a stream recording (`specloop.realmodels.training.recording_data`):
the target's own greedy answers, features read from the recording. A tiny random Llama
(8 layers: EAGLE-3's three layers are distinct) is recorded here, float32."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specloop.data.streams import StreamItem
from specloop.realmodels.recording import RecordSettings, head_feature_layers, open_recording
from specloop.realmodels.streams.record import record_stream
from specloop.realmodels.training.recording_data import (VAL_EVERY, npz_memmaps, open_recording_splits)
from specloop.realmodels.training.trainer import TrainConfig, get_trainer

from .decoder_util import as_loaded, one_thread, plain_greedy, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, EOS, NEW, PROMPTS = 32, 31, 24, 22


def _model(seed: int = 5, hidden: int = 16):
    return tiny_llama(vocab=VOCAB, layers=8, hidden=hidden, max_positions=128, init_range=0.9, seed=seed)


@pytest.fixture(scope="module")
def target():
    return as_loaded(_model(), name="tiny")


def _items(count: int, seed: int = 3) -> list[StreamItem]:
    gen = torch.Generator().manual_seed(seed)
    return [StreamItem(i, "a" if i < count // 2 else "b", f"p{i}", "",
                       tuple(torch.randint(0, EOS, (2 + (5 * i) % 11,), generator=gen).tolist()))
            for i in range(count)]


def _record(target, folder, layers=None, seed: int = 3, count: int = PROMPTS):
    items = _items(count, seed)
    settings = RecordSettings(target="tiny", dtype="float32", datasets=("a", "b"), split="warmup", order="shift",
                              prompts=count, max_new_tokens=NEW, max_prompt_tokens=None, chat_template=False,
                              top_m=8, layers=tuple(layers or head_feature_layers(target.model.config)),
                              batch_size=4, shard_size=8)
    record_stream(target, items, folder, settings, check_prompts=0)
    return folder


@pytest.fixture(scope="module")
def recording(target, tmp_path_factory):
    return _record(target, tmp_path_factory.mktemp("rec"))


def _config(kind, rec, out, **over):
    base = dict(target="tiny", kind=kind, steps=30, batch_size=4, window=16, lr=3e-3, ttt_steps=2,
                draft_vocab_size=VOCAB, quick=True, out_dir=str(out), recordings=(str(rec),), bf16_autocast=False)
    base.update(over)
    return TrainConfig(**base)


def test_shard_memmaps_equal_np_load(recording):
    path = recording / "shard-0000.npz"
    with np.load(path) as data:
        names = [n for n in data.files if data[n].dtype.kind in "fiu"]
        maps = npz_memmaps(path, names)
        for name in names:
            assert np.array_equal(maps[name], data[name]), name


@pytest.mark.parametrize("positions", ["continuation", "all"])
def test_features_and_labels_equal_a_direct_target_forward(target, recording, positions):
    train, val, note = open_recording_splits([recording], "tiny", target.model, "eagle3", positions=positions)
    rec = open_recording(recording)
    val_indices = [i for i in range(PROMPTS) if i % VAL_EVERY == 0]
    batches = list(val.iterate_all())
    assert len(batches) == len(val_indices) and note["recordings"][0]["prompts"] == PROMPTS
    for index, batch in zip(val_indices, batches):
        prompt = rec.prompt(index)
        tokens, length = prompt["tokens"].astype(np.int64), prompt["prompt_length"]
        assert batch.tokens[0].tolist() == tokens.tolist()
        with torch.no_grad():
            out = target.model(torch.from_numpy(tokens)[None], output_hidden_states=True)
        for layer in (2, 4, 5, -1):
            direct = out.hidden_states[layer][0]
            assert torch.allclose(batch.features[layer][0], direct, rtol=2e-3, atol=2e-3), layer
        n = len(tokens)
        first = length - 1 if positions == "continuation" else 0
        expected_valid = [first <= j <= n - 2 for j in range(n)]
        assert batch.valid[0].tolist() == expected_valid
        greedy = out.logits[0].argmax(-1)
        labels = batch.topk_ids[0, :, 0]
        assert torch.equal(labels[batch.valid[0]], greedy[batch.valid[0]])
        assert labels[length - 1:n - 1].tolist() == tokens[length:].tolist()     # the recorded answers
    assert train.positions > val.positions > 0


def test_soft_targets_are_the_recorded_top_m(target, recording):
    _, val, note = open_recording_splits([recording], "tiny", target.model, "eagle", soft_targets=True)
    batch = next(val.iterate_all())
    with torch.no_grad():
        probs = torch.softmax(target.model(batch.tokens).logits[0].float(), -1)
    top = torch.topk(probs, 8, -1)
    assert torch.equal(batch.topk_ids[0], top.indices)
    assert torch.allclose(batch.topk_probs[0], top.values, atol=1e-3)
    assert note["labels"] == "soft top-8"


def test_eagle3_training_lowers_the_loss_on_the_recording(target, recording, tmp_path):
    from specloop.realmodels.registry.head_factories import load_eagle_drafter
    from specloop.realmodels.training.train_eagle import ttt_loss
    train, _, _ = open_recording_splits([recording], "tiny", target.model, "eagle3")
    batch = train.window_sampler(16, 16, seed=7).sample()
    losses = []
    for steps in (1, 60):
        get_trainer("eagle3")(_config("eagle3", recording, tmp_path / str(steps), steps=steps), loaded=target,
                              progress=False)
        drafter = load_eagle_drafter(target, "eagle3", folder=tmp_path / str(steps), train_if_missing=False,
                                     progress=False)
        with torch.no_grad():
            losses.append(float(ttt_loss(drafter.head, batch, drafter.vocab.t2d, drafter.vocab.d2t, 2)[0]))
    assert losses[1] < 0.8 * losses[0], losses


def test_hydra_and_small_lm_training_lower_the_loss(target, recording):
    from specloop.realmodels.heads.hydra import build_hydra
    from specloop.realmodels.heads.small_lm import SmallLMDraft
    from specloop.realmodels.training.head_data import HeadBatch
    from specloop.realmodels.training.head_loop import LoopConfig
    from specloop.realmodels.training.train_hydra import HydraTrainConfig, hydra_loss, train_hydra_heads
    from specloop.realmodels.training.train_small_lm import (SmallLMTrainConfig, small_lm_loss,
                                                             train_small_lm_draft)
    train, val, _ = open_recording_splits([recording], "tiny", target.model, "hydra")
    loop = LoopConfig(steps=60, batch_size=64, lr=3e-3, warmup=5)
    torch.manual_seed(0)
    heads = build_hydra(target.model, torch.arange(VOCAB), num_heads=3)
    batch = HeadBatch(*train.head_tensors(np.random.default_rng(9), 3, 256))
    before = float(hydra_loss(heads, batch, HydraTrainConfig())[0].detach())
    train_hydra_heads(heads, train, val, loop, HydraTrainConfig(eval_positions=64), progress=False)
    assert float(hydra_loss(heads, batch, HydraTrainConfig())[0].detach()) < 0.8 * before
    draft = SmallLMDraft.from_target(target.model, torch.arange(VOCAB), num_layers=1)
    windows = train.lm_windows(16, 32, np.random.default_rng(9))
    before = float(small_lm_loss(draft, *windows)[0].detach())
    report = train_small_lm_draft(draft, train, val, LoopConfig(steps=40, batch_size=8, lr=3e-3, warmup=5),
                                  SmallLMTrainConfig(window=16, eval_windows=4), progress=False)
    assert float(small_lm_loss(draft, *windows)[0].detach()) < before
    assert report["train_tokens_available"] == train.positions


def test_refuses_another_target_and_a_missing_layer(target, recording, tmp_path):
    with pytest.raises(ValueError, match="recorded with target 'tiny', not 'other'"):
        open_recording_splits([recording], "other", target.model, "eagle")
    with pytest.raises(ValueError, match="another model"):
        open_recording_splits([recording], "tiny", _model(seed=1, hidden=32), "eagle")
    last_only = _record(target, tmp_path / "last", layers=(-1,), count=11)
    open_recording_splits([last_only], "tiny", target.model, "hydra")             # Hydra reads -1 only
    with pytest.raises(ValueError, match=r"lacks hidden_states layer\(s\) \[2, 4, 5\] that a eagle3"):
        open_recording_splits([last_only], "tiny", target.model, "eagle3")
    with pytest.raises(ValueError, match="positions"):
        open_recording_splits([recording], "tiny", target.model, "eagle", positions="prompt")


def test_cli_refusals_exit_2(recording, tmp_path, capsys):
    from specloop.cli import main
    base = ["draft", "train", "--kind", "eagle3", "--out", str(tmp_path / "d")]
    assert main(base + ["--from-recording", str(recording)]) == 2               # recorded by 'tiny'
    assert "recorded with target 'tiny', not 'smollm2-135m'" in capsys.readouterr().err
    assert main(base + ["--from-recording", str(tmp_path / "none")]) == 2
    assert "--from-recording" in (err := capsys.readouterr().err) and "no such folder" in err
    (tmp_path / "empty").mkdir()
    assert main(base + ["--from-recording", str(tmp_path / "empty")]) == 2
    assert "manifest.json missing" in capsys.readouterr().err
    assert main(base + ["--soft-targets"]) == 2
    assert main(base + ["--from-recording", str(recording), "--tokens", "5000"]) == 2
    assert main(base + ["--revocab"]) == 2                                       # without --init-from
    assert "--revocab needs --init-from" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_cli_maps_recording_options_to_the_config(recording):
    from specloop.cli import build_parser
    from specloop.cli.draft_cmd import _train_config
    args = build_parser().parse_args(["draft", "train", "--kind", "hydra", "--target", "tiny", "--quick",
                                      "--from-recording", str(recording), "--from-recording", str(recording),
                                      "--recording-positions", "all", "--soft-targets"])
    cfg = _train_config(args)
    assert cfg.recordings == (str(recording), str(recording)) and cfg.recording_positions == "all"
    assert cfg.recording_soft_targets and cfg.quick and cfg.feature_root is None


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "hydra", "medusa", "small-lm"])
def test_saved_draft_loads_through_the_registry_and_drafts_losslessly(target, recording, tmp_path, kind):
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.streams.runner import _draft_id
    report = get_trainer(kind)(_config(kind, recording, tmp_path / kind, steps=60), loaded=target, progress=False)
    saved = json.loads((tmp_path / kind / "draft.json").read_text())
    note = saved["train_config"]["recording_data"]
    assert note["recordings"][0]["path"] == str(recording.resolve()) and note["positions"] == "continuation"
    assert len(note["recordings"][0]["settings_sha256"]) == 64 and note["recordings"][0]["prompts"] == PROMPTS
    assert 0.0 <= report["heldout_top1"] <= 1.0
    drafter = make_drafter(kind, target, checkpoint=str(tmp_path / kind), train_if_missing=False, progress=False)
    decoder = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3), eos_token_id=EOS)
    accepted = 0
    for item in _items(PROMPTS)[1:3] + _items(2, seed=11):        # two trained-on prompts, two new ones
        result = decoder.generate(list(item.ids), 20)
        assert result.new_tokens == plain_greedy(target.model, list(item.ids), 20, EOS)
        accepted += sum(r.accepted_tokens for r in result.trace)
    assert accepted > 0             # drafts were verified and some accepted: the check has teeth
    if kind == "eagle3":    # another recording -> another draft id for StreamRunner
        other = _record(target, tmp_path / "other", seed=4)
        get_trainer(kind)(_config(kind, other, tmp_path / "k2", steps=20), loaded=target, progress=False)
        again = make_drafter(kind, target, checkpoint=str(tmp_path / "k2"), train_if_missing=False, progress=False)
        assert _draft_id(again) != _draft_id(drafter) != ""


def test_remap_vocab_rows_keeps_shared_rows_and_starts_new_ones_fresh():
    from specloop.realmodels.heads.common import ReducedVocab
    from specloop.realmodels.training.head_data import remap_vocab_rows
    target_lm = torch.randn(10, 4)
    saved, new = ReducedVocab(torch.tensor([3, 1, 7]), 10), ReducedVocab(torch.tensor([7, 2, 3, 9]), 10)
    rows = torch.randn(3, 4)
    out = remap_vocab_rows(rows, saved, new, target_lm[new.d2t])
    assert torch.equal(out[0], rows[2]) and torch.equal(out[2], rows[0])           # shared: 7, 3
    assert torch.equal(out[1], target_lm[2]) and torch.equal(out[3], target_lm[9])  # new: 2, 9
    with pytest.raises(ValueError):
        remap_vocab_rows(rows[:2], saved, saved, target_lm[saved.d2t])


_ROWS = {"eagle3": ("d2t", "lm_head"), "hydra": ("lm_head.draft_to_target", "lm_head.proj.weight")}


@pytest.mark.parametrize("kind", sorted(_ROWS))
def test_revocab_continues_a_head_on_the_recording_vocabulary(target, recording, tmp_path, kind):
    from safetensors.torch import load_file

    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.policy import FixedDraftPolicy
    d2t_key, rows_key = _ROWS[kind]
    get_trainer(kind)(_config(kind, recording, tmp_path / "a", steps=20, draft_vocab_size=12),
                      loaded=target, progress=False)
    before = load_file(str(tmp_path / "a" / "draft.safetensors"))
    with pytest.raises(ValueError, match="revocab"):
        _config(kind, recording, tmp_path / "x", revocab=True)                     # no init_from
    get_trainer(kind)(_config(kind, recording, tmp_path / "b", steps=1, lr=1e-12, draft_vocab_size=20,
                              init_from=str(tmp_path / "a"), revocab=True), loaded=target, progress=False)
    after = load_file(str(tmp_path / "b" / "draft.safetensors"))
    old, new = before[d2t_key].tolist(), after[d2t_key].tolist()
    assert len(new) == 20 and set(old) < set(new)
    lm = target.model.get_output_embeddings().weight.detach().float()
    for j, token in enumerate(new):              # lr 1e-12: the rows are as remapped
        want = before[rows_key][old.index(token)].float() if token in old else lm[token]
        assert torch.allclose(after[rows_key][j].float(), want, atol=1e-3), (j, token)
    drafter = make_drafter(kind, target, checkpoint=str(tmp_path / "b"), train_if_missing=False, progress=False)
    item = _items(PROMPTS)[1]
    result = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3), eos_token_id=EOS).generate(
        list(item.ids), 20)
    assert result.new_tokens == plain_greedy(target.model, list(item.ids), 20, EOS)
