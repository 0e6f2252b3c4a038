"""Private Numba kernels of the simulator (nopython, cache=True).

Every kernel takes preallocated outputs and uniforms pre-drawn by a Python wrapper
that owns the ``np.random.Generator`` (`specloop.sim.rounds`); none draws random
numbers itself. `specloop.sim._reference` holds a plain NumPy implementation of each
kernel with the same signature; tests check that both give identical outputs for
the same uniforms.

Conventions: probability tables are float64 (C, V) (row c = context c); CDF tables
are their row-wise cumulative sums; tokens and contexts are int64; a token is drawn
from a row with uniform u in [0, 1) as the smallest index i with cdf[i] > u * cdf[-1]
(inverse-CDF sampling; the references use a binary search, O(log V)); a draft token x
is accepted with uniform u when u < p(x) / q(x) (Leviathan et al. 2023, Algorithm 1).

The full-vocabulary chain kernel finds the same index through line-blocked tables
(`build_sampling_tables`, O(V) per distribution, one pass): a guide table (Chen and
Asau 1974) points at the 64-byte line of CDF entries that holds the answer, which is
then verified and located by counting the entries <= u * total in that line (expected
O(1), a binary search over the whole row as the exact fallback, so never worse than
O(log V)). Rounds are processed in blocks of `ROUND_BLOCK` with software prefetches,
so the cache misses of different rounds overlap instead of queueing.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from specloop.sim.streams import HASH_CONTEXT, HASH_OFFSET, HASH_TOKEN

# proposal distributions of tree siblings
PROPOSAL_IID = 0          # i.i.d. from q (SpecInfer multi-draft, with replacement)
PROPOSAL_NO_REPLACE = 1   # from q without replacement (q renormalised without earlier siblings)
PROPOSAL_DETERMINISTIC = 2  # a fixed candidate (point mass), e.g. EAGLE-2 top-k

#: rows of the sampling tables (`build_sampling_tables`): draft q, target p, residual
DRAFT, TARGET, RESIDUAL = 0, 1, 2
#: CDF entries per line of the sampling tables (8 float64 = one 64-byte cache line)
LINE = 8
#: rounds processed together by `chain_table_kernel` (their cache misses overlap)
ROUND_BLOCK = 64


def sampling_table_shapes(num_contexts: int, vocab_size: int):
    """Shapes of the (blocks, guide) arrays `build_sampling_tables` fills for C
    contexts and V tokens: blocks float64 (3, C, 16 G) with G = (V + 1) // 8 + 1 lines
    (48 bytes per context and token, plus padding), guide int32 (3, C, V + 1)."""
    lines = (vocab_size + 1) // LINE + 1
    return (3, num_contexts, 2 * LINE * lines), (3, num_contexts, vocab_size + 1)


@nb.njit(cache=True, nogil=True, boundscheck=False)
def build_sampling_tables(p_table, q_table, p_cdf, q_cdf, res_prob, res_cdf, blocks, guide):
    """Fill the tables of `chain_table_kernel` (O(V) per context and distribution: one
    sweep for the sums, residual, ratios, blocks and guide counts, one prefix sum per
    guide row).

    Args:
        p_table, q_table: float64 (C, V) target / draft rows (non-negative).
        p_cdf, q_cdf, res_prob, res_cdf: float64 (C, V) outputs: the row cumulative
            sums of p and q, the residual max(0, p - q) and its cumulative sum (left to
            right, the same values as ``np.cumsum``).
        blocks: float64 (3, C, 16 G) output, G = (V + 1) // 8 + 1
            (`sampling_table_shapes`). Row d (`DRAFT`, `TARGET`, `RESIDUAL`) of context c
            pads the CDF of q, p or the residual to P[0] = 0, P[i + 1] = cdf[i],
            P[V + 1:] = +inf and stores line g (P[8g .. 8g + 7]) in
            blocks[d, c, 16g .. 16g + 7], followed by the matching values in
            blocks[d, c, 16g + 8 .. 16g + 15]: value[i + 1] = p(i)/q(i) (0 where
            q(i) = 0) for the draft row, p(i) for the target row, the residual for the
            residual row (value[0] = 0). A 128-byte pair of lines thus holds the CDF
            entries around a draft token and its acceptance ratio.
        guide: int32 (3, C, V + 1) output: guide[d, c, j] = min(#{i : cdf[i] <= j s},
            V - 1) with s = cdf[V - 1] / V, i.e. (up to the rounding of cdf[i] / s) the
            smallest i with cdf[i] > j s (Chen and Asau 1974): a draw with uniform u
            starts at the line of token guide[floor(u V)]. Only a starting point: the
            kernel verifies every draw against the CDF entries, so rounding here can
            cost time but never change a token.
    """
    num_contexts, V = p_table.shape
    half = blocks.shape[2] // 2  # padded entries per row
    counts = np.empty((3, V + 2), dtype=np.int64)
    for c in range(num_contexts):
        ap = 0.0
        aq = 0.0
        ar = 0.0
        for i in range(V):
            ap += p_table[c, i]
            aq += q_table[c, i]
            r = p_table[c, i] - q_table[c, i]
            ar += r if r > 0.0 else 0.0
        totals = (aq, ap, ar)
        for d in range(3):
            blocks[d, c, 0] = 0.0
            blocks[d, c, LINE] = 0.0
            counts[d, :] = 0
        scale_q = V / aq if aq > 0.0 else 0.0
        scale_p = V / ap if ap > 0.0 else 0.0
        scale_r = V / ar if ar > 0.0 else 0.0
        ap = 0.0
        aq = 0.0
        ar = 0.0
        for i in range(V):
            p = p_table[c, i]
            q = q_table[c, i]
            r = p - q
            r = r if r > 0.0 else 0.0
            ap += p
            aq += q
            ar += r
            p_cdf[c, i] = ap
            q_cdf[c, i] = aq
            res_prob[c, i] = r
            res_cdf[c, i] = ar
            k = i + 1
            at = (k // LINE) * 2 * LINE + k % LINE
            blocks[DRAFT, c, at] = aq
            blocks[DRAFT, c, at + LINE] = p / q if q > 0.0 else 0.0
            blocks[TARGET, c, at] = ap
            blocks[TARGET, c, at + LINE] = p
            blocks[RESIDUAL, c, at] = ar
            blocks[RESIDUAL, c, at + LINE] = r
            # guide counts: cdf[i] <= j s  <=>  j >= ceil(cdf[i] / s)
            jq = np.int64(math.ceil(aq * scale_q))
            jp = np.int64(math.ceil(ap * scale_p))
            jr = np.int64(math.ceil(ar * scale_r))
            counts[DRAFT, jq if jq <= V else V + 1] += 1
            counts[TARGET, jp if jp <= V else V + 1] += 1
            counts[RESIDUAL, jr if jr <= V else V + 1] += 1
        for k in range(V + 1, half):
            at = (k // LINE) * 2 * LINE + k % LINE
            for d in range(3):
                blocks[d, c, at] = np.inf
                blocks[d, c, at + LINE] = 0.0
        for d in range(3):
            if totals[d] > 0.0:
                run = 0
                for j in range(V + 1):
                    run += counts[d, j]
                    guide[d, c, j] = run if run < V else V - 1
            else:  # all-zero row (a residual when p == q): every cdf[i] <= j s
                for j in range(V + 1):
                    guide[d, c, j] = V - 1


@intrinsic
def _prefetch(typingctx, array, i, j, k):
    """Software prefetch (read, keep in all cache levels) of array[i, j, k] for a
    3-D array: LLVM's llvm.prefetch; only a hint, never faults."""
    sig = types.void(array, i, j, k)

    def codegen(context, builder, signature, args):
        arytype = signature.args[0]
        ary = context.make_array(arytype)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, arytype, ary, list(args[1:]),
                                       wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
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


