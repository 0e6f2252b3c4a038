"""Chain and tree verification on probabilities (no models here).

Chain: speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023,
Alg. 2): draft token x with q(x) is accepted with probability
min(1, p(x)/q(x)); at the first rejection the correction is drawn from the
residual norm(max(0, p - q)); if all are accepted a bonus token is drawn from p.
Tree: the same walk from the pending token downwards; at each node its children
are tried in order with recursive rejection sampling (SpecInfer, Miao et al. 2024,
Alg. 2 "multi-step speculative sampling"): after a rejected child with row q,
p <- norm(max(0, p - q)) and the next child is tried against the updated p.
Each child is verified with its own row, so siblings drawn i.i.d. (all rows q) and
siblings drawn without replacement (row i = q without siblings 1..i-1, renormalised:
Jeon et al. 2024's RRSw, `drafters.small_lm.sample_siblings`) are both lossless.
Deterministic drafts (``q_draft=None``) use a one-hot q. A token with p(x) = 0 is
never accepted (its acceptance probability is exactly 0). Greedy decoding is the
special case of one-hot p: every acceptance probability is 0 or 1, so no uniform
is consumed and the result is the target's argmax path.

Uniforms come from the caller's ``torch.Generator`` (CPU, float64).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specloop.realmodels.sampling import sample_from

__all__ = ["VerifyOutcome", "verify_tree", "verify_greedy", "children_lists"]


@dataclass(frozen=True)
class VerifyOutcome:
    """Result of verifying one proposal.

    Attributes:
        accepted_nodes: node indices of the accepted path, root side first.
        next_token: the bonus (all children of the last accepted node rejected, or
            a leaf reached) / correction token id, in [0, V).
        child_acceptance_ratios: min(1, p(x)/q(x)) of every child tried along the walk,
            in the order tried (floats in [0, 1]).
    """

    accepted_nodes: tuple[int, ...]
    next_token: int
    child_acceptance_ratios: tuple[float, ...]


def children_lists(parents: torch.Tensor) -> dict[int, list[int]]:
    """{parent index (-1 = pending): [child indices in proposal order]}."""
    out: dict[int, list[int]] = {}
    for i, p in enumerate(parents.tolist()):
        out.setdefault(int(p), []).append(i)
    return out


def _q_row(q_draft: torch.Tensor | None, node: int, token: int, vocab: int) -> torch.Tensor:
    """The (V,) float64 distribution node ``node`` was drawn from (zero-padded)."""
    row = torch.zeros(vocab, dtype=torch.float64, device="cpu")
    if q_draft is None:
        row[token] = 1.0
    else:
        src = q_draft[node].double().cpu()
        row[: src.shape[0]] = src
    return row


def verify_tree(p_target: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                q_draft: torch.Tensor | None, generator: torch.Generator) -> VerifyOutcome:
    """Walk the drafted tree against the target's distributions.

    Args:
        p_target: float (n+1, V): row 0 = the target's processed distribution after
            the pending token, row i+1 = after node i (its path as context).
        tokens: int64 (n,) node token ids in [0, V).
        parents: int64 (n,) parent indices (-1 = child of the pending token).
        q_draft: float (n, V_draft <= V) rows each node was drawn from, or None
            (deterministic draft: one-hot rows).
        generator: CPU torch.Generator providing the uniforms.

    Returns:
        `VerifyOutcome`.

    Raises:
        ValueError: a drafted node whose q_draft row gives its own token probability
            0 (it cannot have been sampled from that row), or shape mismatches.
    """
    n, vocab = int(tokens.shape[0]), int(p_target.shape[-1])
    if p_target.shape[0] != n + 1:
        raise ValueError(f"p_target has {p_target.shape[0]} rows, expected {n + 1}")
    kids = children_lists(parents)
    toks = tokens.tolist()
    accepted: list[int] = []
    probs: list[float] = []
    current = -1
    while True:
        p = p_target[current + 1].double().cpu().clone()
        next_node = None
        for child in kids.get(current, []):
            x = toks[child]
            q = _q_row(q_draft, child, x, vocab)
            if not q[x] > 0:
                raise ValueError(f"draft node {child} (token {x}) has q_draft = 0 for its own token: "
                                 "q_draft must be the distribution the token was sampled from")
            ratio = float(min(1.0, p[x].item() / q[x].item()))
            probs.append(ratio)
            if ratio >= 1.0 or (ratio > 0.0 and torch.rand((), generator=generator, device=generator.device,
                                                                  dtype=torch.float64).item() < ratio):
                next_node = child
                break
            residual = torch.clamp(p - q, min=0.0)
            total = residual.sum()
            if total <= 0:  # p <= q everywhere: only possible if p == q, then x would be accepted
                break
            p = residual / total
        if next_node is None:
            return VerifyOutcome(tuple(accepted), sample_from(p, generator), tuple(probs))
        accepted.append(next_node)
        current = next_node


def verify_greedy(target_argmax: list[int], tokens: list[int], parents: list[int],
                  generator: torch.Generator) -> VerifyOutcome:
    """`verify_tree` for greedy decoding of a deterministic draft, on token ids only.

    With one-hot p rows (greedy, ``processed_probs`` at temperature 0) and one-hot q
    (``q_draft=None``) every acceptance probability is exactly 1 (the drafted token
    is the target's argmax) or 0, and a rejection leaves p unchanged, so the walk
    needs only each row's argmax: no (V,) rows are built. The result, including the
    single uniform that `verify_tree`'s final `sample_from` consumes, is identical
    to ``verify_tree(one_hot(target_argmax), tokens, parents, None, generator)``.

    Args:
        target_argmax: n+1 ints: the target's argmax after the pending token
            (entry 0) and after each node (entry i+1).
        tokens: n drafted token ids; parents: n parent indices (-1 = root).
        generator: CPU torch.Generator (one float64 uniform is drawn, as
            `verify_tree` does for its bonus / correction token).

    Raises:
        ValueError: ``target_argmax`` of the wrong length.
    """
    n = len(tokens)
    if len(target_argmax) != n + 1 or len(parents) != n:
        raise ValueError(f"verify_greedy: {len(target_argmax)} argmax rows, {n} tokens, {len(parents)} parents; "
                         "expected n + 1, n, n")
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        kids.setdefault(par, []).append(i)
    accepted: list[int] = []
    probs: list[float] = []
    current = -1
    while True:
        best = target_argmax[current + 1]
        next_node = None
        for child in kids.get(current, ()):
            if tokens[child] == best:
                probs.append(1.0)
                next_node = child
                break
            probs.append(0.0)
        if next_node is None:
            torch.rand((), generator=generator, device=generator.device, dtype=torch.float64)
            return VerifyOutcome(tuple(accepted), int(best), tuple(probs))
        accepted.append(next_node)
        current = next_node
