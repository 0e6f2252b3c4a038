"""The learners' oracle in the real decoder: losses and gradients at other parameter
values without writing them into the drafter (`online.functional.ParameterOwner`), all of
an ensemble's base learners in one stacked call (``stacked_oracle``), and the cost of
each ensemble variant in objective evaluations per learner step."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.online import OnlineAdapter, OnlineConfig, OnlineDrafter
from specloop.realmodels.online.functional import ParameterOwner
from tests.realmodels.test_online import serve
from tests.realmodels.test_online_util import (eagle_drafter, hydra_drafter, medusa_drafter, prompts,
                                               small_lm_drafter, tiny_loaded)

MAKERS = {"hydra": hydra_drafter, "medusa": medusa_drafter, "small-lm": small_lm_drafter,
          "eagle": lambda t: eagle_drafter(t, "eagle"), "eagle3": lambda t: eagle_drafter(t, "eagle3")}


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


def _batch(target, make, config=None):
    """A drafter, its adapter, and a mini-batch of real samples from a served prompt."""
    inner = make(target)
    adapter = OnlineAdapter(inner, config or OnlineConfig(learner="ogd", lr=1e-9, batch_size=3))
    serve(target, OnlineDrafter(inner, adapter), prompts(2), max_new_tokens=14)
    return inner, adapter, adapter.buffer[-3:]


def _written_loss_grad(adapter, values, samples):
    """The reference: values written into the drafter, loss and gradient, weights restored."""
    saved = [p.detach().clone() for p in adapter.params]
    try:
        adapter._write(values)
        return adapter._loss_grad(samples)
    finally:
        adapter._write(saved)


def _points(adapter, n=3):
    gen = torch.Generator().manual_seed(7)
    return [[p.detach() + 0.02 * (i + 1) * torch.randn(p.shape, generator=gen) for p in adapter.params]
            for i in range(n)]


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_substituted_values_give_the_written_values_loss_and_leave_the_drafter(target, kind):
    inner, adapter, samples = _batch(target, MAKERS[kind])
    assert adapter.owner is not None, f"{kind}: no module holds the parameters"
    before = [p.detach().clone() for p in inner.parameters()]
    for values in _points(adapter, 2):
        loss, grads, first = adapter.owner.loss_grad(adapter.objective, values, samples)
        ref_loss, ref_grads = _written_loss_grad(adapter, values, samples)
        assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-7)
        assert first == pytest.approx(_written_loss_grad(adapter, values, samples[:1])[0], rel=1e-6, abs=1e-7)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    for a, b in zip(before, inner.parameters()):
        assert torch.equal(a, b.detach())


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_stacked_call_equals_one_call_per_point(target, kind):
    _, adapter, samples = _batch(target, MAKERS[kind])
    points = _points(adapter, 3)
    losses, grads = adapter.owner.loss_grad_many(adapter.objective, points, samples)
    for values, loss, g in zip(points, losses, grads):
        ref_loss, ref_grads = _written_loss_grad(adapter, values, samples)
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
        for a, b in zip(g, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["hydra", "eagle3"])
@pytest.mark.parametrize("learner", ["ensemble", "optimistic-ensemble"])
def test_stacked_ensemble_run_has_the_records_of_the_unstacked_run(target, kind, learner):
    runs = []
    for stacked in (False, True):
        inner = MAKERS[kind](target)
        adapter = OnlineAdapter(inner, OnlineConfig(learner=learner, lr=0.02, batch_size=2,
                                                    stacked_oracle=stacked))
        results = serve(target, OnlineDrafter(inner, adapter), prompts(3), max_new_tokens=16)
        runs.append(([r.trace.column("accepted_tokens").tolist() for r in results],
                     [r.new_tokens for r in results], [p.detach().clone() for p in inner.parameters()],
                     adapter.learner.weights.copy()))
    (acc_a, out_a, par_a, w_a), (acc_b, out_b, par_b, w_b) = runs
    assert acc_a == acc_b and out_a == out_b
    for a, b in zip(par_a, par_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert w_a == pytest.approx(w_b, rel=1e-4)


@pytest.mark.parametrize("losses, per_step", [("exact", 1 + 3), ("linearised", 1)])
def test_objective_evaluations_per_learner_step(target, monkeypatch, losses, per_step):
    """An exact ensemble of 3 evaluates the played point (its loss only, no gradient) and
    each base learner; a linearised one evaluates the played point once."""
    inner = hydra_drafter(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ensemble", lr=0.02, batch_size=2,
                                                ensemble_losses=losses))
    calls = {"n": 0, "backward_at_played": 0}
    original = type(adapter.objective).loss_and_sample_losses

    def counted(self, samples):
        calls["n"] += 1
        return original(self, samples)
    monkeypatch.setattr(type(adapter.objective), "loss_and_sample_losses", counted)
    loss_grad = adapter.train.loss_grad

    def counted_grad(samples):
        calls["backward_at_played"] += 1
        return loss_grad(samples)
    monkeypatch.setattr(adapter.train, "loss_grad", counted_grad)
    serve(target, OnlineDrafter(inner, adapter), prompts(1), max_new_tokens=12)
    assert adapter.num_steps > 0
    assert calls["n"] == per_step * adapter.num_steps
    assert calls["backward_at_played"] == (adapter.num_steps if losses == "linearised" else 0)


def test_bad_ensemble_losses():
    with pytest.raises(ValueError, match="ensemble_losses must be one of"):
        OnlineConfig(learner="ensemble", ensemble_losses="surrogate")