@nb.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _find_in_blocks(blocks, d, c, line, x, V):
    """Smallest i with cdf[i] > x (V if none) for row (d, c) of `build_sampling_tables`,
    starting at line ``line``: count the padded entries P <= x in the line; a count in
    1..7 proves the answer is in it (P[8 line] <= x < P[8 line + 7], P sorted); a
    full line moves on (at most two more lines), an empty one, or a third full one,
    falls back to a binary search over the whole row. Exact for every start line."""
    for _ in range(3):
        base = line * 2 * LINE
        count = 0
        for t in range(LINE):
            count += blocks[d, c, base + t] <= x
        if count == 0:
            break
        if count < LINE:
            return line * LINE + count - 1
        line += 1
    lo = 0
    hi = V + 1  # count the padded entries P[0 .. V] that are <= x
    while lo < hi:
        mid = (lo + hi) >> 1
        if blocks[d, c, (mid // LINE) * 2 * LINE + mid % LINE] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@nb.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _start_line(guide, d, c, u, V):
    """Line of the padded CDF where the draw with uniform u starts (`guide`)."""
    j = min(np.int64(u * V), V - 1)
    return (np.int64(guide[d, c, j]) + 1) // LINE


@nb.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _skip_zero_mass(probs, c, i, V):
    """``i`` if i < V, else the last token with positive mass (rounding put u * total
    at or above the last CDF entry; the same rule as `_sample_cdf`)."""
    if i >= V:
        i = V - 1
        while i > 0 and probs[c, i] <= 0.0:
            i -= 1
    return i


@nb.njit(cache=True, nogil=True)
def _sample_blocked(blocks, guide, d, c, probs, u):
    """`_sample_cdf` (the same index) through the tables of `build_sampling_tables`;
    ``probs`` is the (C, V) table of row d (q, p or the residual)."""
    V = guide.shape[2] - 1
    total = blocks[d, c, (V // LINE) * 2 * LINE + V % LINE]
    i = _find_in_blocks(blocks, d, c, _start_line(guide, d, c, u, V), u * total, V)
    return _skip_zero_mass(probs, c, i, V)


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
def _chain_greedy(p_argmax, q_argmax, row_acc, contexts, num_draft_tokens, iid,
                  accepted_out, tokens_out, acc_out):
    """Greedy branch of `chain_table_kernel` (argmax tokens, no sampling)."""
    num_contexts = p_argmax.shape[0]
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
            x = q_argmax[c]
            acc_out[r, j] = row_acc[c]
            if x == p_argmax[c]:
                tokens_out[r, j] = x
                n += 1
                c = _next_context(c, x, num_contexts, iid)
            else:
                tokens_out[r, j] = p_argmax[c]
                rejected = True
                break
        if not rejected:
            tokens_out[r, k] = p_argmax[c]
        accepted_out[r] = n


@nb.njit(cache=True, nogil=True, boundscheck=False)
def chain_table_kernel(p_table, q_table, p_cdf, q_cdf, res_cdf, res_prob, row_acc,
                       p_argmax, q_argmax, blocks, guide,
                       contexts, num_draft_tokens, iid, greedy,
                       u_draft, u_accept, u_final, accepted_out, tokens_out, acc_out):
    """Full-vocabulary chain rounds (speculative sampling or greedy verification).

    Round r starts in context ``contexts[r]``; at each position the draft token x is
    drawn from q_table[c] (``greedy``: argmax q), accepted when u < p(x)/q(x)
    (``greedy``: when x == argmax p); the next position's context is
    next_context(c, x). On the first rejection the correction token is drawn from
    the normalised residual max(0, p - q) of that position (``greedy``: argmax p);
    after k acceptances the bonus token is drawn from p of the next position.
    Every draw is the inverse-CDF index of `_sample_cdf` (the same tokens as the
    binary searches of the reference), found through ``blocks`` / ``guide``:
    expected O(1), at most O(log V) per token. Rounds are independent; they are
    processed ``ROUND_BLOCK`` at a time, position by position, with the table lines
    prefetched one step ahead.

    Args:
        p_table, q_table: float64 (C, V) target / draft rows.
        p_cdf, q_cdf, res_cdf: float64 (C, V) row CDFs of p, q and max(0, p - q)
            (used by the reference; the kernel reads their copies in ``blocks``).
        res_prob: float64 (C, V) max(0, p - q).
        row_acc: float64 (C,) Acc(c) = sum_x min(p, q).
        p_argmax, q_argmax: int64 (C,).
        blocks, guide: the tables of `build_sampling_tables`.
        contexts: int64 (R,); num_draft_tokens: int64 (R,) k_r <= kmax.
        iid: bool, keep the context along the chain; greedy: bool.
        u_draft, u_accept: float64 (R, kmax) in [0, 1); u_final: float64 (R,).
        accepted_out: int64 (R,); tokens_out: int64 (R, kmax + 1) committed tokens,
            -1 after the last; acc_out: float64 (R, kmax) Acc of each verified
            position, NaN after the first rejection.
    """
    if greedy:
        _chain_greedy(p_argmax, q_argmax, row_acc, contexts, num_draft_tokens, iid,
                      accepted_out, tokens_out, acc_out)
        return
    num_contexts, V = q_table.shape
    total_at = (V // LINE) * 2 * LINE + V % LINE  # P[V] = cdf[V - 1] in a blocks row
    R = contexts.shape[0]
    kmax = acc_out.shape[1]
    lane_ctx = np.empty(ROUND_BLOCK, np.int64)
    lane_line = np.empty(ROUND_BLOCK, np.int64)
    lane_final = np.empty(ROUND_BLOCK, np.int64)  # TARGET (bonus) or RESIDUAL
    lane_accepted = np.empty(ROUND_BLOCK, np.int64)
    active = np.empty(ROUND_BLOCK, np.int64)
    for r0 in range(0, R, ROUND_BLOCK):
        lanes = min(ROUND_BLOCK, R - r0)
        n_active = 0
        for lane in range(lanes):
            r = r0 + lane
            c = contexts[r]
            lane_ctx[lane] = c
            lane_final[lane] = TARGET
            lane_accepted[lane] = 0
            for j in range(tokens_out.shape[1]):
                tokens_out[r, j] = -1
            for j in range(kmax):
                acc_out[r, j] = np.nan
            if num_draft_tokens[r] > 0:
                _prefetch(guide, DRAFT, c, min(np.int64(u_draft[r, 0] * V), V - 1))
            else:
                _prefetch(guide, TARGET, c, min(np.int64(u_final[r] * V), V - 1))
            active[n_active] = lane
            n_active += num_draft_tokens[r] > 0
        for j in range(kmax):
            if n_active == 0:
                break
            # draft draws, step 1: guide entries -> start lines (prefetch the lines)
            for a in range(n_active):
                lane = active[a]
                c = lane_ctx[lane]
                line = _start_line(guide, DRAFT, c, u_draft[r0 + lane, j], V)
                lane_line[lane] = line
                _prefetch(blocks, DRAFT, c, line * 2 * LINE)
                _prefetch(blocks, DRAFT, c, line * 2 * LINE + LINE)
            # step 2: locate the token, accept or reject, move on
            still = 0
            for a in range(n_active):
                lane = active[a]
                r = r0 + lane
                c = lane_ctx[lane]
                x = _find_in_blocks(blocks, DRAFT, c, lane_line[lane],
                                    u_draft[r, j] * blocks[DRAFT, c, total_at], V)
                x = _skip_zero_mass(q_table, c, x, V)
                acc_out[r, j] = row_acc[c]
                k = x + 1
                ok = u_accept[r, j] < blocks[DRAFT, c, (k // LINE) * 2 * LINE + LINE + k % LINE]
                if ok:
                    tokens_out[r, j] = x
                    lane_accepted[lane] += 1
                    c = _next_context(c, x, num_contexts, iid)
                    lane_ctx[lane] = c
                else:
                    lane_final[lane] = RESIDUAL
                more = ok and j + 1 < num_draft_tokens[r]
                if more:
                    _prefetch(guide, DRAFT, c, min(np.int64(u_draft[r, j + 1] * V), V - 1))
                else:
                    _prefetch(guide, lane_final[lane], c, min(np.int64(u_final[r] * V), V - 1))
                active[still] = lane
                still += more
            n_active = still
        # final draws: the correction (residual row) or the bonus token (target row)
        for lane in range(lanes):
            c = lane_ctx[lane]
            d = lane_final[lane]
            line = _start_line(guide, d, c, u_final[r0 + lane], V)
            lane_line[lane] = line
            _prefetch(blocks, d, c, line * 2 * LINE)
        for lane in range(lanes):
            r = r0 + lane
            c = lane_ctx[lane]
            d = lane_final[lane]
            x = _find_in_blocks(blocks, d, c, lane_line[lane], u_final[r] * blocks[d, c, total_at], V)
            x = _skip_zero_mass(p_table if d == TARGET else res_prob, c, x, V)
            tokens_out[r, lane_accepted[lane]] = x
            accepted_out[r] = lane_accepted[lane]


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
    accept with probability min(1, p_cur(x)/q_i(x)) (proposal 1: q_i = q / the sum of
    q over the tokens not drawn yet, as the drafter drew it); on acceptance move to the
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
    drawn = np.zeros(V, np.bool_)   # earlier siblings at the current node (proposal 1)
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
                drawn[i] = False
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
                denom = 1.0
                if proposal == 1:   # the mass q had left when x was drawn (summed, not
                    denom = 0.0     # 1 - removed: that cancels to 0 when q's head is gone)
                    for v in range(V):
                        if not drawn[v]:
                            denom += q_table[c, v]
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
                drawn[x] = True
            if nxt < 0:
                tokens_out[r, depth] = _sample_linear(work, u_final[r])
                break
            tokens_out[r, depth] = token[r, nxt]
            depth += 1
            cur = nxt
        accepted_out[r] = depth
