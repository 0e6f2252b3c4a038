"""Draft policies: one conformance suite over every policy, plus convergence of the
bandits (UCB1 / EXP3 regret bounds), the theory-optimal k and the +2/-1 heuristic."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from specloop.record import RoundRecord
from specloop.strategies.bandits import EXP3K, UCBK, round_reward
from specloop.strategies.base import DraftPlan, DraftPolicy, DraftStep, PlanState, TreeCandidates
from specloop.strategies.policies import ConfidenceStop, FixedK, HeuristicK, TheoryOptimalK
from specloop.strategies.trees import DynamicTree, StaticTree, static_tree_size
from specloop.theory.optimal_k import optimal_k_exact
from specloop.theory.tokens import expected_tokens_chain

POLICIES = {
    "fixed": lambda seed: FixedK(4, seed=seed),
    "theory-optimal": lambda seed: TheoryOptimalK(0.05, seed=seed),
    "heuristic": lambda seed: HeuristicK(seed=seed),
    "confidence": lambda seed: ConfidenceStop(0.4, seed=seed),
    "confidence-path": lambda seed: ConfidenceStop(0.2, criterion="path_prob", seed=seed),
    "ucb": lambda seed: UCBK(seed=seed),
    "exp3": lambda seed: EXP3K(horizon=100, seed=seed),
    "static-tree": lambda seed: StaticTree((3, 2, 1), verify_size=8, seed=seed),
    "dynamic-tree": lambda seed: DynamicTree(4, 5, 12, seed=seed),
}


def simulate_round(policy, t: int, rng: np.random.Generator, acc: float = 0.7,
                   cost_ratio: float = 0.05) -> tuple[DraftPlan, RoundRecord]:
    """One round against a synthetic verifier with i.i.d. acceptance ``acc``
    (Assumption 1); calls the optional hooks when the policy has them."""
    plan = policy.plan(PlanState(round_index=t, context_length=20 + t))
    k = plan.num_draft_tokens
    if hasattr(policy, "continue_drafting"):
        depth, path = 0, 1.0
        while depth < k:
            top = float(rng.uniform(0.1, 1.0))
            path *= top
            depth += 1
            step = DraftStep(depth, 20 + t, np.array([top]), path, top)
            if not policy.continue_drafting(step):
                break
        k = depth
    if plan.tree is not None and hasattr(policy, "verify_size"):
        nodes = TreeCandidates(k, 20 + t, rng.uniform(0, 1, size=3 * k))
        assert 1 <= policy.verify_size(nodes) <= nodes.node_probs.size
    u = rng.random(k)
    rejected = np.flatnonzero(u >= acc)
    accepted = int(rejected[0]) if rejected.size else k
    record = RoundRecord(round_index=t, stream_index=0, num_draft_tokens=k, tree_depth=k,
                         verified_tokens=k + 1, accepted_tokens=accepted,
                         tokens_per_round=accepted + 1, draft_time=cost_ratio * k,
                         verify_time=1.0)
    return plan, record


def run_policy(policy, rounds: int, seed: int = 0, acc: float = 0.7):
    rng = np.random.default_rng(seed)
    plans = []
    for t in range(rounds):
        plan, record = simulate_round(policy, t, rng, acc)
        snapshot = record.to_dict()
        policy.observe(record)
        assert record.to_dict() == snapshot  # records are never mutated
        plans.append(plan)
    return plans


@pytest.fixture(params=list(POLICIES), ids=list(POLICIES))
def factory(request):
    return POLICIES[request.param]


def test_protocol_and_plan_shapes(factory):
    policy = factory(0)
    assert isinstance(policy, DraftPolicy)
    for plan in run_policy(policy, 30):
        assert isinstance(plan, DraftPlan) and isinstance(plan.num_draft_tokens, int)
        assert plan.num_draft_tokens >= 0
        if plan.tree is not None:
            assert plan.tree.max_depth == plan.num_draft_tokens


def test_seeded_determinism(factory):
    a = run_policy(factory(5), 40, seed=1)
    b = run_policy(factory(5), 40, seed=1)
    assert a == b


def test_state_dict_round_trip(factory):
    original = factory(2)
    run_policy(original, 25, seed=3)
    state = original.state_dict()
    clone = factory(77)
    clone.load_state_dict(state)
    assert run_policy(original, 25, seed=4) == run_policy(clone, 25, seed=4)


def test_state_dict_is_a_copy(factory):
    policy = factory(0)
    run_policy(policy, 5)
    state = policy.state_dict()
    frozen = repr(state)
    run_policy(policy, 5, seed=9)
    assert repr(state) == frozen


def test_plans_respect_remaining_tokens(factory):
    policy = factory(0)
    plan = policy.plan(PlanState(round_index=0, context_length=5, remaining_tokens=2))
    assert plan.num_draft_tokens <= 1
    plan = policy.plan(PlanState(round_index=0, context_length=5, remaining_tokens=1))
    assert plan.num_draft_tokens == 0


# -- behaviour ----------------------------------------------------------------------
def test_heuristic_plus_two_minus_one():
    policy = HeuristicK(initial_k=4, k_min=1, k_max=9)
    def rec(k, a):
        return RoundRecord(0, 0, k, k, k + 1, a, a + 1)
    policy.plan(PlanState())
    policy.observe(rec(4, 4))
    assert policy.num_draft_tokens == 6
    policy.observe(rec(6, 2))
    assert policy.num_draft_tokens == 5
    for _ in range(5):
        policy.observe(rec(policy.num_draft_tokens, policy.num_draft_tokens))
    assert policy.num_draft_tokens == 9
    for _ in range(20):
        policy.observe(rec(policy.num_draft_tokens, 0))
    assert policy.num_draft_tokens == 1


def test_theory_optimal_k_converges_to_the_closed_form():
    """After T rounds at Acc = 0.8 the estimate is within 4 binomial standard errors
    (plus the prior's bias) and k is the closed form's k over that interval."""
    acc, ratio = 0.8, 0.05
    policy = TheoryOptimalK(ratio, prior_acceptance=0.5, prior_strength=10, k_max=16)
    run_policy(policy, 2000, seed=0, acc=acc)
    trials = policy.accepted + policy.rejections
    se = math.sqrt(acc * (1 - acc) / trials)
    bias = 10 * abs(0.5 - acc) / trials
    assert abs(policy.acceptance_estimate - acc) <= 4 * se + bias
    ks = {optimal_k_exact(a, ratio, k_max=16) for a in
          np.linspace(acc - 4 * se - bias, acc + 4 * se + bias, 41)}
    assert policy.plan(PlanState()).num_draft_tokens in ks


def test_confidence_stop_thresholds():
    policy = ConfidenceStop(0.5, max_draft_tokens=3)
    assert policy.continue_drafting(DraftStep(1, 5, np.array([0.6]), 0.6, 0.6))
    assert not policy.continue_drafting(DraftStep(1, 5, np.array([0.4]), 0.4, 0.4))
    assert not policy.continue_drafting(DraftStep(3, 5, np.array([0.9]), 0.9, 0.9))
    with pytest.raises(ValueError):
        policy.continue_drafting(DraftStep(1, 5, np.array([1.5]), 1.5, 1.5))


def test_tree_policies():
    plan = StaticTree((3, 2, 1)).plan(PlanState())
    assert plan.tree.branching == (3, 2, 1) and plan.num_draft_tokens == 3
    assert static_tree_size((3, 2, 1)) == 3 + 6 + 6
    dyn = DynamicTree(top_k=10, max_depth=6, verify_size=60)
    plan = dyn.plan(PlanState())
    assert plan.tree.top_k == 10 and plan.tree.max_depth == 6 and plan.tree.verify_size == 60
    cands = TreeCandidates(6, 10, np.array([0.1, 0.9, 0.5, 0.5, 0.2]))
    assert dyn.verify_size(cands) == 5
    np.testing.assert_array_equal(DynamicTree.select_nodes(cands, 3), [1, 2, 3])
    with pytest.raises(ValueError):
        dyn.verify_size(TreeCandidates(1, 1, np.array([np.nan])))


def test_bad_policy_inputs():
    for make in (lambda: FixedK(-1), lambda: FixedK(2.5), lambda: HeuristicK(k_min=5, k_max=2),
                 lambda: TheoryOptimalK(0.0), lambda: TheoryOptimalK(0.1, prior_acceptance=1.0),
                 lambda: UCBK(arms=()), lambda: UCBK(arms=(1, 1)), lambda: EXP3K(gamma=0.0),
                 lambda: ConfidenceStop(1.5), lambda: ConfidenceStop(criterion="entropy"),
                 lambda: StaticTree(()), lambda: DynamicTree(top_k=0), lambda: FixedK(1, seed=-3)):
        with pytest.raises(ValueError):
            make()
    bandit = UCBK()
    with pytest.raises(ValueError, match="plan"):
        bandit.observe(RoundRecord(0, 0, 1, 1, 2, 1, 2, 0.1, 1.0))
    bandit.plan(PlanState())
    with pytest.raises(ValueError, match="time"):
        bandit.observe(RoundRecord(0, 0, 1, 1, 2, 1, 2))
    with pytest.raises(ValueError, match="RoundRecord"):
        FixedK(1).observe({"round_index": 0})
    with pytest.raises(ValueError, match="belongs"):
        FixedK(1).load_state_dict(HeuristicK().state_dict())


# -- bandits converge to the best arm --------------------------------------------------
ARMS, ACC, RATIO, HORIZON = (0, 1, 10), 0.95, 0.02, 3000


def _arm_means(bound: float) -> np.ndarray:
    """Expected normalised reward of each arm: E[n_t] / (1 + ratio k) / bound."""
    return np.array([float(expected_tokens_chain(ACC, k)) / (1 + RATIO * k) / bound for k in ARMS])


def _run_bandit(policy) -> np.ndarray:
    rng = np.random.default_rng(2024)
    pulls = np.zeros(len(ARMS), dtype=int)
    for t in range(HORIZON):
        plan, record = simulate_round(policy, t, rng, acc=ACC, cost_ratio=RATIO)
        pulls[ARMS.index(plan.num_draft_tokens)] += 1
        assert 0 <= round_reward(record) <= policy.reward_bound + 1e-12
        policy.observe(record)
    return pulls


def test_ucb_converges_within_the_ucb1_bound():
    """Rewards lie in [0, bound] with bound = max_k (k + 1) / (1 + ratio k), so the UCB1
    theorem (Auer et al. 2002, Thm 1) bounds the expected pulls of each suboptimal arm
    by 8 ln T / Delta_i^2 + 1 + pi^2 / 3."""
    bound = max((k + 1) / (1 + RATIO * k) for k in ARMS)
    means = _arm_means(bound)
    best = int(np.argmax(means))
    pulls = _run_bandit(UCBK(ARMS, reward_bound=bound, seed=0))
    limit = sum(8 * math.log(HORIZON) / (means[best] - m) ** 2 + 1 + math.pi ** 2 / 3
                for i, m in enumerate(means) if i != best)
    assert limit < HORIZON / 2  # the bound is informative at this T
    assert HORIZON - pulls[best] <= limit
    assert ARMS[best] == 10


def test_exp3_converges_within_its_regret_bound():
    """EXP3 with gamma tuned for T (Auer et al. 2002, Cor. 3.2): pseudo-regret
    <= 2 sqrt(e - 1) sqrt(T K ln K) in normalised reward units."""
    bound = max((k + 1) / (1 + RATIO * k) for k in ARMS)
    means = _arm_means(bound)
    policy = EXP3K(ARMS, horizon=HORIZON, reward_bound=bound, seed=0)
    pulls = _run_bandit(policy)
    pseudo_regret = HORIZON * means.max() - float(pulls @ means)
    k = len(ARMS)
    assert pseudo_regret <= 2 * math.sqrt(math.e - 1) * math.sqrt(HORIZON * k * math.log(k))
    assert ARMS[int(np.argmax(pulls))] == 10
    # the best arm is pulled more than the uniform-exploration share (binomial test)
    assert stats.binomtest(int(pulls.max()), HORIZON, 1 / k, alternative="greater").pvalue < 1e-6
