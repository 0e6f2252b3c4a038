"""The simulator's engine loop (OnlineSpec Algorithm 1 over a `TargetStream`).

Per round t, in the order of `specloop.strategies.base`::

    plan = policy.plan(PlanState(t, L))        # k, or a TreePlan
    draft k tokens from q (the next position's context follows the drafted token)
    verify against p along the drafted prefix  -> RoundRecord (times from the cost model)
    policy.observe(record)
    params = learner.step(params, grads, loss) # ParametricDraft + learner only

The loss of round t is OnlineSpec's f_t(w_t) = -sum_x p_t(x) log q_{w_t}(x | c_t) at the
round's first position (Assumption 1), recorded in ``RoundRecord.loss``.
"""
from __future__ import annotations

import numpy as np

from specloop.record import RoundRecord, Trace
from specloop.sim.drafts import ParametricDraft
from specloop.sim.rounds import _check_mode, chain_round, round_record, validate_table
from specloop.sim.trees import simulate_tree_tables
from specloop.strategies.base import PlanState

__all__ = ["run_chain", "autoregressive_trace", "speedup_vs_autoregressive", "as_generator"]


def as_generator(rng) -> np.random.Generator:
    """A Generator from a Generator, an int seed or None (seed 0)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng(0)
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be a numpy Generator or an int seed, got {type(rng).__name__}")


class _QSource:
    """Uniform access to a draft: q(t, c) -> (V,) and q_table(t) -> (C, V)."""

    def __init__(self, draft_or_q, stream, params):
        self.obj, self.params = draft_or_q, params
        V, C = stream.vocab_size, stream.num_contexts
        if isinstance(draft_or_q, ParametricDraft):
            if (draft_or_q.vocab_size, draft_or_q.num_contexts) != (V, C):
                raise ValueError(f"draft has (V, C) = ({draft_or_q.vocab_size}, "
                                 f"{draft_or_q.num_contexts}), stream has ({V}, {C})")
            if params is None:
                raise ValueError("a ParametricDraft needs params= (e.g. draft.init_params(rng))")
            self.kind = "parametric"
        elif hasattr(draft_or_q, "q_table"):
            self.kind = "table_fn"
        elif callable(draft_or_q):
            self.kind = "callable"
        else:
            table = validate_table(draft_or_q, "q_draft", vocab_size=V)
            if table.shape[0] not in (1, C):
                raise ValueError(f"q_draft must have 1 or {C} rows (contexts), got {table.shape[0]}")
            self.table = np.repeat(table, C, axis=0) if table.shape[0] == 1 else table
            self.kind = "array"

    def q(self, t: int, c: int) -> np.ndarray:
        if self.kind == "parametric":
            return self.obj.q_draft(self.params, c)
        if self.kind == "table_fn":
            return self.obj.q_table(t)[c]
        if self.kind == "callable":
            return np.asarray(self.obj(t, c), dtype=np.float64)
        return self.table[c]

    def q_table(self, t: int, num_contexts: int) -> np.ndarray:
        if self.kind == "parametric":
            return self.obj.q_table(self.params)
        if self.kind == "table_fn":
            return self.obj.q_table(t)
        if self.kind == "callable":
            return np.stack([self.q(t, c) for c in range(num_contexts)])
        return self.table


def _draw(q: np.ndarray, greedy: bool, rng: np.random.Generator) -> int:
    if greedy:
        return int(np.argmax(q))
    cdf = np.cumsum(q)
    x = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), q.size - 1)
    while x > 0 and q[x] <= 0:
        x -= 1
    return x


def _chain(stream, src: _QSource, t: int, k: int, rng, mode: str, cost_model, stream_index,
           loss) -> RoundRecord:
    greedy = mode == "greedy"
    c = stream.context(t)
    contexts, q_rows, tokens = [c], [], []
    for _ in range(k):
        q = src.q(t, c)
        x = _draw(q, greedy, rng)
        q_rows.append(q)
        tokens.append(x)
        c = stream.next_context(c, x)
        contexts.append(c)
    p_rows = np.stack([stream.target_for(t, ctx) for ctx in contexts])
    q_arg = np.stack(q_rows) if k else np.zeros((0, stream.vocab_size))
    return chain_round(p_rows, q_arg, k, rng, mode, cost_model, draft_tokens=tokens,
                       round_index=t, stream_index=stream_index, loss=loss)


def _tree(stream, src: _QSource, t: int, tree_plan, rng, mode, cost_model, stream_index,
          loss) -> RoundRecord:
    batch = simulate_tree_tables(stream.target_table(t), src.q_table(t, stream.num_contexts),
                                 [stream.context(t)], tree_plan, rng, mode, stream.iid)
    return round_record(t, stream_index, int(batch.num_nodes[0]), int(batch.depth[0]),
                        int(batch.num_nodes[0]) + 1, int(batch.accepted[0]), cost_model,
                        loss=loss)


def run_chain(stream, draft_or_q, policy, rounds: int | None = None, rng=None, cost_model=None,
              mode: str = "sampling", params=None, learner=None, stream_index: int = 0,
              prompt_length: int = 0, writer=None, return_params: bool = False):
    """Run ``rounds`` rounds of draft -> verify -> observe (-> learn) on a stream.

    Args:
        stream: a `TargetStream` (targets p_t, contexts, chain correlation).
        draft_or_q: a `ParametricDraft` (with ``params``), an object with
            ``q_table(t) -> (C, V)`` (e.g. `NoisyDraft`), a callable (t, c) -> (V,), or
            a fixed float64 (V,) / (C, V) array.
        policy: a `DraftPolicy` (``plan(PlanState) -> DraftPlan``, ``observe(record)``);
            a plan with ``tree`` set runs a tree round.
        rounds: rounds to run (default: all of the stream's).
        rng: numpy Generator or int seed (all simulation randomness).
        cost_model: `LinearCost` / `TableCost` / None (zero times).
        mode: "sampling" or "greedy".
        params: ParametricDraft parameters [U, W, b] played at round 0.
        learner: optional `OnlineLearner`; ``step(params, grads, loss)`` after each
            round with the gradient of f_t at the played params.
        stream_index, prompt_length: recorded / used for PlanState.context_length.
        writer: optional `TraceWriter`; each record is appended as it completes.
        return_params: also return the final params.

    Returns:
        `Trace` (meta: scenario, vocab_size, mode), or (Trace, params).

    Raises:
        ValueError: rounds outside [1, stream.rounds], unknown mode, a draft whose
            vocabulary / contexts do not match the stream, a learner without a
            ParametricDraft.
    """
    _check_mode(mode)
    rounds = stream.rounds if rounds is None else int(rounds)
    if not 1 <= rounds <= stream.rounds:
        raise ValueError(f"rounds must be in [1, {stream.rounds}] (the stream's length), got {rounds}")
    if learner is not None and not isinstance(draft_or_q, ParametricDraft):
        raise ValueError("a learner needs a ParametricDraft (with analytic gradients)")
    gen = as_generator(rng)
    src = _QSource(draft_or_q, stream, params)
    trace = Trace([], {"scenario": stream.scenario, "vocab_size": stream.vocab_size,
                       "num_contexts": stream.num_contexts, "mode": mode})
    committed = 0
    for t in range(rounds):
        plan = policy.plan(PlanState(round_index=t, context_length=prompt_length + committed))
        loss, grads = float("nan"), None
        if src.kind == "parametric":
            loss, grads = draft_or_q.loss_and_grad(src.params, stream.context(t), stream.target(t))
        if plan.tree is not None:
            record = _tree(stream, src, t, plan.tree, gen, mode, cost_model, stream_index, loss)
        else:
            record = _chain(stream, src, t, int(plan.num_draft_tokens), gen, mode, cost_model,
                            stream_index, loss)
        trace.append(record)
        if writer is not None:
            writer.append(record)
        committed += record.tokens_per_round
        policy.observe(record)
        if learner is not None:
            src.params = learner.step(src.params, grads, loss)
    return (trace, src.params) if return_params else trace


def autoregressive_trace(num_tokens: int, cost_model) -> Trace:
    """Plain autoregressive decoding of ``num_tokens`` tokens: one round per token,
    one one-token target forward each (the speedup baseline)."""
    if int(num_tokens) < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    record = round_record(0, 0, 0, 0, 1, 0, cost_model)
    return Trace([record] * int(num_tokens), {"method": "autoregressive"})


def speedup_vs_autoregressive(trace: Trace, cost_model) -> float:
    """gamma = tokens/s of ``trace`` / tokens/s of autoregressive decoding (1 / A),
    OnlineSpec Eq. (7) when the trace's times come from ``cost_model``."""
    return trace.tokens_per_second() * cost_model.verify_seconds(1)
