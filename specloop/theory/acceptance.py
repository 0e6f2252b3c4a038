"""Acceptance rate, distances and the residual of speculative sampling.

Sources: Leviathan et al. 2023 / Chen et al. 2023 (speculative sampling);
OnlineSpec Eq. (1) and the proof of Lemma 1 (Appendix D.1: Acc = 1 - TV, Eq. (4):
regret against q = p is KL(p || q)); SpecInfer (Miao et al. 2024) multi-step
speculative sampling for several drafts of one node.

All functions take ``p_target`` and ``q_draft`` of shape (..., V) (float64 after
validation; V is the vocabulary size, leading batch dims broadcast) and reduce the
last axis. Errors: ValueError for invalid probability vectors (NaN, negative, sum
off by > 1e-6), mismatched vocabularies and non-broadcastable batch shapes.
"""
from __future__ import annotations

import numpy as np
from scipy.special import rel_entr

from specloop.theory._validation import validate_pair

__all__ = ["acceptance_rate", "total_variation", "kl_divergence",
           "residual_distribution", "multidraft_sibling_acceptance"]


def acceptance_rate(p_target, q_draft) -> np.ndarray:
    """Acc = sum_x min(p(x), q(x)), the probability that one drafted token x ~ q is accepted.

    OnlineSpec Eq. (1): E_{x~q}[min(1, p(x)/q(x))] = sum_x min(p, q).

    Args:
        p_target, q_draft: (..., V) probability vectors.
    Returns:
        float64 array of shape (...) in [0, 1] (0-d array for 1-D inputs); clipped to
        [0, 1] because inputs are accepted with sums within 1e-6 of 1 and float sums
        of exactly normalised vectors can exceed 1 by an ulp.
    """
    p, q = validate_pair(p_target, q_draft)
    return np.clip(np.minimum(p, q).sum(axis=-1), 0.0, 1.0)


def total_variation(p_target, q_draft) -> np.ndarray:
    """TV(p, q) = 1/2 sum_x |p(x) - q(x)|, shape (...), float64 clipped to [0, 1]."""
    p, q = validate_pair(p_target, q_draft)
    return np.clip(0.5 * np.abs(p - q).sum(axis=-1), 0.0, 1.0)


def kl_divergence(p_target, q_draft) -> np.ndarray:
    """KL(p || q) = sum_x p(x) log(p(x)/q(x)) in nats, shape (...), float64 >= 0.

    Convention 0 log(0/q) = 0; the result is +inf where q misses part of p's support
    (some x with p(x) > 0 = q(x)). This is f_t(w_t) - f_t(w*_t) for the cross-entropy
    loss with comparator q = p (OnlineSpec Eq. (4)).
    """
    p, q = validate_pair(p_target, q_draft)
    return np.maximum(rel_entr(p, q).sum(axis=-1), 0.0)


def residual_distribution(p_target, q_draft) -> np.ndarray:
    """The correction distribution p'(x) = max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y)).

    Algorithm 1 of OnlineSpec (and Leviathan et al. 2023, Algorithm 1) samples the
    correction token from it after a rejection.

    Where the unnormalised residual has zero mass the function returns ``p_target``
    (never NaN). Zero mass means p <= q everywhere, hence p = q (both sum to one), hence
    Acc = 1 and the rejection probability 1 - Acc = sum max(0, p - q) is 0: the
    residual is then never sampled, and p is the distribution a lossless sampler
    would use anyway.

    Args:
        p_target, q_draft: (..., V) probability vectors.
    Returns:
        (..., V) float64, each vector non-negative and summing to 1.
    """
    p, q = validate_pair(p_target, q_draft)
    residual = np.maximum(p - q, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    safe = np.where(mass > 0.0, mass, 1.0)
    return np.where(mass > 0.0, residual / safe, p)


def multidraft_sibling_acceptance(p_target, q_draft, num_siblings: int) -> np.ndarray:
    """Per-sibling acceptance probabilities of multi-draft recursive rejection sampling.

    Setting (SpecInfer's multi-step speculative sampling with i.i.d. drafts): a node has
    ``num_siblings`` = m children x_1..x_m drawn i.i.d. from q. Sibling j is tried only
    if siblings 1..j-1 were rejected; it is accepted with probability
    min(1, r_{j-1}(x_j)/q(x_j)), where r_0 = p and r_j = residual_distribution(r_{j-1}, q)
    (the residual updated after every rejection; q is not updated). If all m are
    rejected the correction token is drawn from r_m. The output is distributed
    exactly as p.

    Because x_j is independent of the earlier rejections, the conditional acceptance
    of sibling j is beta_j = sum_x min(r_{j-1}(x), q(x)), and

        P(sibling j is the accepted one) = beta_j * prod_{i<j} (1 - beta_i).

    These are the per-node ``accept_probs`` that `expected_tokens_tree` takes for the
    children of one node (they sum to <= 1: siblings are mutually exclusive).

    Args:
        p_target, q_draft: (..., V) probability vectors.
        num_siblings: m >= 0 (int).
    Returns:
        (..., m) float64 array of unconditional (given the parent was accepted)
        per-sibling acceptance probabilities.
    Raises:
        ValueError: invalid distributions, mismatched shapes, m < 0 or not an integer.
    """
    if int(num_siblings) != num_siblings or num_siblings < 0:
        raise ValueError(f"num_siblings must be an integer >= 0, got {num_siblings!r}")
    p, q = validate_pair(p_target, q_draft)
    out = np.zeros(p.shape[:-1] + (int(num_siblings),))
    reach = np.ones(p.shape[:-1])
    residual = p
    for j in range(int(num_siblings)):
        beta = np.clip(np.minimum(residual, q).sum(axis=-1), 0.0, 1.0)
        out[..., j] = reach * beta
        reach = reach * np.clip(1.0 - beta, 0.0, 1.0)
        residual = residual_distribution(residual, q)
    return out
