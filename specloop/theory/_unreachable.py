"""Claim ``theorem1_lower_unreachable``: Theorem 1 when the comparator cannot match p.

Drafts are q_w = softmax(w) with w in the ball W = {||w||_2 <= D}. The comparator of
round t is w*_t = argmin_{w in W} f_t(w), f_t(w) = CE(p_t, q_w) = logsumexp(w) - <p_t, w>
(the cross-entropy of Assumption 1); the learner plays w_t in W (w*_t plus noise,
projected). Reg_T = sum_t f_t(w_t) - f_t(w*_t) >= 0 is then far smaller than
sum_t KL(p_t || q_t) whenever the ball cannot reach p_t, and Theorem 1's lower bound,
evaluated with this Reg_T, can exceed the true speedup.

Certified regret: w*_t is found by accelerated projected gradient (FISTA); since f_t is
convex, f_t(w*) >= f_t(v) - <g, v> - D ||g||_2 for any v in W, g = grad f_t(v) (the
Frank-Wolfe gap), so we use this lower bound of min f_t. The Reg_T we report is
therefore >= the true one, which makes the bound we test *smaller*: a violation found
this way is a real one. Float64, violation iff bound > gamma (1 + 1e-9).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp, softmax

from specloop.theory._cases import FAMILIES, draw_case
from specloop.theory._claims import ClaimResult, Tally
from specloop.theory.acceptance import acceptance_rate
from specloop.theory.bounds import theorem1_bounds
from specloop.theory.tokens import expected_tokens_chain

__all__ = ["best_in_ball", "certified_min_cross_entropy", "run_unreachable"]

RTOL = 1e-9
MAX_VOCAB = 50
MAX_ROUNDS = 8
MAX_K = 8


def _project(w: np.ndarray, radius: float) -> np.ndarray:
    norm = np.linalg.norm(w, axis=-1, keepdims=True)
    return w * np.minimum(1.0, radius / np.maximum(norm, 1e-300))


def cross_entropy(p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """f(w) = logsumexp(w) - <p, w> in nats, batched over leading dims."""
    return logsumexp(w, axis=-1) - np.sum(p * w, axis=-1)


def best_in_ball(p: np.ndarray, radius: float, iterations: int = 400) -> np.ndarray:
    """argmin_{||w||_2 <= radius} CE(p, softmax(w)) by FISTA (step 1; grad is 1/2-Lipschitz).

    Args: p (..., V) probabilities; radius D > 0. Returns w (..., V) inside the ball.
    """
    w = np.zeros_like(p)
    y, momentum = w.copy(), 1.0
    for _ in range(iterations):
        w_next = _project(y - (softmax(y, axis=-1) - p), radius)
        momentum_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * momentum * momentum))
        y = w_next + ((momentum - 1.0) / momentum_next) * (w_next - w)
        w, momentum = w_next, momentum_next
    return w


def certified_min_cross_entropy(p: np.ndarray, w: np.ndarray, radius: float) -> np.ndarray:
    """A lower bound on min_{||v|| <= radius} CE(p, softmax(v)) from the point w (convexity)."""
    g = softmax(w, axis=-1) - p
    return cross_entropy(p, w) - np.sum(g * w, axis=-1) - radius * np.linalg.norm(g, axis=-1)


def _draw(rng):
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    vocab = int(rng.integers(2, MAX_VOCAB + 1))
    rounds, k = int(rng.integers(1, MAX_ROUNDS + 1)), int(rng.integers(1, MAX_K + 1))
    radius, cost_ratio = float(2.0 ** rng.uniform(-2, 2)), float(10.0 ** rng.uniform(-3, 0))
    return family, vocab, rounds, k, radius, cost_ratio


def _sequence(rng, family, vocab, rounds, radius):
    if family == "equal":  # reachable targets: p_t = softmax(w) inside the ball
        p = softmax(_project(rng.normal(size=(rounds, vocab)) * radius, radius), axis=-1)
    else:
        p = np.stack([draw_case(rng, family, vocab).p_target for _ in range(rounds)])
    w_star = best_in_ball(p, radius)
    noise = rng.normal(size=p.shape) * rng.uniform(0, radius) * (rng.random((rounds, 1)) < 0.5)
    w = _project(w_star + noise, radius)
    return p, w_star, w


def _example(family, k, ratio, radius, accs, reg, gamma, lower, arrays) -> dict:
    p, q, w, w_star = arrays
    example = {"family": family, "vocab": p.shape[-1], "rounds": p.shape[0],
               "num_draft_tokens": k, "cost_ratio": ratio, "ball_radius": radius,
               "acceptance_rates": accs.tolist(), "dynamic_regret": reg, "true": gamma,
               "bound": lower}
    if p.size <= 64:
        example.update(p_target=p.tolist(), q_draft=q.tolist(), w_draft=w.tolist(),
                       w_comparator=w_star.tolist())
    return example


def run_unreachable(rng: np.random.Generator, per_family: int) -> ClaimResult:
    """Evaluate the claim on ``per_family * len(FAMILIES)`` random T-round sequences."""
    tally = Tally(lower=True)
    for _ in range(per_family * len(FAMILIES)):
        family, vocab, rounds, k, radius, ratio = _draw(rng)
        p, w_star, w = _sequence(rng, family, vocab, rounds, radius)
        q = softmax(w, axis=-1)
        reg = float(np.sum(cross_entropy(p, w) - certified_min_cross_entropy(p, w_star, radius)))
        reg = max(reg, 0.0)
        accs = acceptance_rate(p, q)
        gamma = float(expected_tokens_chain(accs, k).sum()) / (rounds * (ratio * k + 1.0))
        lower = float(theorem1_bounds(reg, rounds, k, ratio)[0])
        tally.add(lower / gamma, lower > gamma * (1 + RTOL), (rounds * vocab, k, rounds),
                  lambda: _example(family, k, ratio, radius, accs, reg, gamma, lower,
                                   (p, q, w, w_star)), family)
    return tally.result(
        "theorem1_lower_unreachable",
        "Theorem 1 lower bound with Reg_T against w*_t = argmin over ||w|| <= D of CE(p_t, "
        "softmax(w)) (D in [0.25, 4]); certified Reg_T upper estimate; float64",
        float64_rtol=RTOL, vocab_max=MAX_VOCAB)
