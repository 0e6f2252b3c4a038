"""`specloop ltd`: policy names that are file paths (train + eval), the training-log
name, and a light CLI start-up (building the parser imports no torch)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specloop.cli import main
from specloop.cli.ltd_cmd import REWARD_CHOICES, train_log_path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "numba", "stable_baselines3", "gymnasium")

_PROBE = """
import sys
from specloop.cli import main
for argv in (["--help"], ["ltd", "--help"], ["ltd", "train", "--help"], ["stream", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
print("HEAVY=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def test_cli_help_imports_no_torch():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: specloop" in out.stdout
    line = [x for x in out.stdout.splitlines() if x.startswith("HEAVY=")][-1]
    assert line == "HEAVY=", f"`specloop --help` imported {line[6:]}"


def test_reward_choices_are_the_strategy_rewards():
    from specloop.ltd.policy import REWARDS
    assert tuple(REWARD_CHOICES) == tuple(REWARDS)


def test_variant_names_of_names_and_paths():
    from specloop.ltd.policy import variant_name
    assert variant_name("ltd-sim", "-independent") == "ltd-sim-independent"
    assert variant_name("/tmp/x/p", "-size-time_cost") == "/tmp/x/p-size-time_cost"
    assert variant_name("/tmp/x/p.pt", "-independent") == "/tmp/x/p-independent.pt"
    assert variant_name(Path("rel/p.pt"), "-independent") == str(Path("rel/p-independent.pt"))
    with pytest.raises(ValueError):
        variant_name("", "-independent")


def test_train_log_path_uses_the_basename(tmp_path):
    assert train_log_path(tmp_path, "ltd-sim") == tmp_path / "ltd_train_ltd-sim.json"
    assert train_log_path(tmp_path, "/tmp/x/mypolicy") == tmp_path / "ltd_train_mypolicy.json"
    assert train_log_path(tmp_path, "/tmp/x/mypolicy.pt") == tmp_path / "ltd_train_mypolicy.json"
    with pytest.raises(ValueError, match="basename"):
        train_log_path(tmp_path, "/")


TINY = ["--depth-steps", "32", "--size-steps", "32", "--rounds", "1", "--co-depth-steps", "32",
        "--co-size-steps", "32", "--n-steps", "32"]


def test_train_and_eval_with_a_path_name(tmp_path, monkeypatch, capsys):
    from specloop.ltd.policy import load_policy
    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path / "cache"))   # nothing may land in the cache
    target = tmp_path / "x" / "mypolicy"
    out = tmp_path / "out"
    assert main(["ltd", "train", "--env", "sim", "--name", str(target), "--out", str(out),
                 "--reward-ablation", *TINY]) == 0
    for suffix in ("", "-independent", "-size-accepted_length", "-size-time_cost"):
        policy = load_policy(f"{target}{suffix}")
        assert policy.size_actor is not None
    assert load_policy(target).depth_actor is not None
    log = json.loads((out / "ltd_train_mypolicy.json").read_text())
    assert log["name"] == str(target) and set(log["reward_ablation"]) == {"accepted_length", "time_cost"}
    assert [s["steps"] for s in log["stages"]] == [32, 32, 32, 32]
    assert not (tmp_path / "cache").exists()
    capsys.readouterr()

    assert main(["ltd", "eval", "--env", "sim", "--policy", str(target), "--episodes", "1",
                 "--out", str(tmp_path / "eval"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["policy"] == str(target)
    configs = [row["config"] for row in result["rows"]]
    for label in ("LTD (co-trained)", "independent (not co-trained)", "reward=accepted_length (size-only)",
                  "reward=time_cost (size-only)", "reward=throughput (size-only)"):
        assert label in configs
    for row in result["rows"]:
        assert row["tokens_per_s"] > 0 and row["mean_accepted_length"] >= 1
        assert row["speedup_vs_best_static"] == pytest.approx(row["tokens_per_s"] / result["rows"][0]["tokens_per_s"])
    assert (tmp_path / "eval" / "ltd_eval_sim.json").is_file()


def test_ablation_only_trains_just_the_reward_ablation(tmp_path, monkeypatch):
    from specloop.ltd.policy import load_policy
    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path / "cache"))
    target = tmp_path / "p.pt"
    assert main(["ltd", "train", "--env", "sim", "--name", str(target), "--out", str(tmp_path),
                 "--ablation-only", *TINY]) == 0
    assert not target.exists() and not (tmp_path / "p-independent.pt").exists()
    for reward in ("accepted_length", "time_cost"):
        policy = load_policy(tmp_path / f"p-size-{reward}.pt")
        assert policy.depth_actor is None and policy.meta["reward"] == reward
    assert (tmp_path / "ltd_train_p-reward-ablation.json").is_file()
    assert main(["ltd", "train", "--env", "sim", "--n-steps", "1", "--out", str(tmp_path)]) == 2


def test_shipped_reward_ablation_policies_load_by_name(tmp_path, monkeypatch):
    """`specloop ltd eval` looks up ``ltd-sim-size-<reward>`` for the reward ablation."""
    from specloop.ltd.policy import PAPER_REWARDS, PRETRAINED_DIR, load_policy, variant_name
    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path))          # an empty cache: the package copy
    base = load_policy("ltd-sim")
    for reward in PAPER_REWARDS[1:]:
        name = variant_name("ltd-sim", f"-size-{reward}")
        assert (PRETRAINED_DIR / f"{name}.pt").stat().st_size < 10 * 2**20
        policy = load_policy(name)
        assert policy.depth_actor is None and policy.size_actor is not None
        assert policy.config == base.config and policy.meta["reward"] == reward


