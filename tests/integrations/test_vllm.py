"""vLLM ``custom_class`` proposer, driven through vLLM's interface
without importing vLLM: a fake ``VllmConfig``, ragged batches in a padded
``token_ids_cpu`` (NumPy and torch), proposals no longer than k, inside the
vocabulary, not past max_model_len, and equal to the drafter's own proposal on each
request's context alone."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specloop.integrations.vllm import Proposer
from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan

VOCAB = 50


def _config(k=4, max_len=64, **spec):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k, method="custom_class",
                                                              custom_proposer_backend="specloop.integrations.vllm."
                                                              "Proposer", **spec),
                           model_config=SimpleNamespace(max_model_len=max_len))


def _batch(contexts, width=64):
    rows = np.zeros((len(contexts) + 2, width), dtype=np.int32)      # spare slots, as vLLM's buffers have
    for i, c in enumerate(contexts):
        rows[i, :len(c)] = c
    counts = np.zeros(len(contexts) + 2, dtype=np.int32)
    counts[:len(contexts)] = [len(c) for c in contexts]
    return rows, counts


def _contexts():
    rng = np.random.default_rng(0)
    motif = [3, 9, 27, 4, 8]
    return [motif * 3 + [3, 9],                          # repeats: n-gram finds a continuation
            list(rng.integers(0, VOCAB, 40)) + motif + [7, 7] + motif[:2],
            [11, 12],                                    # too short to match much
            list(rng.integers(0, VOCAB, 25))]


def _alone(name, context, k, **options):
    drafter = make_drafter(name, None, **options)
    ids = torch.tensor(context, dtype=torch.long)
    drafter.reset(ids)
    p = drafter.propose(DraftRequest(ids, DraftPlan(k), k, SamplingConfig(), torch.Generator().manual_seed(0)))
    assert p.tokens.numel() == 0 or p.parents.tolist() == list(range(-1, p.tokens.numel() - 1))   # chains here
    return p.tokens.tolist()


@pytest.mark.parametrize("name", ["ngram", "suffix"])
@pytest.mark.parametrize("as_torch", [False, True])
def test_ragged_batch_proposals_are_valid_and_equal_the_drafter_alone(monkeypatch, name, as_torch):
    monkeypatch.setenv("SPECLOOP_VLLM_DRAFTER", name)
    proposer = Proposer(_config(k=4))
    contexts = _contexts()
    rows, counts = _batch(contexts)
    sampled = [[c[-1]] for c in contexts]
    sampled[3] = []                                       # a request still prefilling: no proposal
    out = proposer.propose(sampled, counts, torch.from_numpy(rows) if as_torch else rows)
    assert len(out) == len(contexts) and out[3] == []
    assert any(out), "the repeated contexts must produce proposals"
    for context, draft in zip(contexts[:3], out[:3]):
        assert len(draft) <= 4 and all(isinstance(t, int) and 0 <= t < VOCAB for t in draft)
        assert draft == _alone(name, context, 4)
    assert out[0] == [27, 4, 8, 3] if name == "ngram" else len(out[0]) > 0


def test_config_attributes_and_prompt_lookup_sizes(monkeypatch):
    monkeypatch.delenv("SPECLOOP_VLLM_DRAFTER", raising=False)
    proposer = Proposer(_config(k=3, prompt_lookup_min=2, prompt_lookup_max=2))
    assert proposer.drafter_name == "ngram" and proposer.drafter_options == {"min_ngram": 2, "max_ngram": 2}
    context = [1, 2, 5, 6, 7, 2, 9, 2]                   # suffix [9, 2] unseen; 1-gram [2] would match
    rows, counts = _batch([context])
    assert proposer.propose([[2]], counts, rows) == [[]]
    assert Proposer(_config(k=3)).propose([[2]], counts, rows) == [_alone("ngram", context, 3)] != [[]]
    attr = Proposer(_config(k=2, specloop_drafter="suffix", specloop_options={"depth": 24}))
    assert attr.drafter_name == "suffix" and attr.drafter_options == {"depth": 24}


def test_max_model_len_caps_proposals(monkeypatch):
    monkeypatch.delenv("SPECLOOP_VLLM_DRAFTER", raising=False)
    context = [3, 9, 27, 4, 8] * 3 + [3, 9]              # 17 tokens
    rows, counts = _batch([context, context])
    assert Proposer(_config(k=5, max_len=19)).propose([[9], [9]], counts, rows) == [[27, 4], [27, 4]]
    assert Proposer(_config(k=5, max_len=17)).propose([[9]], counts[:1], rows[:1]) == [[]]
    assert Proposer(_config(k=5, max_len=64)).propose([[9]], 17, rows[:1]) == [[27, 4, 8, 3, 9]]  # one int for all


def test_bad_settings_are_refused(monkeypatch):
    monkeypatch.setenv("SPECLOOP_VLLM_DRAFTER", "eagle3")
    with pytest.raises(ValueError, match="model-free drafters ngram, suffix, not 'eagle3'"):
        Proposer(_config())
    monkeypatch.setenv("SPECLOOP_VLLM_DRAFTER", "ngram")
    monkeypatch.setenv("SPECLOOP_VLLM_OPTIONS", "{not json")
    with pytest.raises(ValueError, match="SPECLOOP_VLLM_OPTIONS is not a JSON object"):
        Proposer(_config())
    monkeypatch.setenv("SPECLOOP_VLLM_OPTIONS", '{"min_ngram": 3, "max_ngram": 1}')
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        Proposer(_config())
    monkeypatch.delenv("SPECLOOP_VLLM_OPTIONS")
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        Proposer(_config(k=0))
    rows, counts = _batch([[1, 2, 3]])
    with pytest.raises(ValueError, match="2 requests but"):
        Proposer(_config()).propose([[3], [3]], counts[:1], rows[:1])
