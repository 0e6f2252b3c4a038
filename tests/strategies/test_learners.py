"""Online learners: one conformance suite over every learner x {NumPy, torch} -- the
hand-built configurations below and every learner of the registry
(`specloop.strategies.registry`), plain and inside the RMS `Preconditioned` wrapper,
driven through their declared feedback -- plus the regret bounds of OnlineSpec
Corollaries 1-3 where their assumptions hold."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from array_api_compat import array_namespace, device
from hypothesis import given, settings

from specloop.strategies import (OGD, HedgeEnsemble, OnlineLearner, OptimisticEnsemble,
                                 OptimisticOGD, OSDDistillation, default_num_learners,
                                 geometric_learning_rates)
from specloop.strategies import _arrays as A
from specloop.strategies.registry import LEARNER_NAMES, learner_feedback, learns_from_round, learner_from_name
from specloop.theory.regret import (corollary1_regret_bound, corollary3_num_base_learners,
                                    corollary3_regret_bound)
from tests.strategies import convex_streams

# -- a fixed convex problem: linear softmax regression, f(w) = CE(p, softmax(W x + b)) ---
VOCAB, FEATURES, RADIUS = 5, 3, 4.0
_rng = np.random.default_rng(123)
X = _rng.standard_normal(FEATURES)
P = np.exp(_rng.standard_normal(VOCAB) * 1.5)
P /= P.sum()


def ce_oracle(params, x=X, p=P):
    """Loss and gradient of the cross-entropy in the params' namespace (NumPy/torch)."""
    xp = array_namespace(*params)
    w, b = params
    xs = xp.asarray(x, dtype=w.dtype, device=device(w))
    ps = xp.asarray(p, dtype=w.dtype, device=device(w))
    z = w @ xs + b
    z = z - xp.max(z)
    q = xp.exp(z) / xp.sum(xp.exp(z))
    loss = float(-xp.sum(ps * xp.log(q)))
    g = q - ps
    return loss, [g[:, None] * xs[None, :], g]


def init_params(backend: str, dtype=None):
    w = [np.full((VOCAB, FEATURES), 0.1), np.zeros(VOCAB)]
    if backend == "torch":
        return [torch.tensor(a, dtype=dtype or torch.float64) for a in w]
    return w


# -- learner factories: (name, factory(seed), feedback mode) --------------------------
def _osd_data(seed):
    return OSDDistillation(0.3, update_every=3, batch_size=2, optimizer="adam", radius=RADIUS,
                           loss_and_grad=lambda params, ctx, p: ce_oracle(params, ctx, p),
                           seed=seed)


LEARNERS = {
    "ogd": (lambda seed: OGD(0.5, RADIUS, seed=seed), "none"),
    "optimistic": (lambda seed: OptimisticOGD(0.5, RADIUS, seed=seed), "none"),
    "optimistic-adaptive": (lambda seed: OptimisticOGD(2.0, RADIUS, adaptive=True, seed=seed), "none"),
    "ensemble-oracle": (lambda seed: HedgeEnsemble(geometric_learning_rates(0.05, 5), RADIUS, 2.0,
                                                   seed=seed), "oracle"),
    "ensemble-surrogate": (lambda seed: HedgeEnsemble(geometric_learning_rates(0.05, 5), RADIUS,
                                                      2.0, seed=seed), "none"),
    "optimistic-ensemble": (lambda seed: OptimisticEnsemble(geometric_learning_rates(0.05, 5),
                                                            RADIUS, 2.0, seed=seed), "oracle"),
    "osd-oracle": (lambda seed: OSDDistillation(0.5, update_every=1, radius=RADIUS, seed=seed),
                   "oracle"),
    "osd-feedback-adam": (_osd_data, "feedback"),
}

# every registered learner, built by the registry, plain and RMS-preconditioned; driven
# in "protocol" mode: each gets the feedback it declares (`learner_feedback`)
_REGISTRY_LR = {"ogd": 0.5, "optimistic": 0.5, "ensemble": 0.05, "optimistic-ensemble": 0.05, "osd": 0.3}
_RMS_LR = {"ogd": 0.05, "optimistic": 0.05, "ensemble": 0.01, "optimistic-ensemble": 0.01, "osd": 0.3}


def _registered(name: str, precondition: str = "none"):
    lr = (_RMS_LR if precondition == "rms" else _REGISTRY_LR)[name]
    return lambda seed: learner_from_name(name, lr, radius=RADIUS, seed=seed, num_learners=5, meta_lr=2.0,
                                     update_every=3, batch_size=2, optimizer="adam",
                                     loss_and_grad=lambda params, ctx, p: ce_oracle(params, ctx, p),
                                     precondition=precondition)


