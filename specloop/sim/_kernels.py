"""Private Numba kernels of the simulator (nopython, cache=True).

Every kernel takes preallocated outputs and uniforms pre-drawn by a Python wrapper
that owns the ``np.random.Generator`` (`specloop.sim.rounds`); none draws random
numbers itself. `specloop.sim._reference` holds a plain NumPy implementation of each
kernel with the same signature; tests check that both give identical outputs for
the same uniforms.

Conventions: probability tables are float64 (C, V) (row c = context c); CDF tables
are their row-wise cumulative sums; tokens and contexts are int64; a token is drawn
from a row with uniform u in [0, 1) as the smallest index i with cdf[i] > u * cdf[-1]
(inverse-CDF sampling by binary search, O(log V)); a draft token x is accepted with
uniform u when u < p(x) / q(x) (Leviathan et al. 2023, Algorithm 1).
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from specloop.sim.streams import HASH_CONTEXT, HASH_OFFSET, HASH_TOKEN

# proposal distributions of tree siblings
PROPOSAL_IID = 0          # i.i.d. from q (SpecInfer multi-draft, with replacement)
PROPOSAL_NO_REPLACE = 1   # from q without replacement (q renormalised without earlier siblings)
PROPOSAL_DETERMINISTIC = 2  # a fixed candidate (point mass), e.g. EAGLE-2 top-k

#: guide-table entries per vocabulary token (`guide_table`): M = ceil(V / GUIDE_RATIO)
GUIDE_RATIO = 4


def guide_table(cdf: np.ndarray) -> np.ndarray:
    """(C, M + 1) int64 guide table of CDF rows (Chen and Asau 1974): entry j is the
    smallest i with cdf[i] > j * total / M, so a draw with uniform u only has to
    search cdf between entries floor(u M) and floor(u M) + 1 (expected O(1) entries,
    never more than a binary search over the row)."""
    C, V = cdf.shape
    M = -(-V // GUIDE_RATIO)
    out = np.empty((C, M + 1), dtype=np.int64)
    steps = np.arange(M + 1, dtype=np.float64) / M
    for c in range(C):
        out[c] = np.searchsorted(cdf[c], steps * cdf[c, -1], side="right")
    return np.minimum(out, V - 1)


@nb.njit(cache=True, nogil=True)
def _next_context(c, x, num_contexts, iid):
    if iid:
        return c
    return (c * HASH_CONTEXT + x * HASH_TOKEN + HASH_OFFSET) % num_contexts


@nb.njit(cache=True, nogil=True)
def _sample_cdf(cdf, probs, u):
    """Smallest i with cdf[i] > u * cdf[-1]; never returns a zero-probability token."""
    n = cdf.shape[0]
    x = u * cdf[n - 1]
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if cdf[mid] > x:
            hi = mid
        else:
            lo = mid + 1
    if lo >= n:
        lo = n - 1
    while lo > 0 and probs[lo] <= 0.0:
        lo -= 1
    return lo


@nb.njit(cache=True, nogil=True)
def _search(cdf, lo, hi, x):
    """Smallest i in [lo, hi) with cdf[i] > x (hi if none): binary search."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if cdf[mid] > x:
            hi = mid
        else:
            lo = mid + 1
    return lo


@nb.njit(cache=True, nogil=True)
def _sample_guided(cdf, guide, probs, u):
    """`_sample_cdf` (same result) through a guide table: binary search only between
    guide[j] - 1 and guide[j + 1] + 1, j = floor(u M); the bracket is checked and a
    full-row binary search is the fallback, so the worst case stays O(log V)."""
    n = cdf.shape[0]
    m = guide.shape[0] - 1
    x = u * cdf[n - 1]
    j = min(np.int64(u * m), m - 1)
    lo = max(guide[j] - 1, 0)
    hi = min(guide[j + 1] + 2, n)
    if (lo > 0 and cdf[lo - 1] > x) or cdf[hi - 1] <= x:
        lo, hi = 0, n  # rounding put the answer outside the bracket
    i = _search(cdf, lo, hi, x)
    if i >= n:
        i = n - 1
    while i > 0 and probs[i] <= 0.0:
        i -= 1
    return i


@nb.njit(cache=True, nogil=True)
def _sample_linear(probs, u):
    """Inverse-CDF draw from an unnormalised non-negative vector by a linear scan."""
    n = probs.shape[0]
    total = 0.0
    for i in range(n):
        total += probs[i]
    x = u * total
    acc = 0.0
    last = 0
    for i in range(n):
        if probs[i] > 0.0:
            acc += probs[i]
            last = i
            if acc > x:
                return i
    return last


