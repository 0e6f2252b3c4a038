"""benchmarks/online_wallclock: the GPU prediction from the paper's two speedups and the
serial row's measured tau gain, on hand-computed numbers."""
from __future__ import annotations

import pytest

from benchmarks.online_wallclock import PAPER_SPEEDUPS, gpu_prediction


def test_prediction_uses_the_serial_rows_gain_and_the_papers_update_share():
    result = {"rows": {"frozen": {"method": None, "background": False, "tau": 2.0},
                       "serial": {"method": "opt-hydra", "background": False, "tau": 2.2},
                       "background-split": {"method": "opt-hydra", "background": True, "tau": 2.1}}}
    out = gpu_prediction(result, "opt-hydra")
    assert out["gain_measured_here"] == pytest.approx(0.1) and out["separate_device"] == pytest.approx(1.1)
    code = out["datasets"]["Code-Search"]
    rho = 1.31 / 1.02 - 1                                   # Table 1 over Table 6, minus one
    assert code["update_seconds_per_inference_second"] == pytest.approx(rho)
    assert code["serial_predicted"] == pytest.approx(1.1 / (1 + rho))
    assert code["serial_break_even_gain"] == pytest.approx(rho)
    assert set(out["datasets"]) == set(PAPER_SPEEDUPS["opt-hydra"])
    assert gpu_prediction(result, "osd") == {}               # no paper row for it
