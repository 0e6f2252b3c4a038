"""Tree rounds: draft trees and their verification.

Drafting (`build_tree`, per round, NumPy):

* static trees, ``TreePlan(branching=(b_1, .., b_D))``: every node at depth d - 1
  gets b_d children (SpecInfer's token trees; Medusa's fixed trees);
* EAGLE-2 dynamic trees, ``TreePlan(top_k=K, max_depth=D, verify_size=V)``: at each
  depth the K nodes of the current layer with the largest cumulative draft
  probability (path_prob = product of q along the path) are expanded with their
  top-K tokens; finally the V nodes with the largest path_prob are kept
  (Li et al. 2024, EAGLE-2, Section 4). Keeping the top V by path_prob keeps a
  tree because a child's path_prob never exceeds its parent's (ties broken by depth).

Children are chosen by a ``proposal``: ``"iid"`` (b draws from q with replacement,
SpecInfer), ``"without-replacement"`` (b sequential draws from q renormalised without
earlier siblings) or ``"deterministic"`` (the top-b tokens of q, EAGLE/Medusa).
Verification (`specloop.sim._kernels.tree_verify_kernel`): greedy (follow the
target's argmax), or multi-draft recursive rejection sampling in which each
sibling is a speculative-sampling step with its own proposal (q, q without earlier
siblings, or a point mass), so the committed tokens are distributed exactly as p
whatever the tree.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from specloop.record import Trace
from specloop.sim import _kernels as K
from specloop.sim.rounds import _BatchSummaries, _check_mode, round_record, validate_table
from specloop.sim.streams import next_context
from specloop.strategies.base import TreePlan
from specloop.strategies.subtree import reindex_parents

__all__ = ["PROPOSALS", "DraftTree", "TreeBatch", "build_tree", "grow_tree", "prune_tree", "verify_trees", "tree_round",
           "simulate_tree_tables", "theory_tokens_tree"]

PROPOSALS = {"iid": K.PROPOSAL_IID, "without-replacement": K.PROPOSAL_NO_REPLACE,
             "deterministic": K.PROPOSAL_DETERMINISTIC}


@dataclass
class DraftTree:
    """One drafted tree; node 0 is the root (the last committed position).

    Attributes (all (N + 1,)): ``parent`` int64 (parent[0] = -1), ``token`` int64
    (token[0] = -1), ``node_ctx`` int64 context after the node, ``depth`` int64,
    ``path_prob`` float64 cumulative draft probability. ``proposal`` names how
    children were chosen (a key of `PROPOSALS`).
    """

    parent: np.ndarray
    token: np.ndarray
    node_ctx: np.ndarray
    depth: np.ndarray
    path_prob: np.ndarray
    proposal: str

    @property
    def num_nodes(self) -> int:
        """Drafted nodes N (the root excluded)."""
        return int(self.parent.shape[0] - 1)

    @property
    def tree_depth(self) -> int:
        return int(self.depth.max())


def default_proposal(plan: TreePlan, mode: str) -> str:
    """EAGLE-2 dynamic trees and greedy mode: "deterministic"; otherwise "iid"."""
    return "deterministic" if plan.top_k is not None or mode == "greedy" else "iid"


def _children(q: np.ndarray, count: int, proposal: str, rng: np.random.Generator) -> np.ndarray:
    support = np.flatnonzero(q > 0)
    if proposal == "deterministic":
        order = support[np.argsort(-q[support], kind="stable")]
        return order[: min(count, order.size)]
    if proposal == "iid":
        cdf = np.cumsum(q)
        draws = np.searchsorted(cdf, rng.random(count) * cdf[-1], side="right")
        return np.minimum(draws, q.size - 1)
    remaining = q.copy()
    out = []
    for _ in range(min(count, support.size)):
        cdf = np.cumsum(remaining)
        x = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), q.size - 1)
        while remaining[x] <= 0:
            x -= 1
        out.append(x)
        remaining[x] = 0.0
    return np.asarray(out, dtype=np.int64)


class _Builder:
    def __init__(self, context: int):
        self.parent, self.token, self.ctx = [-1], [-1], [int(context)]
        self.depth, self.prob = [0], [1.0]

    def add(self, parent: int, token: int, ctx: int, prob: float) -> int:
        self.parent.append(parent)
        self.token.append(int(token))
        self.ctx.append(ctx)
        self.depth.append(self.depth[parent] + 1)
        self.prob.append(self.prob[parent] * prob)
        return len(self.parent) - 1


def build_tree(q_table, context: int, plan: TreePlan, rng: np.random.Generator,
               mode: str = "sampling", iid: bool = False, proposal: str | None = None) -> DraftTree:
    """Draft one tree from per-context draft rows.

    Args:
        q_table: float64 (C, V) draft distributions per context (validated).
        context: root context c in [0, C).
        plan: a `TreePlan` (static ``branching`` or dynamic ``top_k``).
        rng: generator for sampled children. mode: "sampling" or "greedy".
        iid: children keep their parent's context (else `next_context`).
        proposal: None (`default_proposal`) or a key of `PROPOSALS`.

    Raises:
        ValueError: unknown proposal; a sampled proposal with a verification budget
            (pruning siblings by their tokens would break the proposals' law);
            a dynamic tree with a sampled proposal.
    """
    tree = None
    for tree in grow_tree(q_table, context, plan, rng, mode, iid, proposal):
        pass
    return _prune(tree, plan.verify_size)


def grow_tree(q_table, context: int, plan: TreePlan, rng: np.random.Generator,
              mode: str = "sampling", iid: bool = False, proposal: str | None = None):
    """`build_tree` one depth at a time: yields the `DraftTree` drafted so far (unpruned)
    after each level, so an engine can ask a policy's ``continue_drafting`` between
    levels and stop; the randomness drawn for the levels yielded is that of `build_tree`.

    Raises:
        ValueError: as `build_tree`.
    """
    proposal = proposal or default_proposal(plan, mode)
    if proposal not in PROPOSALS:
        raise ValueError(f"unknown proposal {proposal!r}; expected one of {sorted(PROPOSALS)}")
    if proposal != "deterministic" and (plan.top_k is not None or plan.verify_size is not None):
        raise ValueError("dynamic trees and verify_size pruning choose nodes by their tokens; "
                         "use proposal='deterministic' (lossless with point-mass proposals)")
    num_contexts = q_table.shape[0]
    b = _Builder(context)
    layer = [0]
    for d in range(plan.max_depth):
        if plan.top_k is not None:
            width = plan.top_k
            if d > 0:
                layer = sorted(layer, key=lambda i: -b.prob[i])[:plan.top_k]
        else:
            if d >= len(plan.branching):
                break
            width = plan.branching[d]
        new_layer = []
        for node in layer:
            c = b.ctx[node]
            q = q_table[c]
            for x in _children(q, width, proposal, rng):
                new_layer.append(b.add(node, x, next_context(c, int(x), num_contexts, iid), q[x]))
        layer = new_layer
        yield DraftTree(np.asarray(b.parent, np.int64), np.asarray(b.token, np.int64),
                        np.asarray(b.ctx, np.int64), np.asarray(b.depth, np.int64),
                        np.asarray(b.prob), proposal)


def prune_tree(tree: DraftTree, verify_size: int | None) -> DraftTree:
    """The tree cut to its best ``verify_size`` nodes (see `_prune`); ValueError for a
    sampled proposal, whose law pruning by tokens would break."""
    if verify_size is not None and tree.num_nodes > verify_size and tree.proposal != "deterministic":
        raise ValueError("verify_size pruning chooses nodes by their tokens; use proposal='deterministic' "
                         "(lossless with point-mass proposals)")
    return _prune(tree, verify_size)


def verify_trees(p_table, q_table, trees: list[DraftTree], mode: str,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Verify drafted trees (greedy or recursive rejection sampling, the Numba kernel):
    (accepted depth int64 (R,), committed tokens int64 (R, Dmax + 1), -1 padded)."""
    return _verify(p_table, q_table, trees, _check_mode(mode), rng)


def _prune(tree: DraftTree, verify_size: int | None) -> DraftTree:
    """Keep the ``verify_size`` nodes of largest path_prob (ties: shallower first)."""
    if verify_size is None or tree.num_nodes <= verify_size:
        return tree
    nodes = np.arange(1, tree.num_nodes + 1)
    order = np.lexsort((nodes, tree.depth[1:], -tree.path_prob[1:]))
    keep = np.sort(nodes[order[:verify_size]])
    keep = np.concatenate(([0], keep))
    # closed under ancestors (path_prob is monotone), so re-indexing cannot lose a parent
    parent = reindex_parents(tree.parent, keep)
    return DraftTree(parent, tree.token[keep], tree.node_ctx[keep], tree.depth[keep],
                     tree.path_prob[keep], tree.proposal)


@dataclass
class TreeBatch(_BatchSummaries):
    """Many simulated tree rounds.

    Attributes: ``accepted`` int64 (R,) accepted depth; ``num_nodes`` int64 (R,)
    drafted nodes; ``depth`` int64 (R,) drafted depth; ``tokens`` int64 (R, Dmax + 1)
    committed tokens (-1 padded); ``contexts`` int64 (R,).
    """

    accepted: np.ndarray
    num_nodes: np.ndarray
    depth: np.ndarray
    tokens: np.ndarray
    contexts: np.ndarray

    def to_trace(self, cost_model, stream_index: int = 0, meta: dict | None = None) -> Trace:
        """One `RoundRecord` per round: num_draft_tokens = nodes, tree_depth = depth,
        verified_tokens = nodes + 1, draft time = depth draft steps."""
        return Trace([round_record(r, stream_index, int(self.num_nodes[r]), int(self.depth[r]),
                                   int(self.num_nodes[r]) + 1, int(self.accepted[r]), cost_model)
                      for r in range(self.rounds)], meta)


def _verify(p_table, q_table, trees: list[DraftTree], greedy: bool,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    rounds = len(trees)
    width = max(t.num_nodes for t in trees) + 1
    dmax = max(t.tree_depth for t in trees)
    parent = np.full((rounds, width), -1, dtype=np.int64)
    token = np.full((rounds, width), -1, dtype=np.int64)
    ctx = np.zeros((rounds, width), dtype=np.int64)
    for r, t in enumerate(trees):
        n = t.num_nodes + 1
        parent[r, :n], token[r, :n], ctx[r, :n] = t.parent, t.token, t.node_ctx
    num_nodes = np.asarray([t.num_nodes for t in trees], dtype=np.int64)
    proposal = PROPOSALS[trees[0].proposal]
    u_accept, u_final = rng.random((rounds, width)), rng.random(rounds)
    accepted = np.empty(rounds, dtype=np.int64)
    tokens = np.empty((rounds, dmax + 1), dtype=np.int64)
    K.tree_verify_kernel(p_table, q_table, parent, token, ctx, num_nodes, proposal, greedy,
                         u_accept, u_final, np.empty(p_table.shape[1]), accepted, tokens)
    return accepted, tokens


def simulate_tree_tables(p_table, q_table, contexts, plan: TreePlan, rng: np.random.Generator,
                         mode: str = "sampling", iid: bool = False,
                         proposal: str | None = None) -> TreeBatch:
    """Draft and verify one tree per round over per-context tables.

    Args:
        p_table, q_table: float64 (C, V) or (V,) target / draft rows.
        contexts: int (R,) root contexts. plan: `TreePlan`. rng: generator.
        mode: "sampling" (recursive rejection sampling) or "greedy".
        iid: children keep the parent's context. proposal: see `build_tree`.

    Raises:
        ValueError: invalid tables / contexts / proposal (see `build_tree`).
    """
    greedy = _check_mode(mode)
    if not isinstance(plan, TreePlan):
        raise ValueError(f"plan must be a TreePlan, got {type(plan).__name__}")
    p = validate_table(p_table, "p_target")
    q = validate_table(q_table, "q_draft", vocab_size=p.shape[1])
    if q.shape[0] != p.shape[0]:
        raise ValueError(f"p_target has {p.shape[0]} context rows but q_draft has {q.shape[0]}")
    ctx = np.asarray(contexts, dtype=np.int64).reshape(-1)
    if ctx.size == 0 or (ctx < 0).any() or (ctx >= p.shape[0]).any():
        raise ValueError(f"contexts must be a non-empty array of ints in [0, {p.shape[0]})")
    trees = [build_tree(q, int(c), plan, rng, mode, iid, proposal) for c in ctx]
    accepted, tokens = _verify(p, q, trees, greedy, rng)
    return TreeBatch(accepted, np.asarray([t.num_nodes for t in trees], dtype=np.int64),
                     np.asarray([t.tree_depth for t in trees], dtype=np.int64), tokens, ctx)


def tree_round(p_target, q_draft, plan: TreePlan, rng: np.random.Generator,
               mode: str = "sampling", cost_model=None, context: int = 0, iid: bool | None = None,
               proposal: str | None = None, round_index: int = 0, stream_index: int = 0,
               return_tokens: bool = False):
    """Simulate one tree round and return its `RoundRecord` (and committed tokens).

    Args:
        p_target, q_draft: float64 (V,) (one distribution at every node) or (C, V)
            per-context rows. context: root context. iid: default True for (V,) input.
        Other arguments as `simulate_tree_tables`; cost_model prices ``tree_depth``
        draft steps and one forward over nodes + 1 verified tokens.
    """
    p = validate_table(p_target, "p_target")
    iid = p.shape[0] == 1 if iid is None else iid
    batch = simulate_tree_tables(p, q_draft, [context], plan, rng, mode, iid, proposal)
    record = batch.to_trace(cost_model)[0]
    record = dataclasses.replace(record, round_index=round_index, stream_index=stream_index)
    if return_tokens:
        return record, batch.tokens[0, : batch.accepted[0] + 1]
    return record


def theory_tokens_tree(p_target, q_draft, plan: TreePlan, mode: str = "sampling",
                       proposal: str | None = None) -> float | None:
    """Expected committed tokens per round of a tree when every node sees the same
    p and q (Assumption 1 for trees); None where no closed form is implemented.

    * deterministic candidates: the tree is a function of q; node i is accepted
      given its parent with probability p(token_i) (sampling: a point-mass proposal
      is accepted exactly when the committed token equals it) or 1{token_i = argmax p}
      (greedy); `specloop.theory.expected_tokens_tree` sums the path products.
    * "iid" static trees under sampling: level d is passed with probability
      s_d = sum_j multidraft_sibling_acceptance(p, q, b_d)_j, so
      E[n] = 1 + sum_d prod_{i<=d} s_i (`expected_tokens_positional`).
    """
    from specloop.theory import (expected_tokens_positional, expected_tokens_tree,
                                 multidraft_sibling_acceptance)

    p = validate_table(p_target, "p_target")[0]
    q = validate_table(q_draft, "q_draft", vocab_size=p.size)[0]
    proposal = proposal or default_proposal(plan, mode)
    if proposal == "deterministic":
        tree = build_tree(q[None, :], 0, plan, np.random.default_rng(0), mode, True, proposal)
        tokens = tree.token[1:]
        probs = (tokens == np.argmax(p)).astype(float) if mode == "greedy" else p[tokens]
        return float(expected_tokens_tree(tree.parent[1:] - 1, probs))
    if proposal == "iid" and mode == "sampling" and plan.branching is not None:
        levels = [multidraft_sibling_acceptance(p, q, b).sum() for b in plan.branching]
        return float(expected_tokens_positional(np.clip(levels, 0.0, 1.0)))
    return None
