"""LookupLength: cost-optimal candidate length from learned positional acceptance."""
from __future__ import annotations

import numpy as np
import pytest

from specloop.strategies.lookup_length import LookupLength
from specloop.theory.tokens import expected_tokens_positional


def brute_force(rates, cost, top):
    values = [expected_tokens_positional(np.asarray(rates[:L])) / cost[min(L + 1, len(cost)) - 1]
              for L in range(top + 1)]
    return int(np.argmax(values))


def test_flat_cost_drafts_everything_and_steep_cost_drafts_nothing():
    flat = LookupLength([1.0] * 12, max_length=8)
    assert flat.choose("k", 5) == 5 and flat.choose("k", 20) == 8 and flat.choose("k", 0) == 0
    steep = LookupLength([1.0, 3.0, 5.0], max_length=8)      # a second token triples the cost
    assert steep.choose("k", 8) == 0


def test_choice_is_the_brute_force_optimum_of_the_posterior_rates():
    rng = np.random.default_rng(0)
    cost = np.cumsum(rng.uniform(0.05, 0.4, size=10)) + 1.0
    model = LookupLength(cost, max_length=8, prior=(2.0, 1.0))
    for _ in range(300):
        key = int(rng.integers(1, 4))
        drafted = int(rng.integers(0, 9))
        model.update(key, drafted, int(rng.integers(0, drafted + 1)))
    for key in (1, 2, 3, "never seen"):
        for top in (0, 1, 3, 8, 12):
            assert model.choose(key, top) == brute_force(model.acceptance_rates(key), cost, min(top, 8))


def test_update_counts_only_tested_positions():
    model = LookupLength([1.0, 1.1], max_length=4, prior=(1.0, 1.0))
    model.update(3, drafted=4, accepted=1)       # position 1 accepted, 2 rejected, 3-4 never tested
    assert model.trials[3].tolist() == [1, 1, 0, 0] and model.accepted[3].tolist() == [1, 0, 0, 0]
    model.update(3, drafted=2, accepted=2)       # both accepted (the bonus is not a draft position)
    assert model.trials[3].tolist() == [2, 2, 0, 0] and model.accepted[3].tolist() == [2, 1, 0, 0]
    np.testing.assert_allclose(model.acceptance_rates(3), [3 / 4, 2 / 4, 1 / 2, 1 / 2])
    model.update(3, drafted=0, accepted=0)
    assert model.trials[3].tolist() == [2, 2, 0, 0]
    state = model.state_dict()
    other = LookupLength([1.0, 1.1], max_length=4)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.acceptance_rates(3), model.acceptance_rates(3))
    model.update(3, 1, 1)                        # the saved state is a copy
    assert state["trials"][3].tolist() == [2, 2, 0, 0]


def test_bad_input_is_refused_and_the_cost_table_is_not_mutated():
    cost = np.array([1.0, 2.0])
    LookupLength(cost).choose(1, 3)
    assert cost.tolist() == [1.0, 2.0]
    for bad in ([], [1.0, np.nan], [0.0, 1.0], [[1.0]]):
        with pytest.raises(ValueError, match="verify_cost"):
            LookupLength(bad)
    with pytest.raises(ValueError, match="max_length"):
        LookupLength([1.0], max_length=0)
    with pytest.raises(ValueError, match="prior"):
        LookupLength([1.0], prior=(0.0, 1.0))
    model = LookupLength([1.0])
    with pytest.raises(ValueError, match="available"):
        model.choose(1, -1)
    with pytest.raises(ValueError, match="accepted"):
        model.update(1, drafted=2, accepted=3)