@nb.njit(cache=True, nogil=True)
def iid_chain_kernel(acceptance_rate, num_draft_tokens, uniforms, accepted_out):
    """Assumption-1 chain rounds: accepted draft tokens ~ min(k, Geometric).

    Round r accepts ``min(k_r, floor(log u_r / log Acc_r))`` draft tokens, u_r in
    (0, 1]: P(accepted >= j) = Acc_r^j, the law of k Bernoulli(Acc_r) trials stopped
    at the first failure (one uniform per round instead of k).

    Args:
        acceptance_rate: float64 (R,) Acc_r in [0, 1].
        num_draft_tokens: int64 (R,) k_r >= 0.
        uniforms: float64 (R,) in (0, 1].
        accepted_out: int64 (R,) output.
    """
    for r in range(uniforms.shape[0]):
        k = num_draft_tokens[r]
        a = acceptance_rate[r]
        if a >= 1.0:
            accepted_out[r] = k
        elif a <= 0.0 or k == 0:
            accepted_out[r] = 0
        else:
            j = math.log(uniforms[r]) / math.log(a)
            accepted_out[r] = k if j >= k else np.int64(j)


@nb.njit(cache=True, nogil=True)
def chain_table_kernel(p_table, q_table, p_cdf, q_cdf, res_cdf, res_prob,
                       p_guide, q_guide, res_guide, row_acc,
                       contexts, num_draft_tokens, iid, greedy, p_argmax, q_argmax,
                       u_draft, u_accept, u_final,
                       accepted_out, tokens_out, acc_out):
    """Full-vocabulary chain rounds (speculative sampling or greedy verification).

    Round r starts in context ``contexts[r]``; at each position the draft token x is
    drawn from q_table[c] (``greedy``: argmax q), accepted when u < p(x)/q(x)
    (``greedy``: when x == argmax p); the next position's context is
    next_context(c, x). On the first rejection the correction token is drawn from
    the normalised residual max(0, p - q) of that position (``greedy``: argmax p);
    after k acceptances the bonus token is drawn from p of the next position.
    Everything is O(log V) per token given the CDF tables.

    Args:
        p_table, q_table: float64 (C, V) target / draft rows.
        p_cdf, q_cdf, res_cdf: float64 (C, V) row CDFs of p, q and max(0, p - q).
        res_prob: float64 (C, V) max(0, p - q) (to skip zero-mass tokens).
        p_guide, q_guide, res_guide: `guide_table` of the three CDF tables.
        row_acc: float64 (C,) Acc(c) = sum_x min(p, q).
        contexts: int64 (R,); num_draft_tokens: int64 (R,) k_r <= kmax.
        iid: bool, keep the context along the chain; greedy: bool.
        p_argmax, q_argmax: int64 (C,).
        u_draft, u_accept: float64 (R, kmax) in [0, 1); u_final: float64 (R,).
        accepted_out: int64 (R,); tokens_out: int64 (R, kmax + 1) committed tokens,
            -1 after the last; acc_out: float64 (R, kmax) Acc of each verified
            position, NaN after the first rejection.
    """
    num_contexts = p_table.shape[0]
    for r in range(contexts.shape[0]):
        c = contexts[r]
        k = num_draft_tokens[r]
        for j in range(tokens_out.shape[1]):
            tokens_out[r, j] = -1
        for j in range(acc_out.shape[1]):
            acc_out[r, j] = np.nan
        n = 0
        rejected = False
        for j in range(k):
            if greedy:
                x = q_argmax[c]
                ok = x == p_argmax[c]
            else:
                x = _sample_guided(q_cdf[c], q_guide[c], q_table[c], u_draft[r, j])
                ok = u_accept[r, j] < p_table[c, x] / q_table[c, x]
            acc_out[r, j] = row_acc[c]
            if ok:
                tokens_out[r, j] = x
                n += 1
                c = _next_context(c, x, num_contexts, iid)
            else:
                if greedy:
                    tokens_out[r, j] = p_argmax[c]
                else:
                    tokens_out[r, j] = _sample_guided(res_cdf[c], res_guide[c], res_prob[c],
                                                    u_final[r])
                rejected = True
                break
        if not rejected:
            if greedy:
                tokens_out[r, k] = p_argmax[c]
            else:
                tokens_out[r, k] = _sample_guided(p_cdf[c], p_guide[c], p_table[c], u_final[r])
        accepted_out[r] = n


