"""Batched simulation of a whole stream with a fixed draft length or tree plan.

The stream is cut into segments of consecutive rounds whose target tables are equal
(one segment for "stationary", one per domain segment for "piecewise", one per
policy update for "trained-target", one per round for "smooth"/"fast"); each
segment is simulated in one kernel call with its own O(C V) table setup.
Theory values (Assumption 1) come from `specloop.theory` per round context.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specloop.sim.rounds import ChainBatch, prepare_tables, simulate_chain_tables
from specloop.sim.trees import TreeBatch, simulate_tree_tables, theory_tokens_tree
from specloop.strategies.base import TreePlan

__all__ = ["StreamResult", "simulate_stream"]


@dataclass
class StreamResult:
    """A simulated stream.

    Attributes:
        batch: the `ChainBatch` or `TreeBatch` of all rounds.
        theory_tokens: float64 (R,) Assumption-1 expected committed tokens of each
            round from its first-position p_t and q_t (NaN where no closed form).
        first_acceptance: float64 (R,) Acc_t = sum_x min(p_t, q_t) at each round's
            first position.
    """

    batch: ChainBatch | TreeBatch
    theory_tokens: np.ndarray
    first_acceptance: np.ndarray


def _segments(stream, rounds: int):
    start = 0
    key = stream.state_key(0)
    for t in range(1, rounds):
        new = stream.state_key(t)
        if new != key:
            yield start, t
            start, key = t, new
    yield start, rounds


def _concat(parts, cls):
    if cls is ChainBatch:
        width = max(p.tokens.shape[1] for p in parts)
        kw = max(p.position_acceptance.shape[1] for p in parts)
        tokens = np.concatenate([np.pad(p.tokens, ((0, 0), (0, width - p.tokens.shape[1])),
                                        constant_values=-1) for p in parts])
        acc = np.concatenate([np.pad(p.position_acceptance,
                                     ((0, 0), (0, kw - p.position_acceptance.shape[1])),
                                     constant_values=np.nan) for p in parts])
        return ChainBatch(np.concatenate([p.accepted for p in parts]),
                          np.concatenate([p.num_draft_tokens for p in parts]), tokens, acc,
                          np.concatenate([p.contexts for p in parts]))
    width = max(p.tokens.shape[1] for p in parts)
    tokens = np.concatenate([np.pad(p.tokens, ((0, 0), (0, width - p.tokens.shape[1])),
                                    constant_values=-1) for p in parts])
    return TreeBatch(*(np.concatenate([getattr(p, f) for p in parts])
                       for f in ("accepted", "num_nodes", "depth")), tokens,
                     np.concatenate([p.contexts for p in parts]))


def simulate_stream(stream, draft, plan, rng: np.random.Generator, rounds: int | None = None,
                    mode: str = "sampling", proposal: str | None = None) -> StreamResult:
    """Simulate ``rounds`` rounds of a stream with a fixed chain length or tree plan.

    Args:
        stream: a `TargetStream`.
        draft: an object with ``q_table(t) -> (C, V)`` (e.g. `NoisyDraft`).
        plan: int k >= 0 (chain) or a `TreePlan`.
        rng: generator. rounds: default all. mode: "sampling" / "greedy".
        proposal: tree sibling proposal (see `specloop.sim.trees.build_tree`).

    Raises:
        ValueError: bad rounds / plan / tables (from the round APIs).
    """
    from specloop.theory import acceptance_rate, expected_tokens_chain

    rounds = stream.rounds if rounds is None else int(rounds)
    if not 1 <= rounds <= stream.rounds:
        raise ValueError(f"rounds must be in [1, {stream.rounds}], got {rounds}")
    is_tree = isinstance(plan, TreePlan)
    parts, theory, first_acc = [], np.empty(rounds), np.empty(rounds)
    for start, stop in _segments(stream, rounds):
        p, q = stream.target_table(start), draft.q_table(start)
        ctx = stream.contexts[start:stop]
        row_acc = acceptance_rate(p, q)
        first_acc[start:stop] = row_acc[ctx]
        if is_tree:
            parts.append(simulate_tree_tables(p, q, ctx, plan, rng, mode, stream.iid, proposal))
            per_ctx = {c: theory_tokens_tree(p[c], q[c], plan, mode, proposal) for c in np.unique(ctx)}
            theory[start:stop] = [np.nan if per_ctx[c] is None else per_ctx[c] for c in ctx]
        else:
            parts.append(simulate_chain_tables(None, None, ctx, plan, rng, mode, stream.iid,
                                               tables=prepare_tables(p, q)))
            if mode == "greedy":
                hit = (np.argmax(p, axis=1) == np.argmax(q, axis=1)).astype(float)
                theory[start:stop] = expected_tokens_chain(hit[ctx], plan)
            else:
                theory[start:stop] = expected_tokens_chain(row_acc[ctx], plan)
    batch = _concat(parts, TreeBatch if is_tree else ChainBatch)
    return StreamResult(batch, theory, first_acc)
