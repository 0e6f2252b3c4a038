"""The ensembles' base losses: "exact" (each base learner's own f_t and gradient through
the oracle, or one ``oracle.many`` call for all of them) and "linearised" (the Ader /
Sword++ surrogate, one gradient a round), and what each declares about the played
point's gradient."""
from __future__ import annotations

import numpy as np
import pytest

from specloop.strategies import HedgeEnsemble, OptimisticEnsemble, geometric_learning_rates
from specloop.strategies.precondition import Preconditioned
from specloop.strategies.registry import learner_from_name, uses_played_gradient
from tests.strategies.test_learners import FEATURES, RADIUS, VOCAB, ce_oracle

RATES = geometric_learning_rates(0.05, 4)


def _start():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(VOCAB, FEATURES)) * 0.1, np.zeros(VOCAB)]


def _run(ens, oracle_of, rounds=6):
    w = _start()
    for _ in range(rounds):
        loss, g = ce_oracle(w)
        w = ens.step(w, g, loss, oracle=oracle_of())
    return w


@pytest.mark.parametrize("cls", [HedgeEnsemble, OptimisticEnsemble])
def test_oracle_many_gives_the_per_point_oracle_result_in_one_call(cls):
    calls = {"many": 0}

    def with_many():
        def oracle(values):
            raise AssertionError("the per-point oracle is not called when many() exists")

        def many(points):
            calls["many"] += 1
            got = [ce_oracle(p) for p in points]
            return [loss for loss, _ in got], [g for _, g in got]
        oracle.many = many
        return oracle

    a = _run(cls(RATES, RADIUS, 2.0), lambda: ce_oracle)
    b_ens = cls(RATES, RADIUS, 2.0)
    b = _run(b_ens, with_many)
    assert calls["many"] == 6
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_linearised_never_calls_the_oracle_and_equals_the_surrogate():
    def never(values):
        raise AssertionError("a linearised ensemble called its oracle")
    lin = _run(HedgeEnsemble(RATES, RADIUS, 2.0, base_losses="linearised"), lambda: never)
    surrogate = _run(HedgeEnsemble(RATES, RADIUS, 2.0), lambda: None)   # no oracle: the surrogate
    for x, y in zip(lin, surrogate):
        np.testing.assert_array_equal(x, y)
    exact = _run(HedgeEnsemble(RATES, RADIUS, 2.0), lambda: ce_oracle)
    assert any(not np.array_equal(x, y) for x, y in zip(lin, exact))


def test_played_gradient_declarations():
    assert not uses_played_gradient(HedgeEnsemble(RATES))
    assert not uses_played_gradient(OptimisticEnsemble(RATES))
    assert uses_played_gradient(HedgeEnsemble(RATES, base_losses="linearised"))
    assert uses_played_gradient(Preconditioned(HedgeEnsemble(RATES)))     # v folds played gradients
    assert uses_played_gradient(learner_from_name("ogd", 0.1))
    assert not uses_played_gradient(learner_from_name("osd", 0.1))        # learns from rejections
    ens = learner_from_name("ensemble", 0.1, ensemble_losses="linearised")
    assert ens.base_losses == "linearised"


def test_bad_base_losses_and_mismatched_state():
    with pytest.raises(ValueError, match="base_losses must be one of"):
        HedgeEnsemble(RATES, base_losses="approximate")
    exact = HedgeEnsemble(RATES)
    _run(exact, lambda: ce_oracle, rounds=2)
    with pytest.raises(ValueError, match="'exact' base losses"):
        HedgeEnsemble(RATES, base_losses="linearised").load_state_dict(exact.state_dict())
    state = exact.state_dict()
    del state["base_losses"]                   # a state saved before the option: exact
    HedgeEnsemble(RATES).load_state_dict(state)

    def short_many(values):
        raise AssertionError

    short_many.many = lambda points: ([1.0], [ce_oracle(points[0])[1]])
    w = _start()
    with pytest.raises(ValueError, match="oracle.many returned 1 losses"):
        HedgeEnsemble(RATES).step(w, ce_oracle(w)[1], 1.0, oracle=short_many)
