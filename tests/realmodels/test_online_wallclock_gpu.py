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


def test_what_would_pay_scales_only_the_step_with_the_interval():
    from benchmarks.online_wallclock import TARGET_SPEEDUP, what_would_pay
    from specloop.theory.online_cost import GainCurve
    check = {"serial": {"placement": "serial", "verify_plus_draft_seconds_per_round": 1.0, "gain": 0.1,
                        "decoder_online_seconds_per_round": 0.05, "update_seconds_per_step": 0.2,
                        "steps_per_round": 1.0}}
    out = what_would_pay(check, GainCurve.from_points([(1, 0.1), (4, 0.05)]), intervals=(1, 4))
    assert out["update_share_of_round"] == pytest.approx(0.25)
    assert out["update_share_needed"] == pytest.approx(1.1 / TARGET_SPEEDUP - 1)
    assert out["by_interval_measured_gain"][4] == pytest.approx(1.1 / (1 + 0.05 + 0.05))
    assert out["by_interval_replay_curve"][4] == pytest.approx(1.05 / 1.1)
    assert what_would_pay({}) == {}


def test_update_every_and_ensemble_losses_enter_the_settings_only_when_not_default():
    from benchmarks.online_wallclock import _online_settings, _parser
    assert _online_settings(_parser().parse_args([])) == {"mode": "round"}     # as runs before the flag
    assert _online_settings(_parser().parse_args(["--update-every", "8"])) == {"mode": "round", "update_every": 8}
    linearised = _parser().parse_args(["--method", "ens-eagle3", "--ensemble-losses", "linearised"])
    assert _online_settings(linearised) == {"mode": "round", "ensemble_losses": "linearised"}
    assert _online_settings(_parser().parse_args(["--ensemble-losses", "exact"])) == {"mode": "round"}
