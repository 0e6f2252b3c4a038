"""LTD environments over the simulator: EAGLE-2 dynamic trees over a synthetic
stream whose difficulty changes with the context, priced by the measured
verify-cost table.

World (`TreeWorld`). One Zipf base of logits z(c) per context (`make_stream`,
"stationary"); a *regime* g sets the target temperature T_g and the draft's logit
noise s_g: p_g(. | c) = softmax(z(c) / T_g) and q_g(. | c) = `NoisyDraft` of that
stream (softmax((z(c) + s_g eps_c) / T_g)). Low T / low noise = easy text (long
accepted paths, a confident draft), high = hard text. An episode is one prompt of
``rounds_per_episode`` cycles in a random regime that switches with probability
``regime_switch_prob`` per cycle (code <-> prose), and a context length L that starts
at a random prompt length and grows by the committed tokens. Along a path the
context follows `specloop.sim.streams.next_context` (chain correlation).

Drafting (`specloop.sim.trees.build_tree`, EAGLE-2 top_k with deterministic
children): the tree grown to depth D is the depth-<=D part of the tree grown to
max_depth (a layer depends only on earlier layers), so the engine drafts the full
tree once per (regime, root context) -- cached -- and reveals one layer per draft
step. Verification of the best V nodes (by path probability, ties shallower first,
as `build_tree`'s pruning) is greedy or recursive rejection sampling with point-mass
proposals (SpecInfer Alg. 2; lossless), in NumPy here; `tests/sim/test_ltd_env.py`
checks it against `specloop.sim.trees.simulate_tree_tables`.

Randomness: each prompt splits its generator into a *world* stream (regime, regime
switches, root contexts, prompt length) and a *verification* stream, so policies
evaluated with the same seed meet the same text (common random numbers: their
tokens/s differences are not swamped by which regimes the prompts happened to hit).

Costs (`TableCost`): verify time = the measured table at V + 1 tokens
(``specloop/sim/data``; without it, the built-in SmolLM2-135M CPU numbers of
docs/design.md, section "Targets and measured costs"),
made non-decreasing and extended by `monotone_cost_table`; a
draft step costs ``draft_cost_ratio`` x one target forward (stated ratio: an
EAGLE-style head step over a reduced vocabulary is ~2 ms against ~33 ms).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from specloop.record import RoundRecord, Trace
from specloop.sim.costs import TableCost, load_cost_table
from specloop.sim.drafts import NoisyDraft
from specloop.sim.rounds import round_record
from specloop.sim.streams import make_stream
from specloop.sim.trees import build_tree
from specloop.strategies.base import DraftPlan, DraftStep, TreeCandidates, TreePlan
from specloop.strategies.engine import StepwiseRound, drive_round
from specloop.ltd.policy import LTDConfig
from specloop.ltd.train import DepthEnv, SizeEnv

__all__ = ["TreeWorldOptions", "TreeWorld", "SimTreeEngine", "make_depth_env", "make_size_env",
           "run_policy", "DESIGN_VERIFY_COST", "monotone_cost_table"]

# docs/design.md, section "Targets and measured costs": SmolLM2-135M verify forward, 200-token cache
DESIGN_VERIFY_COST = {"float32": ([1, 4, 8, 16], [0.033, 0.053, 0.064, 0.069]),
                      "bfloat16": ([1, 4, 8, 16], [0.037, 0.041, 0.043, 0.046])}


@dataclass(frozen=True)
class TreeWorldOptions:
    """The simulated world of the LTD environments (see the module docstring).

    Attributes:
        vocab_size, num_contexts: V tokens, C contexts.
        regime_temperatures: T_g per regime (> 0).
        regime_noise: s_g per regime (>= 0), same length.
        regime_switch_prob: per-cycle probability of switching regime.
        rounds_per_episode: cycles per prompt (episode length).
        prompt_length: (min, max) initial L in tokens.
        mode: "sampling" or "greedy" verification.
        draft_cost_ratio: seconds of one draft step / one target forward.
        cost_table: path of a verify-cost JSON (None = the packaged table, else
            `DESIGN_VERIFY_COST`); cost_dtype: its column.
        seed: world seed (tables, noise).
    """

    vocab_size: int = 64
    num_contexts: int = 256
    regime_temperatures: tuple[float, ...] = (0.25, 0.45, 0.7)
    regime_noise: tuple[float, ...] = (0.2, 0.5, 0.9)
    regime_switch_prob: float = 1 / 32
    rounds_per_episode: int = 64
    prompt_length: tuple[int, int] = (32, 768)
    mode: str = "sampling"
    draft_cost_ratio: float = 0.06
    cost_table: str | None = None
    cost_dtype: str = "bfloat16"
    seed: int = 0

    def validate(self) -> None:
        if len(self.regime_temperatures) == 0 or len(self.regime_temperatures) != len(self.regime_noise):
            raise ValueError("regime_temperatures and regime_noise must be non-empty and equally long")
        if any(t <= 0 for t in self.regime_temperatures) or any(s < 0 for s in self.regime_noise):
            raise ValueError("regime temperatures must be > 0 and noise >= 0")
        if not 0 <= self.regime_switch_prob <= 1:
            raise ValueError(f"regime_switch_prob must be in [0, 1], got {self.regime_switch_prob}")
        if self.rounds_per_episode < 1:
            raise ValueError("rounds_per_episode must be >= 1")
        lo, hi = self.prompt_length
        if not 1 <= lo <= hi:
            raise ValueError(f"prompt_length must be 1 <= min <= max tokens, got {self.prompt_length}")
        if self.mode not in ("sampling", "greedy"):
            raise ValueError(f"mode must be 'sampling' or 'greedy', got {self.mode!r}")
        if not self.draft_cost_ratio >= 0:
            raise ValueError("draft_cost_ratio must be >= 0")


def _isotonic(values: np.ndarray) -> np.ndarray:
    """Non-decreasing least-squares fit (pool adjacent violators)."""
    blocks: list[list[float]] = []                      # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.concatenate([np.full(int(c), m) for m, c in blocks])


def monotone_cost_table(table, extend_to: int = 256):
    """A measured verify-cost table made usable for planning: the seconds are
    replaced by their non-decreasing least-squares fit (a noisy measurement can make
    a larger forward look cheaper) and the table is extended to ``extend_to`` tokens
    along the least-squares slope of the measured points (>= 0), instead of the
    last segment's (which noise can make negative).

    Returns:
        a `specloop.theory.VerifyCostTable`.
    """
    from specloop.theory import VerifyCostTable

    n, secs = np.asarray(table.num_tokens, dtype=np.float64), np.asarray(table.seconds, dtype=np.float64)
    fitted = _isotonic(secs)
    if n.size >= 2 and extend_to > n[-1]:
        slope = max(float(np.polyfit(n, secs, 1)[0]), 0.0)
        n = np.append(n, float(extend_to))
        fitted = np.append(fitted, fitted[-1] + slope * (extend_to - n[-2]))
    return VerifyCostTable(num_tokens=n, seconds=fitted)


def _cost_model(options: TreeWorldOptions) -> tuple[TableCost, str]:
    from specloop.theory import VerifyCostTable

    try:
        table = load_cost_table(options.cost_table, options.cost_dtype)
        source = options.cost_table or "specloop/sim/data (packaged measured table)"
    except FileNotFoundError:
        if options.cost_table is not None:
            raise
        tokens, seconds = DESIGN_VERIFY_COST[options.cost_dtype]
        table, source = VerifyCostTable(num_tokens=tokens, seconds=seconds), "built-in SmolLM2-135M numbers"
    table = monotone_cost_table(table)
    return TableCost(table, options.draft_cost_ratio * float(table(1))), source + " (monotone fit)"


@dataclass
class _Tree:
    """A full-depth drafted tree with the indices the engine needs."""

    tree: object                       # specloop.sim.trees.DraftTree
    rank: np.ndarray                   # nodes (>= 1) by (-path_prob, depth, index)
    children: list                     # children[i]: int64 array, drafting order
    layer_top: list                    # layer_top[d]: sorted-desc path probs at depth d
    layer_max_q: np.ndarray            # max conditional q among depth-d nodes


class TreeWorld:
    """Target / draft tables per regime and the cached full-depth trees.

    Args:
        options: `TreeWorldOptions`. config: `LTDConfig` (top_k, max_depth).
    """

    def __init__(self, options: TreeWorldOptions | None = None, config: LTDConfig | None = None):
        self.options = options or TreeWorldOptions()
        self.options.validate()
        self.config = config or LTDConfig()
        o = self.options
        self.p_tables, self.q_tables = [], []
        for g, (temp, noise) in enumerate(zip(o.regime_temperatures, o.regime_noise)):
            stream = make_stream("stationary", o.vocab_size, 1, o.seed, num_contexts=o.num_contexts,
                                 temperature=temp)
            self.p_tables.append(np.array(stream.target_table(0)))
            self.q_tables.append(np.array(NoisyDraft(stream, noise, seed=o.seed + 1 + g).q_table(0)))
        self.cost_model, self.cost_source = _cost_model(o)
        self._trees: dict[tuple[int, int], _Tree] = {}
        self._plan = TreePlan(top_k=self.config.top_k, max_depth=self.config.max_depth)

    @property
    def num_regimes(self) -> int:
        return len(self.p_tables)

    def tree(self, regime: int, context: int) -> _Tree:
        """The full-depth EAGLE-2 tree of a root context in a regime (cached)."""
        key = (int(regime), int(context))
        if key not in self._trees:
            tree = build_tree(self.q_tables[regime], int(context), self._plan, np.random.default_rng(0),
                              self.options.mode, proposal="deterministic")
            self._trees[key] = _index(tree, self.config.max_depth)
        return self._trees[key]

    def verify(self, regime: int, info: _Tree, keep: np.ndarray, rng: np.random.Generator):
        """Verify the kept nodes (bool (N + 1,), root kept). Returns (accepted depth,
        acceptance probabilities along the walk)."""
        tree, p_table = info.tree, self.p_tables[regime]
        greedy = self.options.mode == "greedy"
        cur, accepted, probs = 0, 0, []
        while True:
            kids = info.children[cur]
            kids = kids[keep[kids]]
            if kids.size == 0:
                return accepted, probs
            p_cur = p_table[tree.node_ctx[cur]]
            nxt = _greedy_child(tree, kids, p_cur) if greedy else _sample_child(tree, kids, p_cur, rng, probs)
            if nxt < 0:
                return accepted, probs
            accepted += 1
            cur = nxt


def _greedy_child(tree, kids: np.ndarray, p_cur: np.ndarray) -> int:
    hit = kids[tree.token[kids] == int(np.argmax(p_cur))]
    return int(hit[0]) if hit.size else -1


def _sample_child(tree, kids: np.ndarray, p_cur: np.ndarray, rng: np.random.Generator, probs: list) -> int:
    """Recursive rejection sampling over point-mass siblings (SpecInfer Alg. 2)."""
    work = p_cur.copy()
    for i in kids:
        x = tree.token[i]
        total = work.sum()
        accept = work[x] / total if total > 0 else 0.0
        probs.append(float(accept))
        if rng.random() < accept:
            return int(i)
        work[x] = 0.0
    return -1


def _index(tree, max_depth: int) -> _Tree:
    n = tree.num_nodes
    nodes = np.arange(1, n + 1)
    rank = nodes[np.lexsort((nodes, tree.depth[1:], -tree.path_prob[1:]))]
    order = np.argsort(tree.parent[1:], kind="stable") + 1
    bounds = np.searchsorted(tree.parent[order], np.arange(n + 2))
    children = [order[bounds[i]:bounds[i + 1]] for i in range(n + 1)]
    layer_top, layer_max_q = [np.zeros(0)], np.zeros(max_depth + 1)
    cond = tree.path_prob[1:] / np.maximum(tree.path_prob[tree.parent[1:]], 1e-300)
    for d in range(1, max_depth + 1):
        at = tree.depth[1:] == d
        layer_top.append(np.sort(tree.path_prob[1:][at])[::-1].copy())
        layer_max_q[d] = cond[at].max() if at.any() else 0.0
    return _Tree(tree, rank, children, layer_top, layer_max_q)


class SimTreeEngine(StepwiseRound):
    """One prompt at a time of simulated LTD cycles (the `LTDEngine` of the simulator),
    stepped by gymnasium (`DepthEnv` / `SizeEnv`) or run by `drive_round`
    (`specloop.strategies.engine.StepwiseRound`).

    Args:
        world: a `TreeWorld` (shared between engines: tree cache).
    """

    def __init__(self, world: TreeWorld):
        self.world = world
        self.config = world.config
        self.rounds_per_episode = world.options.rounds_per_episode
        self.max_depth = self.config.max_depth
        self.target_time = world.cost_model.target_time
        self.rounds_done = 0
        self.episode = 0
        self._rng = self._world_rng = np.random.default_rng(0)

    @property
    def episode_done(self) -> bool:
        return self.rounds_done >= self.rounds_per_episode

    def reset(self, rng: np.random.Generator, episode: int = 0) -> None:
        """Start a prompt: regime, prompt length L, round counter; ``episode`` is
        written as the records' stream_index."""
        seeds = rng.integers(0, 2**63 - 1, size=2)
        self._world_rng = np.random.default_rng(seeds[0])   # regimes, root contexts, prompt length
        self._rng = np.random.default_rng(seeds[1])         # verification uniforms
        lo, hi = self.world.options.prompt_length
        self.regime = int(self._world_rng.integers(self.world.num_regimes))
        self.context_length = int(self._world_rng.integers(lo, hi + 1))
        self.rounds_done = 0
        self.episode = int(episode)

    def start_round(self, plan: DraftPlan) -> int:
        """The depth cap of an EAGLE-2 ``plan`` (ValueError for any other plan)."""
        return _plan_depth(plan, self.config)

    def begin_round(self) -> DraftStep:
        """Maybe switch regime, draw the root context, draft depth 1."""
        o = self.world.options
        wrng, regimes = self._world_rng, self.world.num_regimes
        switch, step, context = wrng.random(), int(wrng.integers(1, max(regimes, 2))), int(wrng.integers(o.num_contexts))
        if regimes > 1 and switch < o.regime_switch_prob:
            self.regime = (self.regime + step) % regimes
        self._info = self.world.tree(self.regime, context)
        self.depth = 1
        return self._step()

    def _step(self) -> DraftStep:
        top = self._info.layer_top[self.depth]
        return DraftStep(self.depth, self.context_length, top[: self.config.top_k].copy(),
                         float(top[0]) if top.size else 0.0, float(self._info.layer_max_q[self.depth]))

    def deepen(self) -> DraftStep:
        """Draft one more level (ValueError past max_depth)."""
        if self.depth >= self.config.max_depth:
            raise ValueError(f"cannot draft past max_depth={self.config.max_depth}")
        self.depth += 1
        return self._step()

    def candidates(self) -> TreeCandidates:
        tree = self._info.tree
        return TreeCandidates(self.depth, self.context_length,
                              tree.path_prob[1:][tree.depth[1:] <= self.depth].copy())

    def finish(self, verify_size: int, extra_draft_seconds: float = 0.0) -> RoundRecord:
        """Verify the best ``verify_size`` nodes of the depth-D tree; the record has
        num_draft_tokens = nodes verified, tree_depth = D draft steps, verified_tokens
        = nodes + 1, times from the cost model (+ ``extra_draft_seconds``)."""
        if int(verify_size) < 1:
            raise ValueError(f"verify_size must be >= 1, got {verify_size}")
        tree = self._info.tree
        rank = self._info.rank[tree.depth[self._info.rank] <= self.depth][: int(verify_size)]
        keep = np.zeros(tree.num_nodes + 1, dtype=bool)
        keep[0], keep[rank] = True, True
        accepted, probs = self.world.verify(self.regime, self._info, keep, self._rng)
        record = round_record(self.rounds_done, self.episode, int(rank.size), self.depth, int(rank.size) + 1,
                              accepted, self.world.cost_model, probs)
        if extra_draft_seconds:
            record = dataclasses.replace(record, draft_time=record.draft_time + extra_draft_seconds)
        self.context_length += record.tokens_per_round
        self.rounds_done += 1
        return record


