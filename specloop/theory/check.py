"""`run_theory_check`: a computed verdict on each stated result of OnlineSpec's theory.

Claims (ids are an interface):

* ``acc_equals_one_minus_tv`` -- Acc = 1 - TV (App. D.1), exactly in integer arithmetic
  and for the float64 library functions within 8 V eps.
* ``lemma1_tokens_committed`` -- Lemma 1, both inequalities, n_t = accepted + 1.
* ``lemma1_accepted_only`` -- Lemma 1 with n_t as Algorithm 1 defines it (accepted
  draft tokens only, E[n_t] = (Acc - Acc^(k+1))/(1 - Acc)).
* ``theorem1_lower`` / ``theorem1_upper`` -- Theorem 1 with gamma from Eq. (7).
* ``theorem1_lower_unreachable`` -- Theorem 1's lower bound with Reg_T measured against
  the best draft q_w = softmax(w), ||w||_2 <= D (a ball that cannot match the target).
* ``corollary4_formula`` -- round(Corollary 4's closed form) == exact argmax k.

``worst_ratio`` is bound / true value: for a lower bound the largest ratio over the
cases (holds iff <= 1), for an upper bound the smallest (holds iff >= 1); for the
identity the ratio (1 - TV)/Acc furthest from 1; for corollary4_formula the minimum
efficiency speedup(rounded closed form) / speedup(exact k).

Lemma 1 / Theorem 1 sequences: T rounds of (p_t, q_t) from one family; the exact
E[sum n_t] from the exact Acc_t; Reg_T = sum_t KL(p_t || q_t) (comparator q = p, Eq. (4)).
Vocabularies <= 64 are decided exactly (Fractions and 60-digit mpmath; violation iff
bound > true (1 + 1e-40)); larger ones in float64 (violation iff bound > true (1 + 1e-9)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from specloop.theory import _exact
from specloop.theory._cases import FAMILIES, Case, draw_case, draw_vocab
from specloop.theory._claims import ClaimResult, Tally as _Tally
from specloop.theory._unreachable import run_unreachable
from specloop.theory.acceptance import acceptance_rate, total_variation
from specloop.theory.bounds import lemma1_bounds, theorem1_bounds
from specloop.theory.optimal_k import _speedup_fraction  # exact rational gamma(k)
from specloop.theory.optimal_k import (optimal_k_efficiency, optimal_k_exact, optimal_k_paper,
                                       round_paper_k, speedup_scalar)

__all__ = ["ClaimResult", "CLAIMS", "run_theory_check"]

CLAIMS = ("acc_equals_one_minus_tv", "lemma1_tokens_committed", "lemma1_accepted_only",
          "theorem1_lower", "theorem1_upper", "theorem1_lower_unreachable", "corollary4_formula")
EXACT_RTOL = 1e-40
FLOAT_RTOL = 1e-9
MAX_ROUNDS = 8
MAX_K = 16


def _ratio(bound, true) -> float:
    if true == 0:
        return 1.0 if bound == 0 else math.inf
    return float(bound / true)


def _vectors(cases: list[Case]) -> dict[str, Any]:
    return {"p_target": [c.p_target.tolist() for c in cases],
            "q_draft": [c.q_draft.tolist() for c in cases],
            "p_counts": [c.p_counts.tolist() for c in cases],
            "q_counts": [c.q_counts.tolist() for c in cases],
            "denominator": cases[0].denominator}


def _check_identity(rng, per_family: int) -> ClaimResult:
    tally = _Tally(lower=True)
    worst_dev = 1.0
    for family in FAMILIES:
        for _ in range(per_family):
            case = draw_case(rng, family, draw_vocab(rng))
            exact_ok = _exact.acceptance_exact(case) == 1 - _exact.tv_exact(case)
            acc = float(acceptance_rate(case.p_target, case.q_draft))
            one_minus_tv = 1.0 - float(total_variation(case.p_target, case.q_draft))
            tol = 8 * case.vocab * np.finfo(float).eps
            float_ok = abs(acc - one_minus_tv) <= tol and \
                abs(acc - float(_exact.acceptance_exact(case))) <= tol
            ratio = 1.0 if abs(acc - one_minus_tv) <= tol else _ratio(one_minus_tv, acc)
            if abs(ratio - 1.0) > abs(worst_dev - 1.0):
                worst_dev = ratio
            tally.add(ratio, not (exact_ok and float_ok), (case.vocab,),
                      lambda: {"family": family, "vocab": case.vocab, **_vectors([case]),
                               "acceptance_rate": acc, "one_minus_tv": one_minus_tv}, family)
    tally.worst = worst_dev
    return tally.result("acc_equals_one_minus_tv",
                        "sum_x min(p, q) == 1 - TV(p, q): exact in integer arithmetic; float64 "
                        "library values agree within 8*V*eps",
                        tolerance="8*V*eps (float64)")


@dataclass
class _Sequence:
    family: str
    cases: list[Case]
    num_draft_tokens: int
    cost_ratio: float

    @property
    def rounds(self) -> int:
        return len(self.cases)

    @property
    def vocab(self) -> int:
        return self.cases[0].vocab

    def key(self):
        return (self.rounds * self.vocab, self.num_draft_tokens, self.rounds)


def _draw_sequences(rng, per_family: int) -> list[_Sequence]:
    out = []
    for family in FAMILIES:
        for _ in range(per_family):
            vocab, rounds = draw_vocab(rng), int(rng.integers(1, MAX_ROUNDS + 1))
            cases = [draw_case(rng, family, vocab) for _ in range(rounds)]
            out.append(_Sequence(family, cases, int(rng.integers(1, MAX_K + 1)),
                                 float(10.0 ** rng.uniform(-3.0, 0.0))))
    return out


def _sequence_values(seq: _Sequence) -> dict[str, Any]:
    """Exact E[sum n_t] (both counts), Reg_T, Lemma 1 / Theorem 1 bounds for one sequence."""
    exact = seq.vocab <= _exact.EXACT_VOCAB_LIMIT
    k, t, c = seq.num_draft_tokens, seq.rounds, seq.cost_ratio
    accs = [_exact.acceptance_exact(case) for case in seq.cases]
    committed = sum(_exact.tokens_exact(a, k) for a in accs)
    accepted = committed - t
    if exact:
        with mpmath.workdps(_exact.PRECISION_DIGITS):
            reg = mpmath.fsum(_exact.kl_mp(case) for case in seq.cases)
            denom = 1 + (k + 1) * mpmath.sqrt(reg / (2 * t))
            lower = (k + 1) * t / denom
            cost = mpmath.mpf(c) * k + 1
            values = dict(committed=_exact.to_mpf(committed), accepted=_exact.to_mpf(accepted),
                          reg=reg, lemma_lower=lower, lemma_upper=mpmath.mpf((k + 1) * t),
                          gamma_scale=t * cost, theorem_lower=(k + 1) / (cost * denom),
                          theorem_upper=(k + 1) / cost)
    else:
        reg = math.fsum(_exact.kl_float(case) for case in seq.cases)
        lower, upper = (float(v) for v in lemma1_bounds(reg, t, k))
        theorem_lower, theorem_upper = (float(v) for v in theorem1_bounds(reg, t, k, c))
        values = dict(committed=float(committed), accepted=float(accepted), reg=reg,
                      lemma_lower=lower, lemma_upper=upper, gamma_scale=t * (c * k + 1.0),
                      theorem_lower=theorem_lower, theorem_upper=theorem_upper)
    values["rtol"] = EXACT_RTOL if exact else FLOAT_RTOL
    values["exact"] = exact
    values["accs"] = [float(a) for a in accs]
    return values


def _example(seq: _Sequence, values: dict[str, Any], true, bound) -> dict[str, Any]:
    example = {"family": seq.family, "vocab": seq.vocab, "rounds": seq.rounds,
               "num_draft_tokens": seq.num_draft_tokens, "cost_ratio": seq.cost_ratio,
               "acceptance_rates": values["accs"], "dynamic_regret": float(values["reg"]),
               "true": float(true), "bound": float(bound), "exact_arithmetic": values["exact"]}
    if seq.vocab * seq.rounds <= 64:
        example.update(_vectors(seq.cases))
    return example


def _tally_sequence(seq: _Sequence, tallies: dict[str, Any]) -> int:
    """Add one sequence to the four Lemma 1 / Theorem 1 tallies; 1 if decided exactly."""
    v = _sequence_values(seq)
    rtol, scale = v["rtol"], v["gamma_scale"]
    for name, true, bound in (("lemma1_tokens_committed", v["committed"], v["lemma_lower"]),
                              ("lemma1_accepted_only", v["accepted"], v["lemma_lower"]),
                              ("theorem1_lower", v["committed"] / scale, v["theorem_lower"])):
        upper_ok = true <= (v["lemma_upper"] if name.startswith("lemma") else
                            v["theorem_upper"]) * (1 + rtol)
        violated = bound > true * (1 + rtol) or not upper_ok
        tallies[name].add(_ratio(bound, true), violated, seq.key(),
                          lambda t=true, b=bound: _example(seq, v, t, b), seq.family)
    gamma, upper = v["committed"] / scale, v["theorem_upper"]
    tallies["theorem1_upper"].add(_ratio(upper, gamma), upper < gamma * (1 - rtol), seq.key(),
                                  lambda: _example(seq, v, gamma, upper), seq.family)
    return int(v["exact"])


def _check_lemma_theorem(rng, per_family: int) -> list[ClaimResult]:
    tallies = {name: _Tally(lower=(name != "theorem1_upper")) for name in
               ("lemma1_tokens_committed", "lemma1_accepted_only", "theorem1_lower",
                "theorem1_upper")}
    exact_count = 0
    for seq in _draw_sequences(rng, per_family):
        with mpmath.workdps(_exact.PRECISION_DIGITS):  # comparisons at full precision
            exact_count += _tally_sequence(seq, tallies)
    details = dict(exact_cases=exact_count, float64_cases=tallies["theorem1_upper"].cases -
                   exact_count, exact_rtol=EXACT_RTOL, float64_rtol=FLOAT_RTOL)
    lemma = "(k+1)T/(1+(k+1)sqrt(Reg_T/(2T))) <= E[sum_t n_t] <= (k+1)T, Reg_T = sum KL(p_t||q_t)"
    return [
        tallies["lemma1_tokens_committed"].result(
            "lemma1_tokens_committed", lemma + ", n_t = accepted + 1", **details),
        tallies["lemma1_accepted_only"].result(
            "lemma1_accepted_only", lemma + ", n_t = accepted draft tokens (Algorithm 1)",
            **details),
        tallies["theorem1_lower"].result(
            "theorem1_lower", "gamma = E[sum n_t]/(T(ck+1)) >= (k+1)/((ck+1)(1+(k+1)"
            "sqrt(Reg_T/(2T))))", **details),
        tallies["theorem1_upper"].result(
            "theorem1_upper", "gamma <= (k+1)/(ck+1)", **details),
    ]


def _corollary4_grid() -> tuple[np.ndarray, np.ndarray]:
    accs = np.concatenate([np.round(np.linspace(0.01, 0.99, 99), 2), [0.995, 0.999]])
    ratios = 10.0 ** np.linspace(-3.0, 0.0, 31)
    return accs, ratios


def _less(acc: float, ratio: float, k_a: int, k_b: int) -> bool:
    """gamma(k_a) < gamma(k_b); exact rationals when float64 values are within 1e-12."""
    f_a, f_b = speedup_scalar(acc, k_a, ratio), speedup_scalar(acc, k_b, ratio)
    if abs(f_a - f_b) > 1e-12 * max(f_a, f_b):
        return f_a < f_b
    return (_speedup_fraction(acc, k_a, ratio, "committed")
            < _speedup_fraction(acc, k_b, ratio, "committed"))


def _check_corollary4() -> ClaimResult:
    tally = _Tally(lower=False)
    appendix_matches = mismatches = 0
    worst_case = None
    accs, ratios = _corollary4_grid()
    for acc in accs:
        for ratio in ratios:
            acc, ratio = float(acc), float(ratio)
            k_exact = optimal_k_exact(acc, ratio)
            k_appendix = optimal_k_exact(acc, ratio, "appendix")
            k_paper = optimal_k_paper(acc, ratio)
            k_round = int(round_paper_k(k_paper))
            efficiency = optimal_k_efficiency(acc, ratio)
            appendix_matches += k_round == k_appendix
            example = {"acceptance_rate": acc, "cost_ratio": ratio, "k_exact": k_exact,
                       "k_exact_appendix": k_appendix, "k_paper": k_paper,
                       "k_paper_rounded": k_round, "efficiency": efficiency,
                       "speedup_exact": speedup_scalar(acc, k_exact, ratio),
                       "speedup_paper": speedup_scalar(acc, k_round, ratio)}
            if tally.cases == 0 or efficiency < tally.worst:
                worst_case = example
            suboptimal = k_round != k_exact and _less(acc, ratio, k_round, k_exact)
            mismatches += k_round != k_exact
            tally.add(efficiency, suboptimal, (k_exact, acc, ratio), lambda e=example: e)
    return tally.result(
        "corollary4_formula",
        "round(C/(c(1-Acc))) (nearest, >= 0) maximises gamma(k) = (1-Acc^(k+1))/((1-Acc)(ck+1)) "
        "(exact rational comparison; ties count as optimal); worst_ratio = min efficiency", grid=f"{accs.size} Acc values in [0.01, 0.999] x {ratios.size} cost "
        "ratios log-spaced in [1e-3, 1]", k_mismatches=mismatches,
        appendix_convention_matches=appendix_matches,
        worst_efficiency_case=worst_case)


def run_theory_check(seed: int = 0, cases_per_family: int = 60) -> list[ClaimResult]:
    """Evaluate every claim of `CLAIMS` on generated cases; returns one ClaimResult per claim.

    Args:
        seed: seed of the ``np.random.default_rng`` that draws every case.
        cases_per_family: pairs (identity) or T-round sequences (Lemma 1 / Theorem 1,
            unreachable comparator) drawn per family of `specloop.theory._cases.FAMILIES`.
            corollary4_formula always uses its fixed grid.
    Raises:
        ValueError: cases_per_family < 1.
    """
    if int(cases_per_family) < 1:
        raise ValueError(f"cases_per_family must be >= 1, got {cases_per_family!r}")
    rng = np.random.default_rng(seed)
    results = [_check_identity(rng, cases_per_family)]
    results += _check_lemma_theorem(rng, cases_per_family)
    results.append(run_unreachable(rng, cases_per_family))
    results.append(_check_corollary4())
    return results
