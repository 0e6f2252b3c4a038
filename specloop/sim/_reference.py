"""Plain NumPy references of the kernels in `specloop.sim._kernels`.

Same signatures and outputs, written for readability (a Python loop over rounds,
NumPy within a round: ``np.searchsorted`` for inverse-CDF draws, vector ops for
residuals). Tests check kernel == reference for the same uniforms; the benchmark
``benchmarks/sim_speed.py`` measures the kernels' speed-up over these.
"""
from __future__ import annotations

import numpy as np

from specloop.sim.streams import next_context


def _sample_cdf(cdf: np.ndarray, probs: np.ndarray, u: float) -> int:
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    i = min(i, cdf.shape[0] - 1)
    while i > 0 and probs[i] <= 0.0:
        i -= 1
    return i


def _sample_linear(probs: np.ndarray, u: float) -> int:
    positive = np.flatnonzero(probs > 0)
    cdf = np.cumsum(probs[positive])
    i = int(np.searchsorted(cdf, u * probs.sum(), side="right"))
    return int(positive[min(i, positive.size - 1)])


def iid_chain_kernel(acceptance_rate, num_draft_tokens, uniforms, accepted_out):
    """Reference of the Assumption-1 kernel: count j = 1..k with u <= Acc^j."""
    for r in range(uniforms.shape[0]):
        k = int(num_draft_tokens[r])
        powers = float(acceptance_rate[r]) ** np.arange(1, k + 1)
        accepted_out[r] = int(np.count_nonzero(uniforms[r] <= powers))


def chain_table_kernel(p_table, q_table, p_cdf, q_cdf, res_cdf, res_prob, row_acc,
                       p_argmax, q_argmax, blocks, guide,
                       contexts, num_draft_tokens, iid, greedy,
                       u_draft, u_accept, u_final, accepted_out, tokens_out, acc_out):
    """Reference of the full-vocabulary chain kernel (same arguments; the sampling
    tables ``blocks`` / ``guide`` are unused: ``np.searchsorted`` on the full CDF rows)."""
    num_contexts = p_table.shape[0]
    tokens_out[:] = -1
    acc_out[:] = np.nan
    for r in range(contexts.shape[0]):
        c = int(contexts[r])
        k = int(num_draft_tokens[r])
        n = 0
        for j in range(k):
            if greedy:
                x = int(q_argmax[c])
                ok = x == p_argmax[c]
            else:
                x = _sample_cdf(q_cdf[c], q_table[c], u_draft[r, j])
                ok = u_accept[r, j] < p_table[c, x] / q_table[c, x]
            acc_out[r, j] = row_acc[c]
            if not ok:
                tokens_out[r, j] = (p_argmax[c] if greedy
                                    else _sample_cdf(res_cdf[c], res_prob[c], u_final[r]))
                break
            tokens_out[r, j] = x
            n += 1
            c = next_context(c, x, num_contexts, iid)
        else:
            tokens_out[r, k] = (p_argmax[c] if greedy
                                else _sample_cdf(p_cdf[c], p_table[c], u_final[r]))
        accepted_out[r] = n


def chain_rows_kernel(p_rows, q_rows, draft_tokens, greedy, u_accept, u_final, work,
                      tokens_out):
    """Reference of the per-position-rows chain verifier (returns accepted count)."""
    k = draft_tokens.shape[0]
    tokens_out[:] = -1
    for j in range(k):
        x = int(draft_tokens[j])
        target = int(np.argmax(p_rows[j]))
        ok = x == target if greedy else u_accept[j] < p_rows[j, x] / q_rows[j, x]
        if ok:
            tokens_out[j] = x
            continue
        tokens_out[j] = target if greedy else _sample_linear(
            np.maximum(p_rows[j] - q_rows[j], 0.0), u_final[0])
        return j
    tokens_out[k] = int(np.argmax(p_rows[k])) if greedy else _sample_linear(p_rows[k], u_final[0])
    return k


def tree_verify_kernel(p_table, q_table, parent, token, node_ctx, num_nodes, proposal,
                       greedy, u_accept, u_final, work, accepted_out, tokens_out):
    """Reference of the tree verifier (same arguments; ``work`` is unused)."""
    tokens_out[:] = -1
    for r in range(num_nodes.shape[0]):
        cur, depth = 0, 0
        nodes = np.arange(1, num_nodes[r] + 1)
        while True:
            c = node_ctx[r, cur]
            children = nodes[parent[r, nodes] == cur]
            if greedy:
                target_token = int(np.argmax(p_table[c]))
                hits = children[token[r, children] == target_token]
                tokens_out[r, depth] = target_token
                if hits.size == 0:
                    break
                cur, depth = int(hits[0]), depth + 1
                continue
            p_cur = p_table[c].copy()
            drawn, nxt = set(), -1
            for i in children:
                x = int(token[r, i])
                p_cur = p_cur / p_cur.sum()
                if proposal == 2:
                    q_i = np.zeros_like(p_cur)
                    q_i[x] = 1.0
                elif proposal == 1:   # q over the mass left when x was drawn (summed in order)
                    q_i = q_table[c] / sum(float(q_table[c, v]) for v in range(q_table.shape[1])
                                           if v not in drawn)
                else:
                    q_i = q_table[c]
                if u_accept[r, i] < p_cur[x] / q_i[x]:
                    nxt = int(i)
                    break
                p_cur = np.maximum(p_cur - q_i, 0.0)
                drawn.add(x)
            if nxt < 0:
                tokens_out[r, depth] = _sample_linear(p_cur, u_final[r])
                break
            tokens_out[r, depth] = token[r, nxt]
            cur, depth = nxt, depth + 1
        accepted_out[r] = depth