def make_depth_env(options: TreeWorldOptions | None = None, config: LTDConfig | None = None,
                   world: TreeWorld | None = None, **kwargs) -> DepthEnv:
    """A `DepthEnv` over a `SimTreeEngine` (kwargs: size_chooser, fixed_verify_size, reward)."""
    return DepthEnv(SimTreeEngine(world or TreeWorld(options, config)), **kwargs)


def make_size_env(options: TreeWorldOptions | None = None, config: LTDConfig | None = None,
                  world: TreeWorld | None = None, **kwargs) -> SizeEnv:
    """A `SizeEnv` over a `SimTreeEngine` (kwargs: depth_chooser, reward)."""
    return SizeEnv(SimTreeEngine(world or TreeWorld(options, config)), **kwargs)


def _plan_depth(plan: DraftPlan, config: LTDConfig) -> int:
    tree = plan.tree
    if tree is None or tree.top_k != config.top_k:
        raise ValueError(f"the LTD simulator drafts EAGLE-2 trees with top_k={config.top_k}; "
                         f"got plan {plan}")
    return max(1, min(int(plan.num_draft_tokens), int(tree.max_depth), config.max_depth))


@dataclass
class PolicyRun:
    """`run_policy`'s result: the trace, the (D, V) per cycle and decision seconds."""

    trace: Trace
    depths: np.ndarray
    sizes: np.ndarray
    policy_seconds: float = 0.0
    meta: dict = field(default_factory=dict)