def test_train_and_eval_on_a_replay(tmp_path, monkeypatch, capsys):
    """``--env replay`` on a synthetic recording: train saves the pair, eval reports
    the rows, the held-out best static tree and the clairvoyant oracle, and the real
    eval's replay preselection returns the best ``--grid-top`` static trees."""
    from specloop.ltd.eval_sim import replay_grid_pairs
    from specloop.ltd.policy import load_policy
    from tests.sim.test_ltd_replay import write_replay

    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path / "cache"))
    replay = tmp_path / "rec"
    replay.mkdir()
    write_replay(replay)
    target = tmp_path / "p.pt"
    argv = ["ltd", "train", "--env", "replay", "--replay", str(replay), "--name", str(target), "--out", str(tmp_path),
            *TINY]
    assert main(argv) == 2                               # V = 12 while the depth policy trains: not recorded
    assert main(argv + ["--fixed-verify-size", "4"]) == 0
    policy = load_policy(target)
    assert policy.config.top_k == 3 and policy.config.max_depth == 4 and policy.config.verify_sizes == (2, 4, 6, 8)
    assert load_policy(tmp_path / "p-independent.pt").depth_actor is not None
    assert json.loads((tmp_path / "ltd_train_p.json").read_text())["env"] == "replay"
    capsys.readouterr()
    assert main(["ltd", "eval", "--env", "replay", "--replay", str(replay), "--tune-replay", str(replay),
                 "--policy", str(target), "--out", str(tmp_path / "eval"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "replay" and result["rows"][0]["speedup_vs_best_static"] == pytest.approx(1.0)
    assert result["heldout_best_static"]["tokens_per_s"] >= result["rows"][0]["tokens_per_s"] - 1e-9
    assert result["oracle_tokens_per_s"] > 0 and "LTD (co-trained)" in [r["config"] for r in result["rows"]]
    pairs = replay_grid_pairs(replay, 3)
    grid = {(r["depth"], r["verify_size"]): r["tokens_per_s"] for r in result["grid"]}
    assert len(pairs) == 3 and [grid[p] for p in pairs] == sorted(grid.values(), reverse=True)[:3]


def test_replay_fine_tune_from_an_init_policy(tmp_path, monkeypatch):
    """``ltd train --env replay --init P`` fine-tunes P on the recording (``--rounds``
    alternations of depth then size) and saves one policy with P's config."""
    from specloop.ltd.policy import load_policy
    from tests.sim.test_ltd_replay import write_replay

    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path / "cache"))
    replay = tmp_path / "rec"
    replay.mkdir()
    write_replay(replay)
    base, tuned = tmp_path / "base.pt", tmp_path / "tuned.pt"
    common = ["ltd", "train", "--env", "replay", "--replay", str(replay), "--out", str(tmp_path), *TINY,
              "--fixed-verify-size", "4"]
    assert main(common + ["--name", str(base)]) == 0
    assert main(common + ["--name", str(tuned), "--init", str(base), "--rounds", "2"]) == 0
    policy = load_policy(tuned)
    assert policy.config == load_policy(base).config
    assert policy.meta["init"] == str(base)
    assert [s["kind"] for s in policy.meta["stages"]] == ["depth", "size", "depth", "size"]
    assert not (tmp_path / "tuned-independent.pt").exists()
    assert main(common + ["--name", str(tmp_path / "x.pt"), "--init", str(tmp_path / "missing.pt")]) == 2
    assert main(["ltd", "eval", "--env", "replay", "--replay", str(replay), "--tune-replay", str(replay),
                 "--policy", str(base), "--fine-tuned", str(tuned), "--out", str(tmp_path / "eval")]) == 0
    from specloop.ltd.policy import fine_tuned_label
    rows = json.loads((tmp_path / "eval" / "ltd_eval_replay.json").read_text())["rows"]
    assert fine_tuned_label(str(tuned)) in [r["config"] for r in rows]


def test_record_refuses_other_settings_before_loading_a_model(tmp_path, monkeypatch):
    """``ltd record`` into a finished recording made with other settings exits 2
    before any model is loaded (nothing on disk changes)."""
    import specloop.realmodels.loading as loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings check")

    monkeypatch.setattr(loading, "load_model", no_load)
    rec = tmp_path / "rec"
    rec.mkdir()
    costs = {"max_depth": 8, "max_verify": 48, "max_new_tokens": 64, "config": {"top_k": 6},
             "drafter": "eagle3", "dtype": "bfloat16"}
    (rec / "costs.json").write_text(json.dumps(costs))
    assert main(["ltd", "record", "--replay", str(rec), "--max-new-tokens", "7", "--prompts", "1"]) == 2
    assert json.loads((rec / "costs.json").read_text()) == costs


def test_shipped_replay_policies_load_by_name(tmp_path, monkeypatch):
    """The replay-trained pair ships with the config of its recording (depth 8, V up to 48)."""
    from specloop.ltd.policy import PRETRAINED_DIR, load_policy
    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path))
    for name in ("ltd-replay", "ltd-replay-independent", "ltd-replay-throughput"):
        assert (PRETRAINED_DIR / f"{name}.pt").stat().st_size < 10 * 2**20
        policy = load_policy(name)
        assert policy.depth_actor is not None and policy.size_actor is not None
        assert policy.config.max_depth == 8 and policy.config.verify_sizes[-1] == 48
    assert load_policy("ltd-replay").meta["reward"] == "net_tokens"


