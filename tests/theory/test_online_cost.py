"""The online-update cost model: hand-computed values, break-even consistency, the gain
curve's interpolation and the refusals."""
import math

import pytest

from specloop.theory.online_cost import (GainCurve, background_break_even_gain, background_speedup,
                                         background_update_interval, placement_speedups, separate_device_speedup,
                                         serial_break_even_gain, serial_speedup)

CURVE = GainCurve.from_points([(1, 0.112), (4, 0.056), (16, 0.025)])


def test_gain_curve_passes_through_its_points_and_interpolates_in_log_interval():
    for m, g in [(1, 0.112), (4, 0.056), (16, 0.025)]:
        assert CURVE(m) == pytest.approx(g)
    assert CURVE(2) == pytest.approx((0.112 + 0.056) / 2)         # halfway in log2 between 1 and 4
    assert CURVE(32) == pytest.approx(0.025 + (0.025 - 0.056) / 2)   # the last slope per log2 step, one step on
    assert CURVE(64) == 0.0                                        # two steps on it would be negative
    assert CURVE(1e9) == 0.0                                       # never below 0
    assert GainCurve.from_points([(3, 0.2)])(50) == 0.2


def test_serial_speedup_by_hand_and_its_break_even():
    # v = 0.04 s, d = 0.01 s, u = 0.02 s, g = 0.112: 1.112 * 0.05 / 0.07
    assert serial_speedup(0.04, 0.01, 0.02, 0.112) == pytest.approx(1.112 * 0.05 / 0.07)
    assert serial_speedup(0.04, 0.01, 0.02, 0.112, update_every=4) == pytest.approx(1.112 * 0.05 / 0.055)
    g0 = serial_break_even_gain(0.04, 0.01, 0.02, update_every=2)
    assert g0 == pytest.approx(0.2)
    assert serial_speedup(0.04, 0.01, 0.02, g0, update_every=2) == pytest.approx(1.0)
    assert serial_speedup(0.04, 0.01, 0.0, 0.1) == pytest.approx(1.1)     # free updates: the tau gain itself


def test_background_speedup_by_hand_and_its_break_even():
    # sigma 1.25: round 0.0625 s; an update of 0.25 s lands every 4 rounds -> g = 0.056
    assert background_update_interval(0.04, 0.01, 0.25, 1.25) == pytest.approx(4.0)
    assert background_speedup(0.04, 0.01, 0.25, 1.25, CURVE) == pytest.approx(1.056 / 1.25)
    assert background_update_interval(0.04, 0.01, 0.001, 1.0) == 1.0       # never more than one per round
    sigma = 1 + CURVE(1)
    assert background_break_even_gain(sigma) == pytest.approx(CURVE(1))
    assert background_speedup(0.04, 0.01, 0.01, sigma, CURVE) == pytest.approx(1.0)


def test_separate_device_and_all_placements():
    assert separate_device_speedup(0.04, 0.01, 0.05, CURVE) == pytest.approx(1.112)
    # publishing 0.01 s every 2 updates, updates every 2 rounds: 0.0025 s a round
    assert separate_device_speedup(0.04, 0.01, 0.1, CURVE, 0.01, 2) == pytest.approx(
        (1 + CURVE(2)) * 0.05 / 0.0525)
    out = placement_speedups(0.04, 0.01, 0.02, 1.1, CURVE)
    assert out["serial"] == pytest.approx(serial_speedup(0.04, 0.01, 0.02, 0.112))
    assert out["background_break_even_gain"] == pytest.approx(0.1)
    assert set(out) == {"serial", "serial_break_even_gain", "background", "background_update_interval",
                        "background_break_even_gain", "separate_device", "gain_every_round"}


@pytest.mark.parametrize("call", [
    lambda: serial_speedup(0.0, 0.01, 0.02, 0.1),
    lambda: serial_speedup(0.04, -0.01, 0.02, 0.1),
    lambda: serial_speedup(0.04, 0.01, 0.02, -1.0),
    lambda: serial_speedup(0.04, 0.01, 0.02, 0.1, update_every=0.5),
    lambda: background_speedup(0.04, 0.01, 0.02, 0.9, CURVE),
    lambda: separate_device_speedup(0.04, 0.01, 0.02, CURVE, 0.01, 0),
    lambda: GainCurve.from_points([]),
    lambda: GainCurve.from_points([(0.5, 0.1)]),
    lambda: GainCurve.from_points([(2, 0.1), (2, 0.2)]),
    lambda: GainCurve.from_points([(2, math.nan)]),
    lambda: CURVE(0.5),
])
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError):
        call()


def test_queued_background_by_hand_and_its_break_even():
    from specloop.theory.online_cost import queued_background_speedup, queued_break_even_gain
    # the worker keeps up (u 0.05 < sigma (v + d) 0.0625): the slowdown alone is paid
    assert queued_background_speedup(0.04, 0.01, 0.05, 1.25, 0.112) == pytest.approx(1.112 / 1.25)
    # the worker lags (u 0.1): a chunk takes R u, the decoder idles at its end
    assert queued_background_speedup(0.04, 0.01, 0.1, 1.25, 0.112) == pytest.approx(1.112 * 0.05 / 0.1)
    for u in (0.05, 0.1):
        g0 = queued_break_even_gain(0.04, 0.01, u, 1.25)
        assert queued_background_speedup(0.04, 0.01, u, 1.25, g0) == pytest.approx(1.0)
    assert queued_break_even_gain(0.04, 0.01, 0.1, 1.25) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        queued_background_speedup(0.04, 0.01, 0.1, 0.9, 0.1)
    with pytest.raises(ValueError):
        queued_background_speedup(0.04, 0.01, 0.1, 1.1, -1.0)


def test_implied_update_share_from_two_speedups():
    from specloop.theory.online_cost import implied_update_share, serial_speedup
    out = implied_update_share(1.31, 1.02)
    assert out["update_seconds_per_inference_second"] == pytest.approx(1.31 / 1.02 - 1)
    assert out["update_wall_share"] == pytest.approx(1 - 1.02 / 1.31)
    # round trip through the serial model: S_inf = 1 + g and u / (v + d) = rho give back S_train
    rho = out["update_seconds_per_inference_second"]
    assert serial_speedup(1.0, 0.0, rho, 0.31) == pytest.approx(1.02)
    assert implied_update_share(1.1, 1.1)["update_wall_share"] == 0.0
    with pytest.raises(ValueError, match="exceeds"):
        implied_update_share(1.0, 1.2)
    with pytest.raises(ValueError):
        implied_update_share(0.0, 1.0)
