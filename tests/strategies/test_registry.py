"""The learner registry (one set of names, aliases, clear errors, declared feedback) and
the RMS `Preconditioned` wrapper (its update, oracle scaling, pass-through for learners
that ignore the played gradient, bit equality with torch's in-place optimiser form)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specloop.strategies import (OGD, HedgeEnsemble, OnlineLearner, OptimisticEnsemble, OptimisticOGD,
                                 OSDDistillation, Preconditioned, geometric_learning_rates)
from specloop.strategies import _arrays as A
from specloop.strategies.registry import (FEEDBACK_KINDS, LEARNER_ALIASES, LEARNER_NAMES, LEARNER_SPECS,
                                          learner_feedback, learner_spec, learns_from_round, learner_from_name,
                                          resolve_learner)
from tests.strategies.test_learners import LEARNERS, P, X, ce_oracle, drive, init_params


def test_one_set_of_names_with_todays_short_names_as_aliases():
    assert LEARNER_NAMES == ("ogd", "optimistic", "ensemble", "optimistic-ensemble", "osd")
    want = {"opt": "optimistic", "ens": "ensemble", "optens": "optimistic-ensemble",
            "opt-ens": "optimistic-ensemble"}
    assert LEARNER_ALIASES == want
    for alias, name in want.items():
        assert resolve_learner(alias) == name
        assert resolve_learner(alias.upper().replace("-", "_")) == name   # case, "_" = "-"
    for name in LEARNER_NAMES:
        assert resolve_learner(name) == name and learner_spec(name).name == name
    classes = {s.name: s.cls for s in LEARNER_SPECS}
    assert classes == {"ogd": OGD, "optimistic": OptimisticOGD, "ensemble": HedgeEnsemble,
                       "optimistic-ensemble": OptimisticEnsemble, "osd": OSDDistillation}
    # the stream's method prefixes and the paper's labels come from the same table
    assert [s.short for s in LEARNER_SPECS] == ["ogd", "opt", "ens", "optens", "osd"]
    assert [s.label for s in LEARNER_SPECS] == ["OGD", "Opt", "Ens", "OptEns", "OSD"]


@pytest.mark.parametrize("alias", sorted(LEARNER_ALIASES))
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_an_alias_builds_the_same_learner_as_its_name(alias, backend):
    kwargs = dict(radius=4.0, seed=3, num_learners=4, meta_lr=2.0)
    a, b = learner_from_name(alias, 0.1, **kwargs), learner_from_name(LEARNER_ALIASES[alias], 0.1, **kwargs)
    assert type(a) is type(b)
    pa, _ = drive(a, "oracle", init_params(backend), 6)
    pb, _ = drive(b, "oracle", init_params(backend), 6)
    for x, y in zip(A.to_numpy_list(pa), A.to_numpy_list(pb)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("bad", ["adam", "", "ogd2", "opt-ogd"])
def test_unknown_name_is_a_value_error_listing_the_names(bad):
    with pytest.raises(ValueError, match="unknown learner") as info:
        resolve_learner(bad)
    for name in LEARNER_NAMES + tuple(LEARNER_ALIASES):
        assert name in str(info.value)
    with pytest.raises(ValueError, match="unknown learner"):
        learner_from_name(bad, 0.1)
    with pytest.raises(ValueError, match="string"):
        resolve_learner(None)


def test_every_registered_learner_is_in_the_conformance_suite():
    """A newly registered learner must join test_learners.py (plain and wrapped)."""
    for name in LEARNER_NAMES:
        assert f"registry-{name}" in LEARNERS and f"registry-rms-{name}" in LEARNERS
        assert isinstance(LEARNERS[f"registry-rms-{name}"][0](0), Preconditioned)


def test_declared_feedback():
    for name in LEARNER_NAMES:
        plain, wrapped = learner_from_name(name, 0.1), learner_from_name(name, 0.1, precondition="rms")
        want = "rejections" if name == "osd" else "played"
        assert learner_feedback(plain) == learner_feedback(wrapped) == want
        assert isinstance(plain, OnlineLearner) and isinstance(wrapped, OnlineLearner)
        assert learns_from_round(plain, rejected=True)
        assert learns_from_round(plain, rejected=False) == (want == "played")
    assert set(FEEDBACK_KINDS) == {"played", "rejections"}
    assert learner_feedback(object()) == "played"        # the protocol's default

    class Odd:
        feedback = "sometimes"
    with pytest.raises(ValueError, match="feedback"):
        learner_feedback(Odd())


# -- the Preconditioned wrapper ----------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_first_rms_step_is_lr_times_g_over_abs_g(backend):
    """v_1 = (1 - beta) g^2, v_hat_1 = g^2: the first OGD step is lr * g / (|g| + eps)."""
    params = init_params(backend)
    loss, grads = ce_oracle(params)
    learner = Preconditioned(OGD(0.01), decay=0.9, eps=1e-8)
    out = learner.step(params, grads, loss)
    for o, p, g in zip(*(A.to_numpy_list(x) for x in (out, params, grads))):
        np.testing.assert_allclose(p - o, 0.01 * g / (np.abs(g) + 1e-8), rtol=1e-12, atol=1e-15)
    assert learner.steps == 1
    for v, g in zip(A.to_numpy_list(learner.second_moment), A.to_numpy_list(grads)):
        np.testing.assert_allclose(v, 0.1 * g * g, rtol=1e-12)


def test_rms_update_equals_torch_in_place_form_bit_for_bit():
    """v.mul_(beta).addcmul_(g, g, value=1 - beta), g / ((v / c).sqrt() + eps) and
    p.add_(scaled, alpha=-lr): the in-place optimiser form (torch.optim's SGD step is
    ``param.add_(grad, alpha=-lr)``), bit for bit."""
    torch.manual_seed(0)
    params = [torch.randn(300, 40), torch.randn(40)]
    beta, learner = 0.95, Preconditioned(OGD(1e-3), decay=0.95)
    v = [torch.zeros_like(p) for p in params]
    for step in range(1, 6):
        grads = [torch.randn_like(p) * 1e-2 for p in params]
        for vi, g in zip(v, grads):
            vi.mul_(beta).addcmul_(g, g, value=1.0 - beta)
        c = 1.0 - beta ** step
        want = [p.clone().add_(g / ((vi / c).sqrt() + 1e-8), alpha=-1e-3) for p, g, vi in zip(params, grads, v)]
        params = learner.step(params, grads, 0.0)
        assert all(torch.equal(a, b) for a, b in zip(params, want))
        assert all(torch.equal(a, b) for a, b in zip(learner.second_moment, v))


def test_oracle_gradients_are_scaled_too():
    """An ensemble inside the wrapper sees g / (sqrt(v_hat) + eps) from the oracle, with v
    updated by the played gradient first: the same as an ensemble given a scaled oracle."""
    params = init_params("numpy")
    wrapped = Preconditioned(HedgeEnsemble(geometric_learning_rates(0.01, 3), 4.0, 2.0), decay=0.9)
    plain = HedgeEnsemble(geometric_learning_rates(0.01, 3), 4.0, 2.0)
    v, steps = None, 0
    for _ in range(5):
        loss, grads = ce_oracle(params)
        v = [0.1 * g * g if v is None else 0.9 * vi + 0.1 * g * g for vi, g in zip(v or grads, grads)]
        steps += 1

        def scale(gs, v=v, c=1 - 0.9 ** steps):
            return [g / (np.sqrt(vi / c) + 1e-8) for g, vi in zip(gs, v)]
        got = wrapped.step(params, grads, loss, oracle=ce_oracle)
        want = plain.step(params, scale(grads), loss,
                          oracle=lambda w, scale=scale: (ce_oracle(w)[0], scale(ce_oracle(w)[1])))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
        params = got


@pytest.mark.parametrize("kind", ["data", "oracle"])
def test_a_rejections_learner_passes_through_unchanged(kind):
    """OSD ignores the played gradient, so there is no second moment: the wrapper is the
    identity around it (what precondition="rms" did for OSD before the wrapper)."""
    def osd():
        return OSDDistillation(0.2, update_every=2, batch_size=2, optimizer="adam", radius=4.0,
                               loss_and_grad=lambda w, c, p: ce_oracle(w, c, p), seed=1)
    plain, wrapped = osd(), Preconditioned(osd())
    pa = pb = init_params("torch")
    for t in range(7):
        for learner in (plain, wrapped):
            if t % 3 != 1:
                if kind == "data":
                    learner.add_feedback(context=X, p_target=P)
                else:
                    learner.add_feedback(oracle=ce_oracle)
        loss, grads = ce_oracle(pa)
        pa = plain.step(pa, grads, loss)
        pb = wrapped.step(pb, grads, loss)
        assert all(torch.equal(a, b) for a, b in zip(pa, pb))
        assert wrapped.buffered == plain.buffered == len(plain.buffer)
    assert wrapped.second_moment is None and wrapped.steps == 0 and plain.num_updates > 0


def test_wrapper_state_round_trip_through_numpy():
    a = learner_from_name("optimistic", 0.01, precondition="rms", rms_decay=0.8)
    pa, _ = drive(a, "oracle", init_params("torch"), 4)
    state = a.state_dict()
    assert state["class"] == "Preconditioned" and state["inner"]["class"] == "OptimisticOGD"
    assert all(isinstance(v, np.ndarray) for v in state["second_moment"])
    b = learner_from_name("optimistic", 0.01, precondition="rms", rms_decay=0.8)
    b.load_state_dict(state)
    ra, _ = drive(a, "oracle", pa, 3)
    rb, _ = drive(b, "oracle", pa, 3)
    assert all(torch.equal(x, y) for x, y in zip(ra, rb))
    with pytest.raises(ValueError, match="Preconditioned"):
        b.load_state_dict(OGD(0.1).state_dict())


def test_wrapper_bad_input():
    with pytest.raises(ValueError, match="rms_decay"):
        Preconditioned(OGD(0.1), decay=1.0)
    with pytest.raises(ValueError, match="eps"):
        Preconditioned(OGD(0.1), eps=0.0)
    with pytest.raises(ValueError, match="online learner"):
        Preconditioned(object())
    with pytest.raises(ValueError, match="precondition"):
        learner_from_name("ogd", 0.1, precondition="adam")
    with pytest.raises(ValueError, match="add_feedback"):
        Preconditioned(OGD(0.1)).add_feedback(oracle=ce_oracle)
    w = init_params("numpy")
    with pytest.raises(ValueError, match="shape"):
        Preconditioned(OGD(0.1)).step(w, [np.zeros((2, 2)), np.zeros(5)], 1.0)
