"""Online experiments: a draft that learns from verification feedback on a target
stream, with dynamic regret against two comparators (OnlineSpec Algorithm 1,
Eq. (2), Lemma 1, Theorem 1, Corollaries 1-3).

Round t of `run_online` (`OnlineChainEngine` under `specloop.strategies.engine.drive_round`,
the call order every engine uses, docs/design.md, section "Engines and the one
round loop")::

    plan = policy.plan(state)                    # k (FixedK by default)
    q_t = q_draft(w_t, c_t); f_t(w_t), grad f_t(w_t)    # cross-entropy vs p_t
    Acc_t = sum_x min(p_t, q_t); E[n_t] = (1 - Acc_t^{k+1}) / (1 - Acc_t)
    sampled round: accepted = leading uniforms < Acc_t (Assumption 1, i.i.d. positions)
    policy.observe(record)
    w_{t+1} = learner.step(w_t, grad, f_t(w_t), oracle=f_t)    (OSD: rejected rounds buffered)

Quantities (all in nats for losses, tokens for lengths; record times in seconds of
the `LinearCost` with A = ``OnlineSetup.target_time``):

* ``dynamic_regret`` (comparator (a), Corollaries 1-3): sum_t f_t(w_t) - f_t(w*_t),
  w*_t = argmin_{||w||_2 <= D} f_t(w), found by projected gradient descent with
  backtracking, warm-started from the previous w*, cached per (context, p_t).
  For the low-rank draft the problem is not convex in (U, W): w*_t is then a local
  minimiser (warm starts keep the comparator path continuous).
* ``dynamic_regret_exact`` (comparator (b), Lemma 1 / Theorem 1): against a draft
  that matches the target, f_t(w*) = H(p_t), so the regret is sum_t KL(p_t || q_t).
  Theorem 1's lower bound on the speedup uses this one.
* ``path_length`` P_T = sum_t ||w*_{t+1} - w*_t||_2 of comparator (a);
  ``target_path_length`` = sum_t TV(p_{t+1}, p_t).
* ``hint_error`` delta_T = sum_t ||h_t - grad f_t(w_t)||^2 with the last-gradient
  hint h_t = grad f_{t-1}(w_{t-1}), h_1 = 0 (Corollary 2).
* ``speedup`` = sum_t E[n_t] / sum_t (cost_ratio k_t + 1) (Theorem 1 proof, Eq. (7));
  ``speedup_sampled`` uses the sampled n_t.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from specloop.record import RoundRecord, Trace
from specloop.sim.costs import LinearCost, round_record
from specloop.sim.drafts import ParametricDraft
from specloop.sim.streams import make_stream
from specloop.strategies import _arrays as A
from specloop.strategies.base import DraftPolicy, PlanState
from specloop.strategies.engine import chain_step, drive_round
from specloop.strategies.registry import LEARNER_NAMES, learner_feedback, learns_from_round, resolve_learner
from specloop.strategies.registry import learner_from_name
from specloop.strategies.bandits import EXP3K, UCBK
from specloop.strategies.policies import FixedK, HeuristicK, TheoryOptimalK
from specloop.theory.acceptance import acceptance_rate
from specloop.theory.bounds import theorem1_bounds
from specloop.theory.regret import corollary3_num_base_learners, corollary_growth_exponent
from specloop.theory.tokens import expected_tokens_chain

__all__ = ["ONLINE_SCENARIOS", "LEARNERS", "POLICIES", "make_policy", "OnlineSetup", "OnlineProblem", "OnlineResult",
           "build_problem", "sim_learner", "run_online", "solve_comparator",
           "regret_sweep", "fit_exponent", "predicted_exponent", "SweepConfig"]

ONLINE_SCENARIOS = ("stationary", "piecewise", "smooth", "fast")
LEARNERS = ("fixed",) + LEARNER_NAMES   # the registry's names; "fixed" = no learner
POLICIES = ("fixed", "theory", "heuristic", "ucb", "exp3")
BANDIT_ARMS = (1, 2, 3, 4, 6, 8, 12)


@dataclass(frozen=True)
class OnlineSetup:
    """One online experiment's environment.

    Attributes:
        scenario: one of `ONLINE_SCENARIOS` (streams of `specloop.sim.streams`).
        rounds: T >= 1.
        seed: seeds the stream, the draft's initial parameters and the sampled rounds.
        vocab_size: V tokens. num_contexts: C (1 = one next-token distribution per
            round, so the comparator moves only when the environment does).
        rank: r of the low-rank draft. radius: D of the parameter ball (Assumption 2).
        init_scale: std of the initial U, W (the draft's initial, "offline" state).
        num_draft_tokens: k of the default FixedK policy.
        cost_ratio: a / A (draft step over target forward).
        target_time: A, seconds of one target forward that prices the records' times
            (default the built-in SmolLM2-135M float32 one-token forward, 0.033 s;
            docs/design.md, section "Targets and measured costs").
        window: rounds per reporting window (None = T // 10).
        stream_options: extra `StreamOptions` fields (iid is forced to True).
    """

    scenario: str
    rounds: int
    seed: int = 0
    vocab_size: int = 32
    num_contexts: int = 1
    rank: int = 2
    radius: float = 3.0
    init_scale: float = 0.3
    num_draft_tokens: int = 4
    cost_ratio: float = 0.05
    target_time: float = 0.033
    window: int | None = None
    stream_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        if self.scenario not in ONLINE_SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; expected one of {ONLINE_SCENARIOS}")
        if int(self.rounds) < 1:
            raise ValueError(f"rounds T must be >= 1, got {self.rounds}")
        if not (math.isfinite(self.radius) and self.radius > 0):
            raise ValueError(f"radius D must be positive and finite, got {self.radius}")
        if int(self.num_draft_tokens) < 0:
            raise ValueError(f"num_draft_tokens k must be >= 0, got {self.num_draft_tokens}")
        if not (math.isfinite(self.cost_ratio) and self.cost_ratio >= 0):
            raise ValueError(f"cost_ratio must be >= 0, got {self.cost_ratio}")
        if self.window is not None and int(self.window) < 1:
            raise ValueError(f"window must be >= 1 round, got {self.window}")
        if not (math.isfinite(self.target_time) and self.target_time > 0):
            raise ValueError(f"target_time A must be a positive number of seconds, got {self.target_time}")


# -- the problem: stream, draft, comparator ------------------------------------------
def solve_comparator(loss_and_grad: Callable[[list], tuple[float, list]], start: list,
                     radius: float, tol: float = 1e-8, max_iter: int = 500) -> tuple[float, list]:
    """min_{||w||_2 <= radius} f(w) by projected gradient descent with backtracking
    (Beck & Teboulle's sufficient-decrease test), from ``start`` (NumPy arrays).

    Returns (f(w*), w*) as (float, list of float64 arrays). Stops when the relative
    decrease falls below ``tol`` or after ``max_iter`` iterations.
    """
    shapes = [np.shape(a) for a in start]
    cuts = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]

    def unflat(x: np.ndarray) -> list:
        return [part.reshape(s) for part, s in zip(np.split(x, cuts), shapes)]

    def fg(x: np.ndarray) -> tuple[float, np.ndarray]:
        f, g = loss_and_grad(unflat(x))
        return float(f), np.concatenate([np.ravel(a) for a in g])

    def proj(x: np.ndarray) -> np.ndarray:
        norm = float(np.sqrt(x @ x))
        return x if norm <= radius else x * (radius / norm)

    x = proj(np.concatenate([np.ravel(np.asarray(a, dtype=np.float64)) for a in start]))
    f, g = fg(x)
    step = 1.0
    for _ in range(max_iter):
        while True:
            x_new = proj(x - step * g)
            f_new, g_new = fg(x_new)
            d = x_new - x
            if f_new <= f + g @ d + (d @ d) / (2 * step) + 1e-15 or step < 1e-12:
                break
            step *= 0.5
        done = f - f_new <= tol * (1.0 + abs(f))
        if f_new <= f:
            x, f, g = x_new, f_new, g_new
        if done:
            break
        step *= 2.0
    return float(f), unflat(x.copy())


@dataclass
class OnlineProblem:
    """A stream, a draft, the initial parameters and the comparator sequence (a)."""

    setup: OnlineSetup
    stream: Any
    draft: ParametricDraft
    init_params: list
    comparator_losses: np.ndarray   # (T,) f_t(w*_t), nats
    entropies: np.ndarray           # (T,) H(p_t) = f_t(exact match), nats
    path_length: float              # P_T of comparator (a)
    target_path_length: float       # sum_t TV(p_{t+1}, p_t)
    gradient_bound: float           # G estimate (Assumption 2)


def _entropy(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def _comparators(stream, draft, start, radius) -> tuple[np.ndarray, float]:
    """f_t(w*_t) for every round and the path length P_T (cache per (context, p_t))."""
    cache: dict[tuple, tuple[float, list]] = {}
    losses = np.empty(stream.rounds)
    path, prev, w = 0.0, None, start
    for t in range(stream.rounds):
        c, p = stream.context(t), stream.target(t)
        key = (c, np.round(p, 12).tobytes())
        if key not in cache:
            cache[key] = solve_comparator(lambda x: draft.loss_and_grad(x, c, p), w, radius)
        losses[t], w = cache[key]
        if prev is not None:
            path += math.sqrt(A.joint_sq_dist(prev, w))
        prev = w
    return losses, path


def _gradient_bound(stream, draft, radius, rng, samples: int = 16) -> float:
    """G estimate: max ||grad f_t(w)|| over ``samples`` rounds x random points of the
    ball's sphere (plus the centre's neighbourhood); documented as an estimate."""
    g_max = 0.0
    shapes = draft.param_shapes
    rounds = np.unique(np.linspace(0, stream.rounds - 1, samples).astype(int))
    for t in rounds:
        for _ in range(4):
            w = [rng.standard_normal(s) for s in shapes]
            w = A.project_ball([x * (radius / max(A.joint_norm(w), 1e-12)) for x in w], radius)
            _, g = draft.loss_and_grad(w, stream.context(int(t)), stream.target(int(t)))
            g_max = max(g_max, A.joint_norm(g))
    return g_max


def build_problem(setup: OnlineSetup) -> OnlineProblem:
    """Stream, draft, initial parameters and comparator (a) for ``setup`` (shared by
    every learner run on the same setup)."""
    setup.validate()
    options = dict(setup.stream_options)
    options["iid"] = True
    stream = make_stream(setup.scenario, setup.vocab_size, setup.rounds, setup.seed,
                         num_contexts=setup.num_contexts, **options)
    draft = ParametricDraft(setup.vocab_size, setup.num_contexts, rank=setup.rank,
                            init_scale=setup.init_scale)
    rng = np.random.default_rng(np.random.SeedSequence([setup.seed, 7]))
    init = A.project_ball(draft.init_params(rng), setup.radius)
    comp, path = _comparators(stream, draft, init, setup.radius)
    targets = [stream.target(t) for t in range(setup.rounds)]
    entropies = np.array([_entropy(p) for p in targets])
    tv_path = float(sum(0.5 * np.abs(a - b).sum() for a, b in zip(targets[1:], targets[:-1])))
    g = _gradient_bound(stream, draft, setup.radius, rng)
    return OnlineProblem(setup, stream, draft, init, comp, entropies, path, tv_path, g)


# -- policies and learners ------------------------------------------------------------
def make_policy(name: str, num_draft_tokens: int, cost_ratio: float, rounds: int, seed: int = 0):
    """A draft-length policy for the online engine: "fixed" (k), "theory"
    (`TheoryOptimalK` at ``cost_ratio``, k <= 16), "heuristic" (+2/-1 from k), "ucb" /
    "exp3" over `BANDIT_ARMS` with the reward bound max_k (k + 1) / (cost_ratio k + 1)
    tokens per target-forward second (rewards then lie in [0, 1] after normalising).

    Raises:
        ValueError: unknown name or invalid k / cost_ratio.
    """
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {POLICIES}")
    bound = max((k + 1) / (cost_ratio * k + 1) for k in BANDIT_ARMS)
    if name == "fixed":
        return FixedK(num_draft_tokens, seed=seed)
    if name == "theory":
        return TheoryOptimalK(max(cost_ratio, 1e-6), k_max=16, seed=seed)
    if name == "heuristic":
        return HeuristicK(initial_k=max(num_draft_tokens, 1), seed=seed)
    if name == "ucb":
        return UCBK(BANDIT_ARMS, reward_bound=bound, seed=seed)
    return EXP3K(BANDIT_ARMS, horizon=rounds, reward_bound=bound, seed=seed)


def sim_learner(name: str, rounds: int, radius: float, gradient_bound: float,
                loss_and_grad=None, seed: int = 0):
    """A learner of the registry (`specloop.strategies.registry`; its aliases such as
    "opt" / "ens" work too) tuned as its corollary prescribes (D = 2 * radius is the
    diameter):

    * "fixed": None (the draft never updates);
    * "ogd": OGD, eta = D / (G sqrt(T)) (Corollary 1);
    * "optimistic": optimistic OGD, self-tuned eta_t = D / sqrt(G^2 + delta_{t-1}) (Cor. 2);
    * "ensemble": Hedge over N = ceil(log2(1 + 2T)/2) + 1 OGD learners, eta_i =
      2^{i-1} D / (G sqrt T), epsilon = sqrt(8 ln N) / (G D sqrt T) (Corollary 3);
    * "optimistic-ensemble": the same grid of optimistic base learners, optimistic
      Hedge meta learner (App. C.3);
    * "osd": OSD distillation, eta = D / (G sqrt(T)), update every 8 rounds over the
      buffer of rejected rounds (needs ``loss_and_grad(params, context, p_target)``).

    Raises:
        ValueError: unknown name, rounds < 1, non-positive radius or gradient bound.
    """
    if name != "fixed":
        name = resolve_learner(name)   # ValueError listing the names for an unknown one
    if int(rounds) < 1 or not radius > 0 or not gradient_bound > 0:
        raise ValueError(f"need rounds >= 1, radius > 0, gradient_bound > 0; got "
                         f"{rounds}, {radius}, {gradient_bound}")
    diameter, g, t = 2.0 * radius, float(gradient_bound), int(rounds)
    lr = diameter / (g * math.sqrt(t))
    n = corollary3_num_base_learners(t)
    meta_lr = math.sqrt(8.0 * math.log(max(n, 2))) / (g * diameter * math.sqrt(t))
    if name == "fixed":
        return None
    if name == "optimistic":
        return learner_from_name(name, diameter / g, radius=radius, adaptive=True, hint_scale=g, seed=seed)
    return learner_from_name(name, lr, radius=radius, num_learners=n, meta_lr=meta_lr, update_every=8,
                             loss_and_grad=loss_and_grad, seed=seed)


# -- the engine loop ------------------------------------------------------------------
@dataclass(kw_only=True)
class OnlineResult:
    """Per-round series and summaries of one online run (see module docstring).

    Arrays have shape (T,): ``loss`` f_t(w_t), ``comparator_loss`` f_t(w*_t),
    ``kl`` KL(p_t || q_t), ``acceptance_rate`` Acc_t, ``expected_tokens`` E[n_t],
    ``tokens_per_round`` sampled n_t, ``num_draft_tokens`` k_t.
    """

    learner: str
    setup: OnlineSetup
    loss: np.ndarray
    comparator_loss: np.ndarray
    kl: np.ndarray
    acceptance_rate: np.ndarray
    expected_tokens: np.ndarray
    tokens_per_round: np.ndarray
    num_draft_tokens: np.ndarray
    hint_error: float
    path_length: float
    target_path_length: float
    gradient_bound: float
    trace: Trace

    @property
    def rounds(self) -> int:
        return int(self.loss.size)

    @property
    def dynamic_regret(self) -> float:
        """Reg_T against comparator (a), the best draft in the ball (nats)."""
        return float((self.loss - self.comparator_loss).sum())

    @property
    def dynamic_regret_exact(self) -> float:
        """Reg_T against comparator (b), the exact match: sum_t KL(p_t || q_t) (nats)."""
        return float(self.kl.sum())

    def _speedup(self, tokens: np.ndarray, sl: slice = slice(None)) -> float:
        cost = (self.setup.cost_ratio * self.num_draft_tokens[sl] + 1.0).sum()
        return float(tokens[sl].sum() / cost)

    @property
    def speedup(self) -> float:
        """sum_t E[n_t] / sum_t (cost_ratio k_t + 1) (Eq. 7)."""
        return self._speedup(self.expected_tokens)

    @property
    def speedup_sampled(self) -> float:
        return self._speedup(self.tokens_per_round)

    def theorem1_bounds(self) -> tuple[float, float]:
        """Theorem 1 (lower, upper) on the speedup from Reg_T of comparator (b); NaN
        when k varied over the run (the theorem assumes one k)."""
        ks = np.unique(self.num_draft_tokens)
        if ks.size != 1:
            return math.nan, math.nan
        lower, upper = theorem1_bounds(max(self.dynamic_regret_exact, 0.0), self.rounds,
                                       int(ks[0]), self.setup.cost_ratio)
        return float(lower), float(upper)

    def windows(self, window: int | None = None) -> list[dict]:
        """Per-window rows: rounds [start, end), regret increments (a) and (b), mean
        accepted length tau = mean E[n_t], acceptance rate and speedup."""
        size = int(window or self.setup.window or max(1, self.rounds // 10))
        rows = []
        for start in range(0, self.rounds, size):
            sl = slice(start, min(start + size, self.rounds))
            rows.append({
                "start": start, "end": sl.stop,
                "dynamic_regret": float((self.loss[sl] - self.comparator_loss[sl]).sum()),
                "dynamic_regret_exact": float(self.kl[sl].sum()),
                "mean_accepted_length": float(self.expected_tokens[sl].mean()),
                "acceptance_rate": float(self.acceptance_rate[sl].mean()),
                "speedup": self._speedup(self.expected_tokens, sl)})
        return rows

    def summary(self) -> dict:
        """JSON-serialisable headline numbers."""
        lower, upper = self.theorem1_bounds()
        return {
            "scenario": self.setup.scenario, "learner": self.learner, "rounds": self.rounds,
            "seed": self.setup.seed, "dynamic_regret": self.dynamic_regret,
            "dynamic_regret_exact": self.dynamic_regret_exact,
            "path_length": self.path_length, "target_path_length": self.target_path_length,
            "hint_error": self.hint_error, "gradient_bound": self.gradient_bound,
            "radius": self.setup.radius, "num_draft_tokens": float(self.num_draft_tokens.mean()),
            "cost_ratio": self.setup.cost_ratio,
            "mean_accepted_length": float(self.expected_tokens.mean()),
            "mean_accepted_length_sampled": float(self.tokens_per_round.mean()),
            "acceptance_rate": float(self.acceptance_rate.mean()),
            "speedup": self.speedup, "speedup_sampled": self.speedup_sampled,
            "speedup_lower_bound": lower, "speedup_upper_bound": upper,
        }


def _sample_accepted(acc: float, k: int, rng: np.random.Generator) -> int:
    """Accepted draft tokens of a chain of k i.i.d. positions each accepted w.p. Acc
    (Assumption 1): the index of the first uniform >= Acc (k if none)."""
    u = rng.random(k)
    rejected = np.flatnonzero(u >= acc)
    return int(rejected[0]) if rejected.size else k


class OnlineChainEngine:
    """The online simulator's round as a `specloop.strategies.engine.RoundEngine`.

    Round t: f_t(w_t) and its gradient at the played parameters, Acc_t = sum_x
    min(p_t, q_t); the chain is drafted position by position (the positions are i.i.d.
    under Assumption 1, so no token is drawn: the DraftStep after position j reports the
    draft's confidence max_x q_t(x) and its j-th power as the path probability), the
    policy's ``continue_drafting`` may stop it; verification accepts the leading
    uniforms < Acc_t. Times are seconds of ``cost_model`` (`LinearCost` with
    A = ``target_time`` and a = cost_ratio x A). ``learn`` applies the learner (OSD-style
    learners receive the round only when it had a rejection).

    Raises (``start_round``): ValueError for a tree plan (the online simulator drafts
    chains: Assumption 1 has no tree).
    """

    def __init__(self, problem: "OnlineProblem", rng: np.random.Generator, cost_model: LinearCost):
        self.problem, self.rng, self.cost_model = problem, rng, cost_model
        self.params = A.copy_list(problem.init_params)
        self.round_index, self.committed = 0, 0

    def plan_state(self) -> PlanState:
        return PlanState(round_index=self.round_index, context_length=self.committed, remaining_tokens=None)

    def start_round(self, plan) -> int:
        if plan.tree is not None:
            raise ValueError("the online simulator drafts chains (Assumption 1: i.i.d. positions); "
                             f"got a tree plan {plan.tree}")
        t, problem = self.round_index, self.problem
        self.context, self.target = problem.stream.context(t), problem.stream.target(t)
        self.loss, self.grads = problem.draft.loss_and_grad(self.params, self.context, self.target)
        q = problem.draft.q_draft(self.params, self.context)
        self.acc, self.confidence = float(acceptance_rate(self.target, q)), float(np.max(q))
        return int(plan.num_draft_tokens)

    def draft(self, hooks) -> None:
        depth = 0
        while depth < hooks.cap:
            depth += 1
            step = chain_step(depth, self.committed, self.confidence, self.confidence ** depth)
            if not hooks.continue_drafting(step):
                break
        self.k = depth

    def verify(self, hooks) -> RoundRecord:
        k = self.k
        self.accepted = _sample_accepted(self.acc, k, self.rng)
        record = round_record(self.round_index, 0, k, k, k + 1, self.accepted, self.cost_model,
                              acceptance_probs=(self.acc,) * k, loss=self.loss)
        self.round_index += 1
        self.committed += record.tokens_per_round
        return record

    def learn(self, learner) -> None:
        self.params = _update(learner, self.params, self.grads, self.loss, self.problem.draft, self.context,
                              self.target, rejected=self.accepted < self.k)


def run_online(problem: OnlineProblem, learner_name: str, policy: DraftPolicy | None = None,
               learner: Any = None) -> OnlineResult:
    """Run one learner on ``problem`` through the one round driver
    (`specloop.strategies.engine.drive_round` over an `OnlineChainEngine`).

    Args:
        problem: from `build_problem` (reusable: nothing in it is modified).
        learner_name: a name of `LEARNERS` (used to build the learner unless
            ``learner`` is given, and as the label of the result).
        policy: draft-length policy (default FixedK(setup.num_draft_tokens)); its
            ``continue_drafting`` hook is honoured; tree plans are refused.
        learner: an explicit learner object (``step(params, grads, loss, oracle=)``).

    Returns:
        `OnlineResult`; its ``trace`` holds one `RoundRecord` per round (times in
        seconds of a target forward of ``setup.target_time`` seconds).

    Raises:
        ValueError: a tree plan.
    """
    setup = problem.setup
    if learner is None:
        learner = sim_learner(learner_name, setup.rounds, setup.radius, problem.gradient_bound,
                               problem.draft.loss_and_grad, seed=setup.seed)
    policy = policy or FixedK(setup.num_draft_tokens, seed=setup.seed)
    rng = np.random.default_rng(np.random.SeedSequence([setup.seed, 11]))
    cost = LinearCost(draft_time=setup.cost_ratio * setup.target_time, target_time=setup.target_time)
    engine = OnlineChainEngine(problem, rng, cost)
    T = setup.rounds
    out = {name: np.empty(T) for name in ("loss", "kl", "acc", "exp", "n", "k")}
    prev_grad, hint_error = None, 0.0
    trace = Trace(meta={"learner": learner_name, **asdict(setup)})
    for t in range(T):
        record = drive_round(policy, engine, learner)
        trace.append(record)
        grads, k = engine.grads, record.num_draft_tokens
        hint_error += (A.joint_norm(grads) ** 2 if prev_grad is None
                       else A.joint_sq_dist(prev_grad, grads))
        prev_grad = grads
        out["loss"][t], out["kl"][t], out["acc"][t] = engine.loss, engine.loss - problem.entropies[t], engine.acc
        out["exp"][t] = float(expected_tokens_chain(engine.acc, k))
        out["n"][t], out["k"][t] = record.tokens_per_round, k
    return OnlineResult(learner=learner_name, setup=setup, loss=out["loss"],
                        comparator_loss=problem.comparator_losses.copy(), kl=out["kl"],
                        acceptance_rate=out["acc"], expected_tokens=out["exp"], tokens_per_round=out["n"],
                        num_draft_tokens=out["k"], hint_error=hint_error, path_length=problem.path_length,
                        target_path_length=problem.target_path_length, gradient_bound=problem.gradient_bound,
                        trace=trace)


def _update(learner, w, grads, loss, draft, context, p, rejected: bool):
    """One learner step; a "rejections" learner (OSD, `specloop.strategies.registry`)
    gets the round, through ``add_feedback``, only when it had a rejection."""
    if learner is None:
        return w
    if learner_feedback(learner) == "rejections":
        if learns_from_round(learner, rejected):
            learner.add_feedback(context, p)
        return learner.step(w, grads, loss)
    oracle = lambda params: draft.loss_and_grad(params, context, p)  # noqa: E731
    return learner.step(w, grads, loss, oracle=oracle)


# -- regret sweep over T (Corollaries 1-3) -------------------------------------------
#: which corollary predicts each learner's regret growth
COROLLARY_OF = {"ogd": "corollary1", "osd": "corollary1", "optimistic": "corollary2",
                "ensemble": "corollary3", "optimistic-ensemble": "corollary2+3",
                "fixed": "none"}  # no learning: Reg_T linear in T


@dataclass(frozen=True)
class SweepConfig:
    """A regret sweep: T over ``rounds_list`` for every scenario x learner x seed.

    ``processes`` > 1 runs (scenario, seed, T) jobs in a process pool. Other fields
    as `OnlineSetup`.
    """

    scenarios: tuple[str, ...] = ONLINE_SCENARIOS
    learners: tuple[str, ...] = LEARNERS
    rounds_list: tuple[int, ...] = (100, 200, 400, 800, 1600)
    seeds: tuple[int, ...] = (0, 1, 2)
    processes: int = 1
    setup_kwargs: dict = field(default_factory=dict)

    def validate(self) -> None:
        if len(self.rounds_list) < 2 or any(int(t) < 2 for t in self.rounds_list):
            raise ValueError(f"a sweep needs >= 2 horizons T >= 2, got {self.rounds_list}")
        if not self.seeds:
            raise ValueError("a sweep needs at least one seed")
        for name in self.learners:
            if name not in LEARNERS:
                raise ValueError(f"unknown learner {name!r}; expected one of {LEARNERS}")
        for name in self.scenarios:
            if name not in ONLINE_SCENARIOS:
                raise ValueError(f"unknown scenario {name!r}; expected one of {ONLINE_SCENARIOS}")


def fit_exponent(rounds: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(values) on log(rounds) (the growth exponent e of
    values = Theta(T^e)); NaN if fewer than two positive values."""
    t = np.asarray(rounds, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    keep = (t > 0) & (v > 0) & np.isfinite(v)
    if keep.sum() < 2:
        return math.nan
    slope, _ = np.polyfit(np.log(t[keep]), np.log(v[keep]), 1)
    return float(slope)


def predicted_exponent(learner: str, path_growth: float, hint_growth: float) -> float:
    """Exponent the corollaries predict for ``learner`` given P_T = Theta(T^b) and
    delta_T = Theta(T^h) (b, h clipped to [0, 1]); "fixed" -> 1 (no learning);
    "optimistic-ensemble" -> the better of Corollaries 2 and 3 (App. C.3)."""
    b = min(max(path_growth, 0.0), 1.0) if math.isfinite(path_growth) else 1.0
    h = min(max(hint_growth, 0.0), 1.0) if math.isfinite(hint_growth) else 1.0
    if learner == "fixed":
        return 1.0
    if learner == "optimistic-ensemble":
        return min(corollary_growth_exponent("corollary2", b, h),
                   corollary_growth_exponent("corollary3", b))
    return corollary_growth_exponent(COROLLARY_OF[learner], b, h)


def _sweep_job(args: tuple) -> list[dict]:
    scenario, seed, rounds, learners, kwargs = args
    problem = build_problem(OnlineSetup(scenario, rounds, seed=seed, **kwargs))
    return [run_online(problem, name).summary() for name in learners]


def _sweep_runs(config: SweepConfig) -> list[dict]:
    jobs = [(s, seed, int(t), tuple(config.learners), dict(config.setup_kwargs))
            for s in config.scenarios for seed in config.seeds for t in config.rounds_list]
    if config.processes > 1:
        import multiprocessing as mp
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"  # fork: no re-import
        with mp.get_context(method).Pool(config.processes) as pool:
            chunks = pool.map(_sweep_job, jobs, chunksize=1)
    else:
        chunks = [_sweep_job(job) for job in jobs]
    return [row for chunk in chunks for row in chunk]


def _mean_at(runs: list[dict], key: str, rounds: int) -> float:
    return float(np.mean([r[key] for r in runs if r["rounds"] == rounds]))


def _sweep_row(scenario: str, learner: str, runs: list[dict], rounds_list) -> dict:
    ts = sorted(set(int(t) for t in rounds_list))
    mean = {key: [_mean_at(runs, key, t) for t in ts]
            for key in ("dynamic_regret", "dynamic_regret_exact", "path_length", "hint_error",
                        "speedup", "speedup_lower_bound", "speedup_upper_bound",
                        "mean_accepted_length")}
    b = fit_exponent(ts, 1.0 + np.asarray(mean["path_length"]))
    h = fit_exponent(ts, 1.0 + np.asarray(mean["hint_error"]))
    return {
        "scenario": scenario, "learner": learner,
        "exponent": fit_exponent(ts, mean["dynamic_regret"]),
        "predicted_exponent": predicted_exponent(learner, b, h),
        "regret_at_max_T": mean["dynamic_regret"][-1],
        "speedup": mean["speedup"][-1],
        "speedup_lower_bound": mean["speedup_lower_bound"][-1],
        "speedup_upper_bound": mean["speedup_upper_bound"][-1],
        "exponent_exact": fit_exponent(ts, mean["dynamic_regret_exact"]),
        "regret_exact_at_max_T": mean["dynamic_regret_exact"][-1],
        "path_length_exponent": b, "hint_error_exponent": h,
        "path_length_at_max_T": mean["path_length"][-1],
        "hint_error_at_max_T": mean["hint_error"][-1],
        "mean_accepted_length": mean["mean_accepted_length"][-1],
        "corollary": COROLLARY_OF[learner], "max_T": ts[-1],
        "rounds_list": ts, "regret_by_T": mean["dynamic_regret"],
        "seeds": len({r["seed"] for r in runs}),
        # per seed at the largest T, in seed order: learners pair by seed (same problem)
        "regret_at_max_T_by_seed": _by_seed(runs, "dynamic_regret", ts[-1]),
        "speedup_by_seed": _by_seed(runs, "speedup", ts[-1]),
    }


def _by_seed(runs: list[dict], key: str, rounds: int) -> list[float]:
    return [float(r[key]) for r in sorted((r for r in runs if r["rounds"] == rounds), key=lambda r: r["seed"])]


def regret_sweep(config: SweepConfig) -> list[dict]:
    """Run the sweep and fit, per scenario x learner, the regret growth exponent
    (log-log least squares on the seed-mean Reg_T of comparator (a)), beside the
    exponent Corollaries 1-3 predict from the measured growth of (1 + P_T) and
    (1 + delta_T), and Theorem 1's lower bound on the speedup from the measured
    Reg_T of comparator (b) at the largest T beside the measured speedup.

    Returns a list of dict rows with keys ``scenario``, ``learner``, ``exponent``,
    ``predicted_exponent``, ``regret_at_max_T``, ``speedup``, ``speedup_lower_bound``
    and the diagnostics listed in `_sweep_row`.
    """
    config.validate()
    runs = _sweep_runs(config)
    rows = []
    for scenario in config.scenarios:
        for learner in config.learners:
            mine = [r for r in runs if r["scenario"] == scenario and r["learner"] == learner]
            rows.append(_sweep_row(scenario, learner, mine, config.rounds_list))
    return rows
