"""The real decoder's online adaptation reads the learner registry: one set of names
(aliases accepted, stored canonical), the learner's declared feedback decides what it is
given (no learner-name checks), RMS preconditioning is the learner's, and checkpoints
from before the registry (alias names, the RMS moment beside the learner) still resume."""
from __future__ import annotations

import math

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.online import (DEFAULT_LR, LEARNER_KINDS, OnlineAdapter, OnlineConfig, OnlineDrafter,
                                        head_learner)
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.streams.runner import METHODS
from specloop.strategies import Preconditioned
from specloop.strategies.registry import LEARNER_ALIASES, LEARNER_NAMES
from tests.realmodels.test_online_util import NO_EOS, hydra_drafter, prompts, tiny_loaded


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


def serve(target, drafter, stream, max_new_tokens=14, start=0):
    out = []
    for i, ids in enumerate(stream):
        dec = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3), eos_token_id=NO_EOS, seed=start + i)
        out.append(dec.generate(ids, max_new_tokens, stream_index=start + i).trace.column("accepted_tokens").tolist())
    return out


def test_one_vocabulary():
    assert LEARNER_KINDS == LEARNER_NAMES and set(DEFAULT_LR) == set(LEARNER_NAMES)
    for alias, name in LEARNER_ALIASES.items():
        assert OnlineConfig(learner=alias).learner == name
        assert OnlineConfig(learner=alias) == OnlineConfig(learner=name)
        assert type(head_learner(alias, 0.1)) is type(head_learner(name, 0.1))
    assert {m.learner for m in METHODS.values() if m.learner} == set(LEARNER_NAMES)
    with pytest.raises(ValueError, match="optimistic-ensemble") as info:
        OnlineConfig(learner="sgd")
    assert "opt-ens" in str(info.value)
    assert isinstance(OnlineAdapter(hydra_drafter(tiny_loaded()), OnlineConfig(precondition="rms")).learner,
                      Preconditioned)


class SpyRejections:
    """A learner that is not OSD but declares OSD's feedback: the adapter must hand it
    each new rejected sample once and never compute a played gradient for it."""

    feedback = "rejections"

    def __init__(self):
        self.oracles, self.steps = [], []

    @property
    def buffered(self):
        return len(self.oracles)

    def add_feedback(self, context=None, p_target=None, oracle=None):
        self.oracles.append(oracle)

    def step(self, params, grads, loss, oracle=None):
        self.steps.append((all(not bool(g.any()) for g in grads), math.isnan(loss), oracle is None))
        return [p.detach().clone() for p in params]

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class SpyPlayed(SpyRejections):
    feedback = "played"


def test_the_adapter_follows_the_declared_feedback(target):
    inner = hydra_drafter(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=0.05, batch_size=2))
    adapter.learner = spy = SpyRejections()
    serve(target, OnlineDrafter(inner, adapter), prompts(2))
    rejected = sum(s.rejected for s in adapter.buffer)
    assert len(adapter.buffer) == len(spy.steps) > 0 and 0 < rejected < len(adapter.buffer)
    assert len(spy.oracles) == rejected == len(adapter.pending_feedback)
    assert all(s == (True, True, True) for s in spy.steps)          # zeros, NaN, no oracle
    loss, grads = spy.oracles[0](adapter.params)                      # an oracle at given parameters
    assert math.isfinite(loss) and len(grads) == len(adapter.params)
    adapter.learner = played = SpyPlayed()
    serve(target, OnlineDrafter(inner, adapter), prompts(3)[2:], start=2)
    assert played.steps and not played.oracles
    assert all(s == (False, False, False) for s in played.steps)    # real gradient, loss, an oracle


def _as_before_the_registry(state: dict) -> dict:
    """An adapter checkpoint as the pre-registry code wrote it: short learner names and
    the RMS second moment beside the inner learner's state."""
    old = dict(state)
    old["config"] = {**state["config"], "learner": {"optimistic": "opt", "ensemble": "ens"}.get(
        state["config"]["learner"], state["config"]["learner"])}
    wrapped = state["learner"]
    old["learner"] = wrapped["inner"]
    old["rms"] = None if wrapped["second_moment"] is None else [torch.as_tensor(v) for v in wrapped["second_moment"]]
    old["rms_steps"] = wrapped["steps"]
    return old


@pytest.mark.parametrize("learner", ["opt", "ens"])
def test_pre_registry_checkpoints_resume_identically(target, learner):
    config = OnlineConfig(learner=learner, lr=1e-3, precondition="rms", batch_size=2)
    inner = hydra_drafter(target)
    adapter = OnlineAdapter(inner, config)
    serve(target, OnlineDrafter(inner, adapter), prompts(1))
    state = adapter.state_dict()
    assert state["learner"]["class"] == "Preconditioned" and adapter.rms_steps > 0
    other_inner = hydra_drafter(target, seed=5)
    other = OnlineAdapter(other_inner, config)
    other.load_state_dict(_as_before_the_registry(state))
    assert other.rms_steps == adapter.rms_steps
    assert all(torch.equal(a, b) for a, b in zip(other.rms, adapter.rms))
    ra = serve(target, OnlineDrafter(inner, adapter), prompts(3)[1:], start=1)
    rb = serve(target, OnlineDrafter(other_inner, other), prompts(3)[1:], start=1)
    assert ra == rb
    assert all(torch.equal(a, b) for a, b in zip(inner.parameters(), other_inner.parameters()))