REGISTERED = {f"registry-{n}": (_registered(n), "protocol") for n in LEARNER_NAMES}
REGISTERED.update({f"registry-rms-{n}": (_registered(n, "rms"), "protocol") for n in LEARNER_NAMES})
LEARNERS.update(REGISTERED)
BACKENDS = ("numpy", "torch")
#: which rounds "reject a draft token" in protocol mode (a fixed pattern)
REJECTED = (True, False, True, True, False)


def feedback(learner, mode: str, params, t: int):
    """Round t's feedback as an engine gives it: returns (loss, grads, oracle for step).
    "feedback": the round's (context, p_target) through add_feedback; "oracle": an
    oracle to step; "protocol": what the learner declares -- "rejections" learners get
    rejected rounds through add_feedback, "played" ones the oracle."""
    loss, grads = ce_oracle(params)
    if mode == "protocol":
        if learner_feedback(learner) == "rejections":
            if learns_from_round(learner, REJECTED[t % len(REJECTED)]):
                learner.add_feedback(context=X, p_target=P)
            return loss, grads, None
        return loss, grads, ce_oracle
    if mode == "feedback":
        learner.add_feedback(context=X, p_target=P)
    return loss, grads, ce_oracle if mode == "oracle" else None


def drive(learner, mode: str, params, rounds: int):
    """Play ``rounds`` rounds on the fixed problem; returns (params, losses)."""
    losses = []
    for t in range(rounds):
        loss, grads, oracle = feedback(learner, mode, params, t)
        losses.append(loss)
        params = learner.step(params, grads, loss, oracle=oracle)
    return params, losses


def _np(arrays):
    return A.to_numpy_list(arrays)


@pytest.fixture(params=list(LEARNERS), ids=list(LEARNERS))
def learner_case(request):
    return LEARNERS[request.param]


