"""benchmarks/gpu_check.py's CPU smoke mode (``--device cpu --tiny``): the code the
GPU check runs, on CPU, so it cannot break unseen before a device machine runs it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path, sections: str) -> dict:
    out = tmp_path / "gpu_check.json"
    rc = _module().main(["--device", "cpu", "--tiny", "--out", str(out), "--sections", sections])
    report = json.loads(out.read_text())
    assert rc == (0 if report["ok"] else 1)
    return report


def test_smoke_sampling_and_real_shape(tmp_path):
    report = _run(tmp_path, "sampling,real_shape")
    assert report["ok"], report
    shape = report["sections"]["real_shape"]
    assert set(shape["verify_seconds_by_width"]) == {"1", "2", "4", "8", "12", "16"}
    assert all(row["rounds"] > 0 and row["syncs_per_round"] is None for row in shape["rows"])
    assert all(r["cells"] >= 2 and r["chi2_pvalue"] >= 1e-3 for r in report["sections"]["sampling"]["rows"].values())


@pytest.mark.slow
def test_smoke_lossless_every_drafter(tmp_path):
    report = _run(tmp_path, "lossless")
    assert report["ok"], report["sections"]["lossless"]["failed"]
    assert len(report["sections"]["lossless"]["rows"]) == 27


def test_a_failing_section_is_reported_and_the_rest_runs(tmp_path, monkeypatch):
    module = _module()

    def broken(device, tiny):
        raise RuntimeError("boom")
    monkeypatch.setattr(module, "section_sampling", broken)
    out = tmp_path / "g.json"
    assert module.main(["--device", "cpu", "--tiny", "--out", str(out), "--sections", "sampling,real_shape"]) == 1
    report = json.loads(out.read_text())
    assert "boom" in report["sections"]["sampling"]["error"]
    assert report["sections"]["real_shape"]["ok"]