def run_policy(policy, world: TreeWorld, episodes: int, seed: int = 0,
               charge_policy_time: bool = False) -> PolicyRun:
    """Drive any tree `DraftPolicy` (plan -> draft steps with ``continue_drafting``
    -> ``verify_size`` -> verify -> ``observe``) for ``episodes`` prompts.

    Args:
        policy: a DraftPolicy planning EAGLE-2 trees with ``top_k = config.top_k``
            (`LTDPolicy`, `specloop.strategies.trees.DynamicTree`); the hooks are
            used when present (else: draft to the plan's depth, verify
            ``plan.tree.verify_size`` or every node).
        world: the `TreeWorld`. episodes: prompts (each ``rounds_per_episode`` cycles).
        seed: seed of the episodes' generator.
        charge_policy_time: add the measured wall-clock seconds of the policy's
            hooks to each cycle's draft_time (as the real decoder would).

    Raises:
        ValueError: a plan the simulator cannot draft, episodes < 1.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    engine, rng = SimTreeEngine(world), np.random.default_rng(seed)
    engine.charge_policy_time = bool(charge_policy_time)
    records, depths, sizes, spent = [], [], [], 0.0
    for episode in range(episodes):
        engine.reset(rng, episode)
        while engine.rounds_done < engine.rounds_per_episode:
            record = drive_round(policy, engine)
            records.append(record)
            depths.append(record.tree_depth)
            sizes.append(record.num_draft_tokens)
            spent += engine.policy_seconds
    return PolicyRun(Trace(records, {"cost_source": world.cost_source}), np.asarray(depths), np.asarray(sizes),
                     spent)
