"""The verdict rule of `specloop.report.verdicts`: constructed samples on
each side of the claimed size, and the intervals it is given."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from specloop.report.verdicts import (DOES_NOT_HOLD, HOLDS, UNDECIDED, all_of, decide, difference_estimate,
                                      measured_claim, ratio_estimate, verdict_of)


def _ratios(centre: float, spread: float, n: int = 8) -> list[float]:
    """n ratios whose logs are centre's log +- spread (symmetric, fixed)."""
    offsets = np.linspace(-spread, spread, n)
    return list(np.exp(np.log(centre) + offsets))


@pytest.mark.parametrize("centre, expected", [(1.40, HOLDS), (1.20, DOES_NOT_HOLD), (1.30, UNDECIDED)])
def test_ratio_claim_with_a_size_on_each_side_of_the_boundary(centre, expected):
    """Claim '>= 1.3x': tight samples around 1.40 hold, around 1.20 do not, around
    1.30 are undecided."""
    est = ratio_estimate(_ratios(centre, 0.02), "constructed")
    assert est.n == 8 and est.interval[0] < est.effect < est.interval[1]
    assert decide(est.effect, est.interval, est.n, claimed_size=1.3, null=1.0) == expected


def test_the_interval_not_the_point_estimate_decides():
    """Two samples with the same geometric mean 1.05 above 1.0: tight -> holds, wide ->
    undecided (the old rule called both 'holds' from the means alone)."""
    tight, wide = ratio_estimate(_ratios(1.05, 0.01), "t"), ratio_estimate(_ratios(1.05, 0.3), "w")
    assert tight.effect == pytest.approx(wide.effect) == pytest.approx(1.05)
    assert decide(tight.effect, tight.interval, tight.n, null=1.0) == HOLDS
    assert decide(wide.effect, wide.interval, wide.n, null=1.0) == UNDECIDED


def test_interval_just_inside_and_just_outside_the_threshold():
    assert decide(1.1, (1.0001, 1.2), 5, null=1.0) == HOLDS
    assert decide(1.1, (0.9999, 1.2), 5, null=1.0) == UNDECIDED
    assert decide(0.9, (0.8, 0.9999), 5, null=1.0) == DOES_NOT_HOLD
    assert decide(1.25, (1.2, 1.3), 5, claimed_size=1.3, null=1.0) == UNDECIDED   # touches 1.3
    assert decide(1.25, (1.2, 1.2999), 5, claimed_size=1.3, null=1.0) == DOES_NOT_HOLD


def test_direction_less_mirrors_greater():
    assert decide(-3.0, (-4.0, -2.0), 6, direction="less") == HOLDS
    assert decide(3.0, (2.0, 4.0), 6, direction="less") == DOES_NOT_HOLD
    assert decide(0.5, (-1.0, 2.0), 6, direction="less") == UNDECIDED


def test_no_interval_is_undecided():
    assert decide(2.0, (math.nan, math.nan), 1, null=1.0) == UNDECIDED
    assert decide(2.0, (1.5, 2.5), 1, null=1.0) == UNDECIDED        # n < 2
    one = ratio_estimate([1.5], "one pair")
    assert one.n == 1 and math.isnan(one.interval[0]) and math.isnan(one.interval[1])
    assert decide(one.effect, one.interval, one.n, null=1.0) == UNDECIDED


@pytest.mark.parametrize("kwargs, match", [
    ({"direction": "up"}, "direction"), ({"interval": (2.0, 1.0)}, "lo <= hi"),
    ({"n": -1}, "n must be"), ({"effect": 5.0}, "outside")])
def test_bad_input_raises(kwargs, match):
    args = {"effect": 1.5, "interval": (1.0, 2.0), "n": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        decide(**args)


def test_ratio_estimate_is_the_streams_interval():
    """The same t interval on log ratios as `specloop.stats.paired_gain` (reused)."""
    from specloop.stats import paired_gain
    frozen = [{"index": i, "rounds": 10, "tokens": t} for i, t in enumerate((20, 25, 18, 30, 22))]
    online = [{"index": i, "rounds": 10, "tokens": t} for i, t in enumerate((22, 24, 21, 33, 23))]
    gain = paired_gain(frozen, online)
    est = ratio_estimate([o["tokens"] / f["tokens"] for f, o in zip(frozen, online)], "tau ratio")
    assert est.effect - 1 == pytest.approx(gain["gain"])
    assert [x - 1 for x in est.interval] == pytest.approx(gain["gain_ci"])
    with pytest.raises(ValueError, match="positive"):
        ratio_estimate([1.0, 0.0], "x")
    with pytest.raises(ValueError, match="positive"):
        ratio_estimate([], "x")


def test_difference_estimate_t_interval():
    est = difference_estimate([1.0, 2.0, 3.0], "seeds")
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert est.effect == 2.0 and est.n == 3
    assert est.interval == pytest.approx((2.0 - half, 2.0 + half))
    assert math.isnan(difference_estimate([4.0], "one seed").interval[0])
    assert difference_estimate([0.5, 0.5], "equal").interval == (0.5, 0.5)
    with pytest.raises(ValueError, match="confidence"):
        difference_estimate([1.0, 2.0], "x", confidence=1.0)


def test_measured_claim_fields_and_missing_samples():
    est = ratio_estimate(_ratios(1.4, 0.02), "paired per-prompt ratio")
    claim = measured_claim("c", "s", est, null=1.0, claimed_size=1.3, evidence="e")
    assert claim["verdict"] == HOLDS and claim["holds"] is True and claim["measured"] is True
    assert claim["n"] == 8 and claim["threshold"] == 1.3 and len(claim["interval"]) == 2
    assert "95 % interval" in claim["statistic"]
    missing = measured_claim("c", "s", None, null=1.0, why_missing="no pairs")
    assert missing["verdict"] == UNDECIDED and missing["holds"] is None and missing["n"] == 0
    assert missing["evidence"] == "no pairs"
    assert verdict_of(missing) == UNDECIDED and verdict_of({"holds": False}) == DOES_NOT_HOLD
    assert verdict_of({"holds": True}) == HOLDS and verdict_of({"holds": None}) == UNDECIDED


def test_all_of_needs_every_part():
    def part(centre):
        return measured_claim("p", "s", ratio_estimate(_ratios(centre, 0.01), f"at {centre}"), null=1.0)
    both = all_of("c", "s", [("a", part(1.3)), ("b", part(1.1))])
    assert both["verdict"] == HOLDS and both["effect"] == pytest.approx(1.1)   # the closer one shown
    mixed = all_of("c", "s", [("a", part(1.3)), ("b", part(1.0))])
    assert mixed["verdict"] == UNDECIDED and "shown: b" in mixed["statistic"]
    failing = all_of("c", "s", [("a", part(1.3)), ("b", part(1.0)), ("c", part(0.8))])
    assert failing["verdict"] == DOES_NOT_HOLD and failing["effect"] == pytest.approx(0.8)
    assert failing["evidence"].startswith("1 holds, 1 does not hold, 1 undecided")
    with pytest.raises(ValueError, match="no comparisons"):
        all_of("c", "s", [])
