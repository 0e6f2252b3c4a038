"""Figure (g) end to end at the tiny scale (slow: records real decoder rounds, times
cost tables and runs every LTD policy on the embedded SmolLM2-135M)."""
from __future__ import annotations

import csv

import pytest

from specloop.figures import _base, run_figure

pytestmark = pytest.mark.slow


def test_ltd_real_figure_tiny(monkeypatch, tmp_path):
    monkeypatch.setenv(_base.SCALE_ENV, "tiny")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = run_figure("ltd_real", tmp_path, quick=True)
    assert sorted(p.suffix for p in result.image_paths) == [".png", ".svg"]
    rows = list(csv.DictReader(open(result.data_paths[0])))
    policies = [r["policy"] for r in rows]
    assert policies[0].endswith("(best static)") and len(policies) == 8, policies
    assert "transfer: sim + fine-tuned on real rounds" in policies
    assert all(float(r["real_tokens_per_s"]) > 0 and r["replay_speedup_vs_best_static"] for r in rows)
    assert {c["claim"] for c in result.claims} == {"ltd_beats_best_static_real", "ltd_cotraining_helps_real",
                                                   "ltd_fine_tuning_helps_transfer"}
    # the recordings are reused: a second run records nothing new
    warmup = sorted(p.name for p in (tmp_path / "replay-warmup").iterdir())
    assert "costs.json" in warmup and any(n.endswith(".npz") for n in warmup)
