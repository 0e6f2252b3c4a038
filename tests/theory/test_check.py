"""`run_theory_check`: every claim evaluated, verdicts computed, counterexamples real."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import minimize

from specloop.theory import CLAIMS, run_theory_check
from specloop.theory._cases import FAMILIES, draw_case, to_counts
from specloop.theory._exact import acceptance_exact, kl_float, kl_mp, tokens_exact
from specloop.theory._unreachable import (best_in_ball, certified_min_cross_entropy,
                                          cross_entropy)
from specloop.theory.optimal_k import optimal_k_paper, round_paper_k, speedup_scalar


@pytest.fixture(scope="module")
def results():
    return {r.claim: r for r in run_theory_check(seed=3, cases_per_family=6)}


def test_every_claim_reported_with_fields(results):
    assert list(results) == list(CLAIMS)
    for r in results.values():
        assert r.cases > 0 and 0 <= r.violations <= r.cases
        assert r.holds == (r.violations == 0)
        assert (r.counterexample is None) == r.holds
        assert not math.isnan(r.worst_ratio)
        assert set(r.to_dict()) >= {"claim", "holds", "cases", "violations", "worst_ratio",
                                    "counterexample"}


def test_sound_claims_hold(results):
    for claim in ("acc_equals_one_minus_tv", "lemma1_tokens_committed", "theorem1_lower",
                  "theorem1_upper"):
        assert results[claim].holds, results[claim].counterexample
    assert results["lemma1_tokens_committed"].worst_ratio <= 1.0 + 1e-9  # float64 cases: rtol 1e-9
    assert results["theorem1_lower"].worst_ratio <= 1.0 + 1e-9
    assert results["theorem1_upper"].worst_ratio >= 1.0 - 1e-9


def test_accepted_only_counterexample_is_real(results):
    r = results["lemma1_accepted_only"]
    assert not r.holds and r.worst_ratio > 1.0
    ex = r.counterexample
    k, t = ex["num_draft_tokens"], ex["rounds"]
    # recompute independently from the exact counts
    accs = [Fraction(int(np.minimum(p, q).sum()), ex["denominator"])
            for p, q in zip(ex["p_counts"], ex["q_counts"])]
    accepted = sum(sum(a ** j for j in range(1, k + 1)) for a in accs)
    bound = (k + 1) * t / (1 + (k + 1) * math.sqrt(ex["dynamic_regret"] / (2 * t)))
    assert float(accepted) == pytest.approx(ex["true"]) and bound > float(accepted)


def test_unreachable_counterexample_is_real(results):
    r = results["theorem1_lower_unreachable"]
    assert not r.holds
    ex = r.counterexample
    assert ex["bound"] > ex["true"] and ex["dynamic_regret"] >= 0


def test_corollary4_verdict_matches_direct_evaluation(results):
    r = results["corollary4_formula"]
    ex = r.counterexample
    acc, ratio = ex["acceptance_rate"], ex["cost_ratio"]
    k_round = int(round_paper_k(optimal_k_paper(acc, ratio)))
    assert speedup_scalar(acc, k_round, ratio) < speedup_scalar(acc, ex["k_exact"], ratio)
    assert 0 < r.worst_ratio <= 1 and r.details["k_mismatches"] >= r.violations


def test_seed_determinism():
    a = run_theory_check(seed=11, cases_per_family=1)
    b = run_theory_check(seed=11, cases_per_family=1)
    assert [x.to_dict() for x in a] == [y.to_dict() for y in b]


def test_rejects_bad_case_count():
    with pytest.raises(ValueError, match="cases_per_family"):
        run_theory_check(cases_per_family=0)


def test_cases_are_exact_distributions():
    rng = np.random.default_rng(0)
    for family in FAMILIES:
        for _ in range(5):
            case = draw_case(rng, family, int(rng.integers(2, 40)))
            assert case.p_counts.sum() == case.q_counts.sum() == case.denominator
            assert (case.p_counts >= 0).all() and (case.q_counts >= 0).all()
            acc = acceptance_exact(case)
            if family == "equal":
                assert acc == 1
            if family == "disjoint":
                assert acc == 0 and math.isinf(kl_float(case))
            if family == "q_missing_support":
                assert math.isinf(kl_float(case))
            if math.isfinite(kl_float(case)):
                assert float(kl_mp(case)) == pytest.approx(kl_float(case), rel=1e-9, abs=1e-15)
    np.testing.assert_array_equal(to_counts(np.array([0.5, 0.0, 0.5]), 7), [4, 0, 3])
    assert tokens_exact(Fraction(1, 2), 2) == Fraction(7, 4)


def test_ball_comparator_and_certificate():
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(6) * 0.2)
    radius = 1.0
    w = best_in_ball(p, radius)
    assert np.linalg.norm(w) <= radius + 1e-12
    con = {"type": "ineq", "fun": lambda v: radius ** 2 - v @ v}
    ref = minimize(lambda v: float(cross_entropy(p, v)), np.zeros(6), constraints=[con],
                   method="SLSQP", options={"ftol": 1e-12, "maxiter": 500})
    lower = float(certified_min_cross_entropy(p, w, radius))
    assert lower <= ref.fun + 1e-9 and float(cross_entropy(p, w)) <= ref.fun + 1e-6
    assert float(cross_entropy(p, w)) - lower < 1e-4