def test_paired_rows_cancel_drift_and_alternate_order():
    """A machine slowing down 10 % per run: alternating the order per prompt cancels
    the drift to first order (paired ratio 1.256 for a true 1.25x; running one
    policy after the other in a fixed order would give 1.25 / 1.1 = 1.14)."""
    from specloop.ltd.evaluate import evaluate_rows_paired
    from specloop.record import RoundRecord, Trace

    calls, clock = [], [1.0]

    def run(policy, prompts):
        calls.append(policy)
        clock[0] *= 1.1                                  # drift: every run is slower than the last
        seconds = clock[0] * (1.0 if policy == "static" else 0.8)
        record = RoundRecord(0, 0, 4, 2, 5, 2, 3, draft_time=0.1 * seconds, verify_time=0.9 * seconds)
        return Trace([record] * 4), [2] * 4, [4] * 4

    rows, _ = evaluate_rows_paired(run, {"static": "static", "ltd": "ltd"}, prompts=[1, 2, 3], repeats=2)
    assert calls[:4] == ["static", "ltd", "ltd", "static"]
    ltd = rows[1]
    assert rows[0]["paired_speedup"] == 1.0 and ltd["paired_speedup"] == pytest.approx(1.25, rel=0.01)
    assert ltd["paired_speedup_se"] > 0 and ltd["rounds"] == 24
    with pytest.raises(ValueError, match="prompts"):
        evaluate_rows_paired(run, {"static": "static"}, prompts=[], repeats=1)
