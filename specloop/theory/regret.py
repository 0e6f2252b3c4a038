"""Dynamic-regret bounds of OnlineSpec Corollaries 1-3 with explicit constants.

Notation: T = ``rounds``, P_T = ``path_length`` = sum_t ||w*_{t+1} - w*_t||_2,
D = ``diameter`` of the domain W, G = ``gradient_bound`` (Assumption 2),
delta_T = ``hint_error`` = sum_t ||h_t - grad f_t(w_t)||_2^2 (Corollary 2).
All values are in the loss's units (nats for cross-entropy), vectorised (broadcast).
"""
from __future__ import annotations

import math

import numpy as np

from specloop.theory._validation import validate_nonnegative

__all__ = ["corollary1_regret_bound", "corollary2_regret_bound", "corollary3_regret_bound",
           "corollary3_num_base_learners", "corollary_growth_exponent"]


def _common(rounds, path_length, diameter):
    t = validate_nonnegative(rounds, "rounds")
    if (t < 1).any():
        raise ValueError("rounds (T) must be >= 1")
    p = validate_nonnegative(path_length, "path_length")
    d = validate_nonnegative(diameter, "diameter")
    return t, p, d


def corollary1_regret_bound(rounds, path_length, diameter, gradient_bound) -> np.ndarray:
    """OGD (Corollary 1, proof Appendix D.3): Reg_T <= D^2/eta + D P_T/eta + eta G^2 T/2.

    Evaluated at the proof's step size eta = D / (G sqrt(T)):
    Reg_T <= G sqrt(T) (3 D / 2 + P_T). Note: the paper's last line writes the middle
    term as D G sqrt(T) P_T, an algebra slip (D P_T / eta = G sqrt(T) P_T); the two agree
    only for D = 1. (The proof's telescoping also gives the smaller D^2/(2 eta) for the
    first term; we keep the expression the paper states.) With G = 0 the bound is 0;
    D = 0 (a single point) gives 0 as well since then P_T = 0.

    Raises:
        ValueError: T < 1, or any argument negative / NaN / infinite.
    """
    t, p, d = _common(rounds, path_length, diameter)
    g = validate_nonnegative(gradient_bound, "gradient_bound")
    return g * np.sqrt(t) * (1.5 * d + p)


def corollary2_regret_bound(rounds, path_length, hint_error, diameter) -> np.ndarray:
    """Optimistic OGD (Corollary 2, proof Appendix D.4): Reg_T <= eta delta_T + (D^2 + 2 D P_T)/(2 eta).

    Evaluated at the proof's eta = D / sqrt(1 + delta_T):
    Reg_T <= D delta_T / sqrt(1 + delta_T) + (D + 2 P_T) sqrt(1 + delta_T) / 2.
    ``rounds`` is validated but does not enter the bound (the paper's bound has no T).

    Raises:
        ValueError: T < 1, or any argument negative / NaN / infinite.
    """
    _, p, d = _common(rounds, path_length, diameter)
    delta = validate_nonnegative(hint_error, "hint_error")
    root = np.sqrt(1.0 + delta)
    return d * delta / root + (d + 2.0 * p) * root / 2.0


def corollary3_num_base_learners(rounds) -> int:
    """N = ceil(log2(1 + 2T) / 2) + 1 base learners (our derivation, see corollary3_regret_bound)."""
    t = float(rounds)
    if not t >= 1:
        raise ValueError(f"rounds (T) must be >= 1, got {rounds!r}")
    return int(math.ceil(0.5 * math.log2(1.0 + 2.0 * t))) + 1


def corollary3_regret_bound(rounds, path_length, diameter, gradient_bound) -> np.ndarray:
    """Online ensemble (Corollary 3, proof Appendix D.5) with a constant DERIVED BY US.

    The paper states only O(sqrt(T (1 + P_T))). Our constant follows the analysis of
    Zhao et al. 2024 (online ensemble: OGD base learners + Hedge meta learner):

    * base learner with step eta: Reg <= (D^2 + 2 D P_T)/(2 eta) + eta G^2 T / 2
      (the telescoping of Appendix D.3); the optimal eta* = sqrt((D^2 + 2 D P_T)/(G^2 T))
      lies in [D/(G sqrt T), D sqrt(1 + 2T)/(G sqrt T)] because P_T <= D T;
    * the geometric grid eta_i = 2^(i-1) D / (G sqrt T), i = 1..N with
      N = ceil(log2(1 + 2T)/2) + 1 (the paper uses log2(1 + T), which can miss the top
      of that range by a factor sqrt 2) holds an eta_i in [eta*/2, eta*], giving
      Reg_i <= (3/2) G sqrt(T (D^2 + 2 D P_T));
    * Hedge on the losses f_t(w_t^i) (range <= G D per round by Lipschitzness), uniform
      prior, eps = sqrt(8 ln N)/(G D sqrt T), combined by convexity
      (f_t(sum_i p_i w_i) <= sum_i p_i f_t(w_i)): meta regret <= G D sqrt(T ln(N) / 2).

    Total: Reg_T <= (3/2) G sqrt(T (D^2 + 2 D P_T)) + G D sqrt(T ln(N) / 2).

    Raises:
        ValueError: T < 1, or any argument negative / NaN / infinite.
    """
    t, p, d = _common(rounds, path_length, diameter)
    g = validate_nonnegative(gradient_bound, "gradient_bound")
    n = np.vectorize(corollary3_num_base_learners, otypes=[np.float64])(t)
    return 1.5 * g * np.sqrt(t * (d * d + 2.0 * d * p)) + g * d * np.sqrt(t * np.log(n) / 2.0)


_ALIASES = {"corollary1": "corollary1", "ogd": "corollary1",
            "corollary2": "corollary2", "optimistic": "corollary2", "optimistic_ogd": "corollary2",
            "corollary3": "corollary3", "ensemble": "corollary3"}


def corollary_growth_exponent(name: str, path_length_growth: float,
                              hint_error_growth: float = 1.0,
                              cap_at_linear: bool = True) -> float:
    """Predicted exponent e in Reg_T = O(T^e) when P_T = Theta(T^b), b = ``path_length_growth``.

    * corollary1 / ogd: sqrt(T)(1 + P_T)             -> e = 1/2 + b
    * corollary2 / optimistic: sqrt(1 + delta_T)(1 + P_T), delta_T = Theta(T^h)
      (h = ``hint_error_growth``; worst case h = 1 since delta_T <= 4 G^2 T) -> e = h/2 + b
    * corollary3 / ensemble: sqrt(T (1 + P_T))        -> e = (1 + b)/2

    Example: OGD with P_T = O(1) gives 0.5. With ``cap_at_linear`` (default) the value is
    capped at 1, since with bounded losses Reg_T <= G D T always (the bound is then vacuous).

    Raises:
        ValueError: unknown name; b or h outside [0, 1] or NaN.
    """
    key = _ALIASES.get(str(name).lower())
    if key is None:
        raise ValueError(f"unknown corollary {name!r}; expected one of {sorted(_ALIASES)}")
    for label, value in (("path_length_growth", path_length_growth),
                         ("hint_error_growth", hint_error_growth)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{label} must lie in [0, 1] (P_T <= D T, delta_T <= 4 G^2 T), "
                             f"got {value!r}")
    b, h = float(path_length_growth), float(hint_error_growth)
    exponent = {"corollary1": 0.5 + b, "corollary2": 0.5 * h + b, "corollary3": 0.5 * (1 + b)}[key]
    return min(exponent, 1.0) if cap_at_linear else exponent
