"""Resumable epoch runs of draft heads (`training.epoch_loop`) on a tiny recorded target:
a run stopped by budget and resumed ends with the weights of an uninterrupted one, the
resumed bar starts at its step, other settings are refused; answer sets are rebuilt
into a keyed cache and reused; the report carries top-1, coverage and tau."""
from __future__ import annotations

import json

import pytest
import torch

from specloop.realmodels.training.epoch_loop import CHECKPOINT_NAME, EpochPlan, parse_checkpoint_every
from specloop.realmodels.training.trainer import get_trainer

from .decoder_util import one_thread  # noqa: F401
from .test_train_from_recording import _config, recording, target  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def _epoch_config(kind, rec, out, **over):
    return _config(kind, rec, out, epochs=2, checkpoint_every_steps=3, checkpoint_every_minutes=0.0, **over)


def _weights(folder):
    from safetensors.torch import load_file
    return load_file(str(folder / "draft.safetensors"))


def test_epoch_plan_visits_every_item_once_per_epoch():
    plan = EpochPlan(items=10, batch_size=4, epochs=2, seed=1)
    assert plan.steps_per_epoch == 3 and plan.total_steps == 6
    first = sorted(int(i) for s in range(3) for i in plan.batch(s))
    second = [int(i) for s in range(3, 6) for i in plan.batch(s)]
    assert first == list(range(10)) and sorted(second) == list(range(10))
    assert second != [int(i) for s in range(3) for i in plan.batch(s)]        # each epoch its own order
    assert parse_checkpoint_every("500") == (500, 0.0) and parse_checkpoint_every("10m") == (0, 10.0)
    for bad in ("0", "x", "-3m"):
        with pytest.raises(ValueError):
            parse_checkpoint_every(bad)


@pytest.mark.parametrize("kind", ["eagle3", "hydra"])
def test_budget_stopped_and_resumed_run_equals_an_uninterrupted_one(target, recording, tmp_path, kind,
                                                                    monkeypatch):
    import tqdm.auto
    whole = get_trainer(kind)(_epoch_config(kind, recording, tmp_path / "whole"), loaded=target, progress=False)
    assert whole["complete"] and whole["sessions"] == 1
    initials, real = [], tqdm.auto.tqdm

    def recording_bar(*args, **kwargs):
        initials.append(kwargs.get("initial", 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(tqdm.auto, "tqdm", recording_bar)
    sessions = 0
    while True:
        sessions += 1
        part = get_trainer(kind)(_epoch_config(kind, recording, tmp_path / "part", budget_minutes=1e-7),
                                 loaded=target, progress=False)
        if part["complete"]:
            break
        assert (tmp_path / "part" / CHECKPOINT_NAME).is_file() and not (tmp_path / "part" / "draft.safetensors").exists()
        assert json.loads((tmp_path / "part" / "train_report.json").read_text())["complete"] is False
        assert sessions < 200
    assert sessions >= 2 and part["sessions"] == sessions and part["steps"] == whole["steps"]
    assert initials[0] == 0 and initials[1] >= 1 and initials == sorted(initials)   # a resumed bar starts at its step
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    report = json.loads((tmp_path / "part" / "train_report.json").read_text())
    for key in ("positions", "epochs", "steps", "seconds", "train_top1_per_step", "heldout_top1_per_step"):
        assert key in report, key
    assert len(report["heldout_top1_per_step"]) == (2 if kind == "eagle3" else 5)
    with pytest.raises(ValueError, match="other settings.*lr"):
        get_trainer(kind)(_epoch_config(kind, recording, tmp_path / "part", lr=1e-3), loaded=target, progress=False)


def test_epoch_refusals(recording, tmp_path):
    from specloop.realmodels.training.trainer import TrainConfig
    with pytest.raises(ValueError, match="recordings"):
        TrainConfig(target="tiny", kind="eagle3", epochs=2)
    with pytest.raises(ValueError, match="small-lm"):
        _epoch_config("small-lm", recording, tmp_path)
    with pytest.raises(ValueError, match="budget_minutes"):
        TrainConfig(target="tiny", kind="eagle3", budget_minutes=5)


def test_cli_epoch_flag_refusals_exit_2(recording, tmp_path, capsys):
    from specloop.cli import main
    base = ["draft", "train", "--kind", "eagle3", "--out", str(tmp_path / "d")]
    assert main(base + ["--budget-minutes", "5", "--from-recording", str(recording)]) == 2
    assert "--budget-minutes needs --epochs" in capsys.readouterr().err
    assert main(base + ["--epochs", "2", "--steps", "5", "--from-recording", str(recording)]) == 2
    assert main(base + ["--epochs", "2"]) == 2
    assert main(base + ["--eval-prompts", "4", "--from-recording", str(recording)]) == 2
    assert main(base + ["--from-answers", str(tmp_path / "none")]) == 2
    assert "--from-answers" in capsys.readouterr().err


class _Tokenizer:
    """The tokenizer surface an answer set reads (vocabulary, template, EOS)."""

    chat_template, eos_token_id = "t", 31

    def get_vocab(self):
        return {f"tok{i}": i for i in range(32)}


def _answer_set(target, folder, count=22):
    from specloop.realmodels.answers.answer_set import AnswerSettings
    from specloop.realmodels.answers.run import generate_answer_set
    from .test_train_from_recording import _items
    settings = AnswerSettings(target="tiny", dtype="float32", datasets=("a", "b"), split="warmup", order="shift",
                              prompts=count, max_new_tokens=24, max_prompt_tokens=None, chat_template=False,
                              batch_size=4, piece_size=8, torch_threads=1)
    generate_answer_set(target, _items(count), folder, settings)
    return folder


@pytest.mark.slow
def test_answers_are_rebuilt_once_and_the_report_has_tau_and_coverage(target, tmp_path):
    from specloop.cli.draft_cmd import answers_recording, heldout_tau
    from specloop.realmodels.training.epoch_loop import write_train_report
    from specloop.realmodels.loading import LoadedModel
    target = LoadedModel(model=target.model, tokenizer=_Tokenizer(), name="tiny", source="test")
    answers = _answer_set(target, tmp_path / "answers")
    calls = []

    def load(dtype):
        calls.append(dtype)
        return target

    rec = answers_recording(load, answers, tmp_path / "cache", progress=False)
    assert answers_recording(load, answers, tmp_path / "cache", progress=False) == rec     # reused
    evals = answers_recording(load, answers, tmp_path / "cache", prompts=6, progress=False)
    assert evals != rec and calls == ["float32"] * 3
    assert json.loads((tmp_path / "cache" / rec.split("/")[-1] / "source.json").read_text())["prompts"] == 22
    cfg = _epoch_config("eagle3", rec, tmp_path / "head", eval_recordings=(evals,), vocab_from_answers=True,
                        draft_vocab_size=16)
    report = get_trainer("eagle3")(cfg, loaded=target, progress=False)
    assert report["complete"] and 0 < report["eval_vocab_coverage"] <= 1 and len(report["eval_top1_per_step"]) == 2
    tau = heldout_tau(tmp_path / "head", "eagle3", target, evals, ks=(2, 3), tree="topk=2,depth=3,v=5")
    assert tau["prompts"] == 6 and all(1.0 <= tau[k]["tau"] <= k_max + 1 for k, k_max in
                                       (("chain-k2", 2), ("chain-k3", 3), ("tree", 3)))
    write_train_report(tmp_path / "head", {**report, "heldout_tau": tau})
    assert "heldout_tau" in json.loads((tmp_path / "head" / "train_report.json").read_text())
