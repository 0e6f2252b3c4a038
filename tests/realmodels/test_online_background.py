"""Background updates with double-buffered weights: the worker trains a private copy of
the draft's parameters and the decoder copies the trained values in between rounds, so
every round drafts with one set of weights, output stays the target's greedy output, and
the worker never writes what the decoder reads."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.online import OnlineAdapter, OnlineConfig, OnlineDrafter
from tests.realmodels.decoder_util import plain_greedy
from tests.realmodels.test_online import serve
from tests.realmodels.test_online_util import eagle_drafter, hydra_drafter, prompts, tiny_loaded


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


def _checksum(params) -> float:
    return float(sum(p.detach().double().sum() * (i + 1) for i, p in enumerate(params)))


class _Watched:
    """The inner drafter, recording its parameters' checksum at the start and the end of
    every proposal (they must not change while a round drafts)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, request):
        before = _checksum(self.inner.parameters())
        out = self.inner.propose(request)
        self.seen.append((before, _checksum(self.inner.parameters())))
        return out


@pytest.mark.parametrize("make, learner", [(hydra_drafter, "ogd"), (hydra_drafter, "ensemble"),
                                           (lambda t: eagle_drafter(t, "eagle3"), "optimistic")])
@pytest.mark.parametrize("publish_every", [1, 3])
def test_published_weights_change_only_between_rounds_and_output_is_greedy(target, make, learner, publish_every):
    inner = make(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner=learner, lr=0.05, background=True,
                                                publish_every=publish_every, batch_size=2))
    watched = _Watched(inner)
    stream = prompts(3)
    results = serve(target, OnlineDrafter(watched, adapter), stream, max_new_tokens=20)
    adapter.wait()
    assert adapter.num_steps > 0 and adapter.publications > 0
    assert all(a == b for a, b in watched.seen), "the draft's weights changed while a round drafted"
    distinct = len({a for a, _ in watched.seen})
    assert 1 < distinct <= adapter.publications + 1     # rounds drafted with published weights only
    for ids, res in zip(stream, results):
        assert res.new_tokens == plain_greedy(target.model, ids, 20)
    for live, trained in zip(adapter.live.params, adapter.train.params):   # all published by wait()
        assert torch.equal(live, trained)
    adapter.close()


def test_the_worker_never_writes_the_drafters_parameters(target):
    inner = hydra_drafter(target)
    start = [p.detach().clone() for p in inner.parameters()]
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ensemble", lr=0.05, background=True,
                                                publish_every=10 ** 6))
    assert adapter.train is not adapter.live
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(adapter.live.params, adapter.train.params))
    serve(target, OnlineDrafter(inner, adapter), prompts(2), max_new_tokens=16)
    adapter._queue.join()                               # updates done, nothing published yet
    assert adapter.num_steps > 0 and adapter.publications == 0
    for a, b in zip(start, inner.parameters()):
        assert torch.equal(a, b.detach())
    adapter.wait()                                      # publishes the steps since the last publication
    assert adapter.publications == 1
    assert any(not torch.equal(a, b.detach()) for a, b in zip(start, inner.parameters()))
    adapter.close()


def test_bad_publish_every():
    with pytest.raises(ValueError, match="publish_every must be >= 1"):
        OnlineConfig(background=True, publish_every=0)
