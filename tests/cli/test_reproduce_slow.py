"""`specloop reproduce` end to end at the tiny scale (slow: runs the real parts'
code, PPO training for LTD and, in the second test, the embedded SmolLM2)."""
from __future__ import annotations

import json

import pytest

from specloop.cli import main as cli_main

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLOOP_LTD_DIR", str(tmp_path / "ltd-cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _reproduce(out, capsys, *extra) -> dict:
    code = cli_main(["reproduce", "--tiny", "--out", str(out), "--json", *extra])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0, summary
    return summary


def test_reproduce_tiny_skip_real_then_reuse(tmp_path, capsys):
    out = tmp_path / "run"
    first = _reproduce(out, capsys, "--skip-real")
    status = {p["name"]: p["status"] for p in first["parts"]}
    assert status["speedup_table"] == status["online_stream"] == "skipped"
    for name in ("theory", "theory_vs_sim", "optimal_k", "regret"):
        assert status[name] == "ok", first
        assert (out / name / "DONE.json").exists()
    report = (out / "report.md").read_text()
    for name in ("theory_vs_sim", "optimal_k", "regret"):
        assert f"]({name}/{name}.png)" in report
    assert "acc_equals_one_minus_tv" in report and "sim_matches_theory_tokens" in report
    second = _reproduce(out, capsys, "--skip-real")
    assert all(p["reused"] for p in second["parts"] if p["status"] == "ok")
    assert second["seconds"] < first["seconds"]


def test_reproduce_tiny_real_parts(tmp_path, capsys):
    out = tmp_path / "real"
    summary = _reproduce(out, capsys, "--parts", "speedup_table,online_stream")
    status = {p["name"]: p["status"] for p in summary["parts"]}
    assert set(status.values()) <= {"ok", "unavailable"}, summary
    if status["speedup_table"] == "ok":
        rows = (out / "speedup_table" / "speedup_table.csv").read_text().splitlines()
        assert rows[0].startswith("method,")
        assert any(r.startswith(("hf_greedy,", "hf-greedy,")) for r in rows[1:])