@nb.njit(cache=True, nogil=True)
def chain_rows_kernel(p_rows, q_rows, draft_tokens, greedy, u_accept, u_final, work,
                      tokens_out):
    """Verify one drafted chain against per-position rows (returns accepted count).

    Args:
        p_rows: float64 (k + 1, V), p at positions 1..k+1 (row j conditions on the
            first j drafted tokens). q_rows: float64 (k, V), the distributions the
            draft tokens were drawn from. draft_tokens: int64 (k,).
        greedy: bool (accept iff x_j == argmax p_j; correction/bonus argmax).
        u_accept: float64 (k,); u_final: float64 scalar array (1,).
        work: float64 (V,) scratch. tokens_out: int64 (k + 1,), -1 after the last.
    Returns:
        number of accepted draft tokens.
    """
    k = draft_tokens.shape[0]
    for j in range(k + 1):
        tokens_out[j] = -1
    for j in range(k):
        x = draft_tokens[j]
        if greedy:
            ok = x == np.argmax(p_rows[j])
        else:
            ok = u_accept[j] < p_rows[j, x] / q_rows[j, x]
        if ok:
            tokens_out[j] = x
            continue
        if greedy:
            tokens_out[j] = np.argmax(p_rows[j])
        else:
            for i in range(work.shape[0]):
                d = p_rows[j, i] - q_rows[j, i]
                work[i] = d if d > 0.0 else 0.0
            tokens_out[j] = _sample_linear(work, u_final[0])
        return j
    if greedy:
        tokens_out[k] = np.argmax(p_rows[k])
    else:
        tokens_out[k] = _sample_linear(p_rows[k], u_final[0])
    return k


@nb.njit(cache=True, nogil=True)
def tree_verify_kernel(p_table, q_table, parent, token, node_ctx, num_nodes, proposal,
                       greedy, u_accept, u_final, work, accepted_out, tokens_out):
    """Verify drafted trees: greedy, or multi-draft recursive rejection sampling.

    Node 0 of each round is the root (the last committed position); nodes
    1..num_nodes[r] are drafted tokens listed so that a parent precedes its
    children and siblings appear in drafting order. ``node_ctx[r, i]`` is the
    context *after* node i: p_table[node_ctx] is the target for i's children and
    q_table[node_ctx] the draft distribution they were drawn from.

    Sampling verification (SpecInfer, Miao et al. 2024, Algorithm 2; Chen et al.
    2023 / Leviathan et al. 2023 per sibling): at the current node with target
    p_cur, for each child x in order with proposal q_i (``proposal``: 0 = q
    i.i.d., 1 = q renormalised without the earlier siblings, 2 = point mass on x)
    accept with probability min(1, p_cur(x)/q_i(x)); on acceptance move to the
    child; on rejection set p_cur <- norm(max(0, p_cur - q_i)) and try the next
    sibling. If no child is accepted draw the final token from p_cur. Each sibling
    step is a speculative-sampling step for target p_cur, so the committed token
    is distributed exactly as p. Greedy: follow the child whose token is argmax p.

    Args:
        p_table, q_table: float64 (C, V).
        parent, token, node_ctx: int64 (R, N + 1); parent[r, 0] = -1.
        num_nodes: int64 (R,). proposal: int64 scalar. greedy: bool.
        u_accept: float64 (R, N + 1) (u_accept[r, i] used for node i); u_final (R,).
        work: float64 (V,) scratch. accepted_out: int64 (R,) accepted depth.
        tokens_out: int64 (R, D + 1) committed tokens (path + final), -1 padded.
    """
    V = p_table.shape[1]
    for r in range(num_nodes.shape[0]):
        for j in range(tokens_out.shape[1]):
            tokens_out[r, j] = -1
        cur = 0
        depth = 0
        while True:
            c = node_ctx[r, cur]
            if greedy:
                target_token = np.argmax(p_table[c])
                nxt = -1
                for i in range(cur + 1, num_nodes[r] + 1):
                    if parent[r, i] == cur and token[r, i] == target_token:
                        nxt = i
                        break
                if nxt < 0:
                    tokens_out[r, depth] = target_token
                    break
                tokens_out[r, depth] = target_token
                depth += 1
                cur = nxt
                continue
            for i in range(V):
                work[i] = p_table[c, i]
            removed = 0.0
            nxt = -1
            for i in range(cur + 1, num_nodes[r] + 1):
                if parent[r, i] != cur:
                    continue
                x = token[r, i]
                total = 0.0
                for v in range(V):
                    total += work[v]
                for v in range(V):
                    work[v] /= total
                denom = (1.0 - removed) if proposal == 1 else 1.0
                qx = 1.0 if proposal == 2 else q_table[c, x] / denom
                if u_accept[r, i] < work[x] / qx:
                    nxt = i
                    break
                if proposal == 2:
                    work[x] = 0.0
                else:
                    # (earlier siblings of proposal 1 have q_i = 0, but their residual
                    # is already 0: a sibling is rejected only where p_cur < q_i)
                    for v in range(V):
                        d = work[v] - q_table[c, v] / denom
                        work[v] = d if d > 0.0 else 0.0
                if proposal == 1:
                    removed += q_table[c, x]
            if nxt < 0:
                tokens_out[r, depth] = _sample_linear(work, u_final[r])
                break
            tokens_out[r, depth] = token[r, nxt]
            depth += 1
            cur = nxt
        accepted_out[r] = depth
