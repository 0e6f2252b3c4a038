"""Lemma 1 and Theorem 1 of OnlineSpec: tokens and speedup bounds from a regret value.

Lemma 1 (Section 2.2, proof in Appendix D.1), for T rounds of a chain of k drafts
under Assumption 1, with E[|x|] = sum_t E[n_t] counted as committed tokens:

    (k+1) T / (1 + (k+1) sqrt(Reg_T / (2T)))  <=  E[|x|]  <=  (k+1) T.

Theorem 1 (proof in Appendix D.2) divides by T (cost_ratio k + 1) (Eq. (7)):

    (k+1) / ((cost_ratio k + 1)(1 + (k+1) sqrt(Reg_T/(2T))))  <=  gamma  <=  (k+1)/(cost_ratio k + 1).

The lower bound assumes Reg_T is measured against comparators that match the target
exactly (q_{w*_t} = p_t, so that Reg_T = sum_t KL(p_t || q_t), Eq. (4)); with a weaker
comparator the bound can fail (see `specloop.theory.check`, claim
``theorem1_lower_unreachable``).
"""
from __future__ import annotations

import numpy as np

from specloop.theory._validation import validate_nonnegative, validate_num_draft_tokens

__all__ = ["lemma1_bounds", "theorem1_bounds"]


def _rounds(rounds) -> np.ndarray:
    t = np.asarray(rounds, dtype=np.float64)
    if np.isnan(t).any() or (t < 1).any() or np.isinf(t).any():
        raise ValueError(f"rounds (T) must be finite and >= 1, got {t.ravel()[0]!r}"
                         if t.size else "rounds (T) must be non-empty")
    return t


def _denominator(dynamic_regret, rounds, num_draft_tokens):
    reg = validate_nonnegative(dynamic_regret, "dynamic_regret", allow_inf=True)
    t = _rounds(rounds)
    k = validate_num_draft_tokens(num_draft_tokens)
    return 1.0 + (k + 1.0) * np.sqrt(reg / (2.0 * t)), t, k


def lemma1_bounds(dynamic_regret, rounds, num_draft_tokens) -> tuple[np.ndarray, np.ndarray]:
    """Lemma 1: bounds on E[|x|] = sum over the T rounds of E[n_t] (committed tokens).

    Args:
        dynamic_regret: Reg_T >= 0 (nats, summed over the T rounds; inf allowed -> lower 0).
        rounds: T >= 1.
        num_draft_tokens: k >= 0 (tokens).
    Returns:
        (lower, upper) float64 arrays in tokens over the whole T rounds.
    Raises:
        ValueError: Reg_T < 0 or NaN; T < 1; k < 0.
    """
    denom, t, k = _denominator(dynamic_regret, rounds, num_draft_tokens)
    upper = (k + 1.0) * t
    return upper / denom, np.broadcast_to(upper, np.shape(denom)).astype(np.float64)


def theorem1_bounds(dynamic_regret, rounds, num_draft_tokens,
                    cost_ratio) -> tuple[np.ndarray, np.ndarray]:
    """Theorem 1: bounds on the speedup gamma (dimensionless).

    Args:
        dynamic_regret: Reg_T >= 0 (nats); rounds: T >= 1; num_draft_tokens: k >= 0;
        cost_ratio: a / A >= 0.
    Returns:
        (lower, upper) float64 arrays.
    Raises:
        ValueError: as `lemma1_bounds`, and cost_ratio < 0 or NaN.
    """
    denom, _, k = _denominator(dynamic_regret, rounds, num_draft_tokens)
    ratio = validate_nonnegative(cost_ratio, "cost_ratio")
    upper = (k + 1.0) / (ratio * k + 1.0)
    return upper / denom, np.broadcast_to(upper, np.broadcast_shapes(np.shape(upper),
                                                                      np.shape(denom))).astype(float)
