"""Corollary 1-3 regret bounds: constants, and empirical regret of OGD / ensembles below them."""
from __future__ import annotations

import numpy as np
import pytest

from specloop.theory import (corollary1_regret_bound, corollary2_regret_bound,
                             corollary3_num_base_learners, corollary3_regret_bound,
                             corollary_growth_exponent)

RADIUS = 1.0
DIAMETER = 2 * RADIUS
GRAD = 2 * RADIUS  # f_t(w) = ||w - c_t||^2 / 2 on the ball, c_t in the ball


def _project(w):
    norm = np.linalg.norm(w, axis=-1, keepdims=True)
    return w * np.minimum(1.0, RADIUS / np.maximum(norm, 1e-300))


def _targets(rounds, switches, rng):
    """Piecewise-constant comparators c_t (w*_t = c_t) with ``switches`` jumps."""
    centres = _project(rng.normal(size=(switches + 1, 2)))
    idx = np.minimum(np.arange(rounds) * (switches + 1) // rounds, switches)
    c = centres[idx]
    return c, float(np.linalg.norm(np.diff(c, axis=0), axis=1).sum())


def _ogd(c, eta):
    w, losses = np.zeros((c.shape[1],)), []
    for target in c:
        losses.append(0.5 * np.sum((w - target) ** 2))
        w = _project(w - eta * (w - target))
    return np.array(losses)


def test_corollary1_constants_and_empirical_ogd():
    assert float(corollary1_regret_bound(100, 2.0, 1.0, 3.0)) == pytest.approx(
        1 * 3 * 10 * (1.5 + 2.0))
    t, d, g, p = 400.0, 2.0, 0.5, 3.0
    eta = d / (g * np.sqrt(t))
    assert float(corollary1_regret_bound(t, p, d, g)) == pytest.approx(
        d ** 2 / eta + d * p / eta + eta * g ** 2 * t / 2)
    rng = np.random.default_rng(0)
    for switches in (0, 3, 20):
        c, path = _targets(400, switches, rng)
        regret = _ogd(c, DIAMETER / (GRAD * np.sqrt(400))).sum()  # f_t(w*_t) = 0
        assert regret <= float(corollary1_regret_bound(400, path, DIAMETER, GRAD))


def test_corollary2_constant():
    d, p, delta = 2.0, 3.0, 15.0
    eta = d / np.sqrt(1 + delta)
    assert float(corollary2_regret_bound(100, p, delta, d)) == pytest.approx(
        eta * delta + (d ** 2 + 2 * d * p) / (2 * eta))
    # perfect hints (delta_T = 0): (D + 2 P_T) / 2
    assert float(corollary2_regret_bound(10, 1.0, 0.0, 2.0)) == pytest.approx(2.0)


def test_corollary3_constant_and_empirical_ensemble():
    t = 400
    n = corollary3_num_base_learners(t)
    assert n == int(np.ceil(0.5 * np.log2(1 + 2 * t))) + 1
    rng = np.random.default_rng(1)
    etas = DIAMETER / (GRAD * np.sqrt(t)) * 2.0 ** np.arange(n)
    eps = np.sqrt(8 * np.log(n)) / (GRAD * DIAMETER * np.sqrt(t))
    for switches in (0, 5, 40):
        c, path = _targets(t, switches, rng)
        w = np.zeros((n, 2))
        cumulative, regret = np.zeros(n), 0.0
        for target in c:
            weights = np.exp(-eps * (cumulative - cumulative.min()))
            weights /= weights.sum()
            regret += 0.5 * np.sum((weights @ w - target) ** 2)
            base_losses = 0.5 * np.sum((w - target) ** 2, axis=1)
            cumulative += base_losses
            w = _project(w - etas[:, None] * (w - target))
        assert regret <= float(corollary3_regret_bound(t, path, DIAMETER, GRAD))
    assert float(corollary3_regret_bound(t, 0.0, 1.0, 1.0)) == pytest.approx(
        1.5 * np.sqrt(t) + np.sqrt(t * np.log(n) / 2))


@pytest.mark.parametrize("name, growth, expected", [
    ("corollary1", 0.0, 0.5), ("ogd", 0.25, 0.75), ("corollary1", 1.0, 1.0),
    ("corollary3", 0.0, 0.5), ("ensemble", 1.0, 1.0), ("corollary3", 0.5, 0.75),
])
def test_growth_exponents(name, growth, expected):
    assert corollary_growth_exponent(name, growth) == pytest.approx(expected)


def test_growth_exponent_optimistic_and_uncapped():
    assert corollary_growth_exponent("corollary2", 0.0, hint_error_growth=0.0) == 0.0
    assert corollary_growth_exponent("optimistic", 0.2, hint_error_growth=1.0) == pytest.approx(0.7)
    assert corollary_growth_exponent("ogd", 1.0, cap_at_linear=False) == 1.5


def test_regret_bounds_reject_bad_input():
    with pytest.raises(ValueError, match="unknown corollary"):
        corollary_growth_exponent("corollary9", 0.0)
    with pytest.raises(ValueError, match="path_length_growth"):
        corollary_growth_exponent("ogd", 1.5)
    with pytest.raises(ValueError, match="rounds"):
        corollary1_regret_bound(0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="path_length"):
        corollary3_regret_bound(10, -1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="hint_error"):
        corollary2_regret_bound(10, 1.0, np.nan, 1.0)
    with pytest.raises(ValueError, match="gradient_bound"):
        corollary1_regret_bound(10, 1.0, 1.0, -2.0)
