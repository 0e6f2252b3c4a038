"""`specloop.ltd.eval_real` and `specloop.ltd.eval_sim`: typed configs behind
``specloop ltd eval|record``; the target comes from the config (default the model
registry's), the CLI's JSON is the library's result, nothing needs an argparse object."""
from __future__ import annotations

import json

import pytest

from specloop.ltd.eval_real import RealEvalConfig, RealLTDSetup, RecordConfig, real_eval, record_real


def test_default_target_is_the_registrys_first_name():
    from specloop.realmodels.loading import registry_names
    assert RealLTDSetup().target == registry_names()[0]
    assert RecordConfig(out="x").setup.drafter == "eagle3" and RealLTDSetup().drafter == "eagle"


def test_bad_hooks_name_is_refused():
    with pytest.raises(ValueError, match="hooks"):
        RealEvalConfig(hooks="magic")


def test_the_configured_target_is_loaded(tmp_path, monkeypatch):
    """record_real loads the config's target (not a hard-coded name), after the resumability check."""
    import specloop.realmodels.loading as loading
    asked = []

    def fake_load(name, **kwargs):
        asked.append((name, kwargs.get("dtype")))
        raise FileNotFoundError(f"no model {name}")

    monkeypatch.setattr(loading, "load_model", fake_load)
    setup = RealLTDSetup(target="some/other-model", dtype="float32", prompts=1, max_new_tokens=2)
    with pytest.raises(FileNotFoundError, match="some/other-model"):
        record_real(RecordConfig(tmp_path / "rec", setup))
    assert asked == [("some/other-model", "float32")]


def test_grid_only_reuses_the_saved_grid_without_a_model(tmp_path, monkeypatch):
    import specloop.realmodels.loading as loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_model", no_load)
    (tmp_path / "ltd_grid_real.json").write_text(json.dumps({"best": {"depth": 2}, "grid": []}))
    assert real_eval(RealEvalConfig(out=tmp_path, reuse_grid=True, grid_only=True)) == (None, None)


def test_replay_train_and_eval_are_the_cli_json(tmp_path, monkeypatch, capsys):
    """`train_replay` trains without argparse; ``ltd eval --env replay --json`` prints
    `replay_eval`'s result (a replay is deterministic)."""
    from specloop.cli import main
    from specloop.ltd.eval_sim import ReplayEvalConfig, replay_eval
    from specloop.ltd.train_sim import ReplayTrainConfig, train_replay
    from specloop.ltd.train import CoTrainSchedule
    from tests.sim.test_ltd_replay import write_replay

    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path / "cache"))
    rec = tmp_path / "rec"
    rec.mkdir()
    write_replay(rec)
    policy = tmp_path / "p.pt"
    schedule = CoTrainSchedule(32, 32, 1, 32, 32, 4, 32)
    trained = train_replay(ReplayTrainConfig(rec, name=str(policy), schedule=schedule))
    assert [p.name for p in trained["saved"]] == ["p.pt", "p-independent.pt"] and trained["rate_from"] is None
    assert trained["meta"]["env"] == "replay" and len(trained["meta"]["stages"]) == 4
    capsys.readouterr()                                   # co_train's stage lines
    assert main(["ltd", "eval", "--env", "replay", "--replay", str(rec), "--tune-replay", str(rec),
                 "--policy", str(policy), "--out", str(tmp_path / "out"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    result, decisions = replay_eval(ReplayEvalConfig(rec, rec, policy=str(policy)))
    assert printed == json.loads(json.dumps(result))
    assert list(decisions) == [r["config"] for r in result["rows"]]
    assert "independent (not co-trained)" in decisions
    assert (tmp_path / "out" / "ltd_decisions_replay.csv").is_file()