def test_satisfies_the_online_learner_protocol(learner_case):
    factory, _ = learner_case
    assert isinstance(factory(0), OnlineLearner)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_determinism(learner_case, backend):
    factory, mode = learner_case
    a, _ = drive(factory(7), mode, init_params(backend), 12)
    b, _ = drive(factory(7), mode, init_params(backend), 12)
    for x, y in zip(_np(a), _np(b)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("backend,dtype", [("numpy", None), ("torch", torch.float64),
                                           ("torch", torch.float32)])
def test_shapes_namespace_dtype_and_no_mutation(learner_case, backend, dtype):
    factory, mode = learner_case
    learner = factory(0)
    params = init_params(backend, dtype)
    for t in range(4):
        loss, grads, oracle = feedback(learner, mode, params, t)
        before_p, before_g = _np(params), _np(grads)
        out = learner.step(params, grads, loss, oracle=oracle)
        for arr, ref in zip(params, before_p):
            np.testing.assert_array_equal(_np([arr])[0], ref)
        for arr, ref in zip(grads, before_g):
            np.testing.assert_array_equal(_np([arr])[0], ref)
        assert len(out) == len(params)
        for o, p in zip(out, params):
            assert type(o) is type(p) and o.dtype == p.dtype and tuple(o.shape) == tuple(p.shape)
            assert o is not p
            if backend == "numpy":
                assert not np.shares_memory(o, p)
        assert A.joint_norm(out) <= RADIUS * (1 + 1e-6)
        params = out


def _walk_numpy_only(value):
    if isinstance(value, dict):
        for v in value.values():
            _walk_numpy_only(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _walk_numpy_only(v)
    else:
        assert not isinstance(value, torch.Tensor), "state_dict must hold NumPy arrays"


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dict_round_trip(learner_case, backend):
    factory, mode = learner_case
    original = factory(3)
    params, _ = drive(original, mode, init_params(backend), 5)
    state = original.state_dict()
    _walk_numpy_only(state)
    clone = factory(99)
    clone.load_state_dict(state)
    a, _ = drive(original, mode, params, 6)
    b, _ = drive(clone, mode, params, 6)
    for x, y in zip(_np(a), _np(b)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-12)


@functools.lru_cache(maxsize=None)
def _best_loss_in_ball() -> float:
    w = init_params("numpy")
    for _ in range(2000):
        _, g = ce_oracle(w)
        w = A.project_ball(A.add_scaled(w, g, -0.5), RADIUS)
    return ce_oracle(w)[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_learns_the_fixed_convex_problem(learner_case, backend):
    """Loss falls by >= 80% of the gap to the best draft in the ball, and the
    average regret of the second half is below that of the first half."""
    factory, mode = learner_case
    best = _best_loss_in_ball()
    _, losses = drive(factory(0), mode, init_params(backend), 120)
    gap0 = losses[0] - best
    assert gap0 > 0.1
    assert losses[-1] - best <= 0.2 * gap0
    regret = np.asarray(losses) - best
    assert regret[60:].mean() < regret[:60].mean()


# -- validation -------------------------------------------------------------------
def test_bad_inputs_raise_value_error():
    w = init_params("numpy")
    with pytest.raises(ValueError, match="learning rate"):
        OGD(0.0)
    with pytest.raises(ValueError, match="radius"):
        OGD(0.1, radius=-1.0)
    with pytest.raises(ValueError, match="shape"):
        OGD(0.1).step(w, [np.zeros((2, 2)), np.zeros(VOCAB)], 1.0)
    with pytest.raises(ValueError, match="NaN"):
        OGD(0.1).step(w, [np.full((VOCAB, FEATURES), np.nan), np.zeros(VOCAB)], 1.0)
    with pytest.raises(ValueError, match="arrays"):
        OGD(0.1).step(w, w[:1], 1.0)
    with pytest.raises(ValueError, match="empty"):
        OGD(0.1).step([], [], 1.0)
    with pytest.raises(ValueError, match="loss_and_grad"):
        OSDDistillation(0.1).add_feedback(context=X, p_target=P)
    with pytest.raises(ValueError, match="probability"):
        _osd_data(0).add_feedback(context=X, p_target=np.array([0.5, 0.6, -0.1, 0.0, 0.0]))
    with pytest.raises(ValueError, match="finite loss"):
        HedgeEnsemble([0.1]).step(w, ce_oracle(w)[1], 1.0, oracle=lambda p: (math.nan, ce_oracle(p)[1]))
    with pytest.raises(ValueError, match="base learners"):
        HedgeEnsemble([0.1, 0.2]).load_state_dict(HedgeEnsemble([0.1]).state_dict())
    with pytest.raises(ValueError, match="horizon"):
        geometric_learning_rates(0.1)


def test_geometric_grid_matches_appendix_d5():
    rates = geometric_learning_rates(0.01, horizon=1000)
    assert len(rates) == default_num_learners(1000) == math.ceil(0.5 * math.log2(1001)) + 1
    assert np.allclose(np.diff(np.log2(rates)), 1.0)


def test_ensemble_weights_follow_cumulative_loss():
    """p^i proportional to exp(-eps * L^i): with the true losses from the oracle the
    weights equal the softmax of the recorded cumulative losses."""
    ens = HedgeEnsemble(geometric_learning_rates(0.01, 4), RADIUS, meta_lr=3.0)
    drive(ens, "oracle", init_params("numpy"), 20)
    expected = np.exp(-3.0 * (ens.cumulative_loss - ens.cumulative_loss.min()))
    np.testing.assert_allclose(ens.weights, expected / expected.sum(), rtol=1e-12)
    assert np.argmax(ens.weights) == np.argmin(ens.cumulative_loss)


def test_optimistic_two_step_update_eq3():
    """Eq. (3) by hand on R^1 with radius None: w_hat_2 = w_1 - eta g_1, w_2 = w_hat_2 - eta g_1."""
    learner = OptimisticOGD(0.1)
    out = learner.step([np.array([1.0])], [np.array([2.0])], 0.0)
    np.testing.assert_allclose(out[0], [1.0 - 0.2 - 0.2])
    out = learner.step(out, [np.array([-1.0])], 0.0)  # w_hat_3 = 0.8 + 0.1; w_3 = 0.9 + 0.1
    np.testing.assert_allclose(out[0], [1.0])
    assert learner.hint_error == pytest.approx(4.0 + 9.0)


def test_osd_updates_only_every_update_every_rounds():
    learner = OSDDistillation(0.5, update_every=4, radius=RADIUS, seed=0)
    params = init_params("numpy")
    for t in range(1, 9):
        loss, grads = ce_oracle(params)
        new = learner.step(params, grads, loss, oracle=ce_oracle)
        changed = any(not np.array_equal(a, b) for a, b in zip(new, params))
        assert changed == (t % 4 == 0)
        assert len(learner.buffer) == (0 if t % 4 == 0 else t % 4)
        params = new
    assert learner.num_updates == 2


# -- regret bounds (Assumption 2 holds: convex losses, ball, bounded gradients) --------
def _play(stream, learner, use_oracle=False):
    """Run a learner on a convex stream; return (Reg_T, P_T, delta_T of the last-grad hint)."""
    shapes, vecs, kind, radius = stream["shapes"], stream["vectors"], stream["kind"], stream["radius"]
    cuts = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]

    def split(v):
        return [part.reshape(s) for part, s in zip(np.split(v, cuts), shapes)]

    def flat(ws):
        return np.concatenate([np.ravel(w) for w in ws])

    def oracle_for(v):
        if kind == "quadratic":
            return lambda ws: (0.5 * float(np.sum((flat(ws) - v) ** 2)), split(flat(ws) - v))
        return lambda ws: (float(flat(ws) @ v), split(v.copy()))

    def comparator(v):
        if kind == "quadratic":
            return v
        n = np.linalg.norm(v)
        return -radius * v / n if n > 0 else np.zeros_like(v)

    w = split(np.zeros(vecs.shape[1]))
    regret, prev_grad, delta = 0.0, None, 0.0
    stars = [comparator(v) for v in vecs]
    for v, star in zip(vecs, stars):
        oracle = oracle_for(v)
        loss, grads = oracle(w)
        regret += loss - oracle(split(star))[0]
        g = flat(grads)
        delta += float(g @ g) if prev_grad is None else float((g - prev_grad) @ (g - prev_grad))
        prev_grad = g
        w = learner.step(w, grads, loss, oracle=oracle if use_oracle else None)
        assert A.joint_norm(w) <= radius * (1 + 1e-9)
    path = float(sum(np.linalg.norm(b - a) for a, b in zip(stars[:-1], stars[1:])))
    return regret, path, delta


@settings(max_examples=40, deadline=None)
@given(convex_streams())
def test_ogd_regret_under_corollary1(stream):
    """OGD with eta = D/(G sqrt T), D = 2R the diameter: Reg_T <= D G sqrt(T) + G sqrt(T) P_T
    (App. D.3 telescoping with explicit constants) <= corollary1_regret_bound."""
    T, R, G = stream["rounds"], stream["radius"], stream["gradient_bound"]
    D = 2 * R
    regret, path, _ = _play(stream, OGD(D / (G * math.sqrt(T)), R))
    explicit = D * G * math.sqrt(T) + G * math.sqrt(T) * path
    assert regret <= explicit + 1e-9
    assert regret <= float(corollary1_regret_bound(T, path, D, G)) + 1e-9


@settings(max_examples=40, deadline=None)
@given(convex_streams())
def test_optimistic_regret_under_corollary2_inequality(stream):
    """Optimistic OGD (Eq. 3), constant eta: Reg_T <= eta delta_T + (D^2 + 2 D P_T) / (2 eta)
    (App. D.4, Eq. (11)), delta_T measured with the last-gradient hint."""
    T, R, G = stream["rounds"], stream["radius"], stream["gradient_bound"]
    D = 2 * R
    eta = D / (G * math.sqrt(T))
    learner = OptimisticOGD(eta, R)
    regret, path, delta = _play(stream, learner)
    assert learner.hint_error == pytest.approx(delta, rel=1e-9, abs=1e-12)
    assert regret <= eta * delta + (D * D + 2 * D * path) / (2 * eta) + 1e-9


@settings(max_examples=30, deadline=None)
@given(convex_streams())
def test_hedge_ensemble_regret_under_corollary3(stream):
    """Hedge over N = corollary3_num_base_learners(T) OGD learners, eta_i = 2^{i-1} D/(G sqrt T),
    eps = sqrt(8 ln N)/(G D sqrt T), true base losses via the oracle:
    Reg_T <= corollary3_regret_bound(T, P_T, D, G)."""
    T, R, G = stream["rounds"], stream["radius"], stream["gradient_bound"]
    D = 2 * R
    n = corollary3_num_base_learners(T)
    meta_lr = math.sqrt(8 * math.log(max(n, 2))) / (G * D * math.sqrt(T))
    ens = HedgeEnsemble(geometric_learning_rates(D / (G * math.sqrt(T)), n), R, meta_lr)
    regret, path, _ = _play(stream, ens, use_oracle=True)
    assert regret <= float(corollary3_regret_bound(T, path, D, G)) + 1e-9


def test_regret_sublinear_on_a_stationary_stream():
    """Fixed quadratic, OGD tuned for each T: Reg_T / sqrt(T) stays bounded as T grows x16."""
    ratios = []
    for T in (64, 256, 1024):
        stream = {"kind": "quadratic", "radius": 1.0, "shapes": [(2,)], "rounds": T,
                  "vectors": np.tile([0.6, -0.3], (T, 1)), "gradient_bound": 2.0}
        regret, path, _ = _play(stream, OGD(2.0 / (2.0 * math.sqrt(T)), 1.0))
        assert path == 0.0
        ratios.append(regret / math.sqrt(T))
    assert ratios[-1] <= ratios[0] * 1.05


def test_torch_parameters_with_autograd(learner_case):
    """nn.Parameter inputs (requires_grad) give plain detached tensors, inputs untouched."""
    factory, mode = learner_case
    params = [torch.nn.Parameter(t) for t in init_params("torch")]
    learner = factory(0)
    loss, grads, oracle = feedback(learner, mode, [p.detach() for p in params], 0)
    before = _np(params)
    out = learner.step(params, grads, loss, oracle=oracle)
    assert all(not o.requires_grad for o in out)
    for p, ref in zip(params, before):
        np.testing.assert_array_equal(p.detach().numpy(), ref)
