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

import dataclasses

import numpy as np

from specloop.record import RoundRecord, Trace
from specloop.sim.drafts import ParametricDraft
from specloop.sim.rounds import _check_mode, chain_round, round_record, validate_table
from specloop.sim.trees import grow_tree, prune_tree, verify_trees
from specloop.strategies.base import PlanState, TreeCandidates
from specloop.strategies.engine import chain_step, drive_rounds, layer_draft_step

__all__ = ["SimChainEngine", "run_chain", "autoregressive_trace", "speedup_vs_autoregressive", "as_generator"]


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


class SimChainEngine:
    """The simulator's chain and tree rounds as a `specloop.strategies.engine.RoundEngine`.

    Round t drafts from q (token by token for a chain, level by level for a tree, asking
    the policy's hooks through `RoundHooks`), verifies against p (`chain_round` /
    the tree kernel) and records times from ``cost_model`` in seconds (zero without
    one). With a `ParametricDraft`, f_t(w_t) and its gradient at the played parameters
    are computed when the round starts; ``learn`` applies ``learner.step`` to them.

    Args: see `run_chain`.
    """

    def __init__(self, stream, draft_or_q, rng=None, cost_model=None, mode: str = "sampling",
                 params=None, stream_index: int = 0, prompt_length: int = 0):
        _check_mode(mode)
        self.stream, self.draft_model, self.mode = stream, draft_or_q, mode
        self.src = _QSource(draft_or_q, stream, params)
        self.rng, self.cost_model = as_generator(rng), cost_model
        self.stream_index, self.prompt_length = int(stream_index), int(prompt_length)
        self.round_index, self.committed = 0, 0

    @property
    def params(self):
        """The draft parameters played next (ParametricDraft) or None."""
        return self.src.params

    def plan_state(self) -> PlanState:
        return PlanState(round_index=self.round_index, context_length=self.prompt_length + self.committed)

    def start_round(self, plan) -> int:
        t = self.round_index
        if t >= self.stream.rounds:
            raise ValueError(f"the stream has {self.stream.rounds} rounds; round {t} does not exist")
        self._plan = plan
        self._loss, self._grads = float("nan"), None
        if self.src.kind == "parametric":
            self._loss, self._grads = self.draft_model.loss_and_grad(self.src.params, self.stream.context(t),
                                                               self.stream.target(t))
        if plan.tree is not None:
            return int(plan.tree.max_depth)
        return int(plan.num_draft_tokens)

    def draft(self, hooks) -> None:
        if self._plan.tree is not None:
            self._draft_tree(hooks)
        else:
            self._draft_chain(hooks)

    def _draft_chain(self, hooks) -> None:
        stream, t, greedy = self.stream, self.round_index, self.mode == "greedy"
        c = stream.context(t)
        contexts, q_rows, tokens, path = [c], [], [], 1.0
        length = self.plan_state().context_length
        for depth in range(1, hooks.cap + 1):
            q = self.src.q(t, c)
            x = _draw(q, greedy, self.rng)
            q_rows.append(q)
            tokens.append(x)
            path *= float(q[x])
            c = stream.next_context(c, x)
            contexts.append(c)
            if not hooks.continue_drafting(chain_step(depth, length, float(q[x]), path)):
                break
        self._chain = (contexts, q_rows, tokens)

    def _draft_tree(self, hooks) -> None:
        stream, t, plan = self.stream, self.round_index, self._plan.tree
        q_table = self.src.q_table(t, stream.num_contexts)
        length, tree, parent_best = self.plan_state().context_length, None, 1.0
        for tree in grow_tree(q_table, stream.context(t), dataclasses.replace(plan, verify_size=None),
                              self.rng, self.mode, stream.iid):
            depth = tree.tree_depth
            layer = tree.path_prob[tree.depth == depth]
            if not hooks.continue_drafting(layer_draft_step(depth, length, layer, parent_best)):
                break
            parent_best = float(layer.max()) if layer.size else parent_best
        nodes = TreeCandidates(tree.tree_depth, length, tree.path_prob[1:].copy())
        self._tree = (q_table, prune_tree(tree, hooks.verify_size(nodes) or None))

    def verify(self, hooks) -> RoundRecord:
        t, stream = self.round_index, self.stream
        if self._plan.tree is not None:
            q_table, tree = self._tree
            p_table = validate_table(stream.target_table(t), "p_target")
            accepted, _ = verify_trees(p_table, q_table, [tree], self.mode, self.rng)
            record = round_record(t, self.stream_index, tree.num_nodes, tree.tree_depth, tree.num_nodes + 1,
                                  int(accepted[0]), self.cost_model, loss=self._loss)
        else:
            contexts, q_rows, tokens = self._chain
            k = len(tokens)
            p_rows = np.stack([stream.target_for(t, ctx) for ctx in contexts])
            q_arg = np.stack(q_rows) if k else np.zeros((0, stream.vocab_size))
            record = chain_round(p_rows, q_arg, k, self.rng, self.mode, self.cost_model, draft_tokens=tokens,
                                 round_index=t, stream_index=self.stream_index, loss=self._loss)
        self.round_index += 1
        self.committed += record.tokens_per_round
        return record

    def learn(self, learner) -> None:
        """``params <- learner.step(params, grad f_t(w_t), f_t(w_t))`` (ParametricDraft only)."""
        if self._grads is None:
            raise ValueError("a learner needs a ParametricDraft (with analytic gradients)")
        self.src.params = learner.step(self.src.params, self._grads, self._loss)


def run_chain(stream, draft_or_q, policy, rounds: int | None = None, rng=None, cost_model=None,
              mode: str = "sampling", params=None, learner=None, stream_index: int = 0,
              prompt_length: int = 0, writer=None, return_params: bool = False):
    """Run ``rounds`` rounds of draft -> verify -> observe (-> learn) on a stream,
    through the one round driver (`specloop.strategies.engine.drive_round` over a
    `SimChainEngine`): chain plans draft token by token, tree plans level by level, and
    the policy's ``continue_drafting`` / ``verify_size`` hooks are honoured.

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
    engine = SimChainEngine(stream, draft_or_q, rng, cost_model, mode, params, stream_index, prompt_length)
    trace = Trace([], {"scenario": stream.scenario, "vocab_size": stream.vocab_size,
                       "num_contexts": stream.num_contexts, "mode": mode})
    on_record = trace.append if writer is None else (lambda r: (trace.append(r), writer.append(r)))
    drive_rounds(policy, engine, rounds, learner, on_record)
    return (trace, engine.params) if return_params else trace


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
