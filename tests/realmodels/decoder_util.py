"""Shared helpers for the decoder tests: tiny randomly initialised Llama models
(built in the test, no downloads) and a plain greedy reference."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest
from specloop.realmodels.loading import LoadedModel


def tiny_llama(vocab: int = 12, seed: int = 0, layers: int = 2, hidden: int = 16,
               max_positions: int = 64, scale: float = 1.0, init_range: float = 0.4):
    """A tiny LlamaForCausalLM with random weights, float32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=max_positions, bos_token_id=0, eos_token_id=vocab - 1,
                         pad_token_id=None, tie_word_embeddings=False, attn_implementation="sdpa",
                         initializer_range=init_range)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(scale)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def as_loaded(model, name: str = "tiny") -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, name=name, source="test")


def plain_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """Reference: token-by-token argmax decoding without any cache."""
    seq = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([seq])).logits[0, -1]
            tok = int(logits.argmax())
            out.append(tok)
            seq.append(tok)
            if eos is not None and tok == eos:
                break
    return out


def exact_joint(model, prompt: list[int], sampling, length: int, vocab: int) -> dict[tuple, float]:
    """P(x_1..x_length | prompt) of every continuation under ``sampling`` (temperature,
    top-k, top-p applied by `processed_probs`), by enumeration: the law a lossless
    sampler's first ``length`` tokens must follow (for the chi-square tests)."""
    import itertools
    from specloop.realmodels.sampling import processed_probs
    probs = {}
    for cont in itertools.product(range(vocab), repeat=length):
        total = 1.0
        for i in range(length):
            with torch.no_grad():
                logits = model(torch.tensor([prompt + list(cont[:i])])).logits[0, -1]
            total *= float(processed_probs(logits, sampling)[cont[i]])
            if total == 0.0:
                break
        probs[cont] = total
    return probs


def chi_square_pvalue(counts: dict, keys: list, probs, n: int, check_support: bool = True) -> float:
    """Pearson's chi-square p-value of ``counts`` (n draws over ``keys``) against the law
    ``probs`` (same order as ``keys``, normalised here); cells expected below 5 are pooled
    (the test's validity condition) and an empty pooled cell dropped. With
    ``check_support``, a draw of a continuation of probability 0 fails at once."""
    import numpy as np
    from scipy import stats
    p = np.asarray(probs, dtype=float)
    observed = np.array([counts[k] for k in keys], dtype=float)
    if check_support:
        assert observed[p == 0].sum() == 0, "emitted a continuation of target probability 0"
    expected = p / p.sum() * n
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert abs(exp.sum() - n) <= 1e-6 * n
    return float(stats.chisquare(obs, exp).pvalue)


class SpyDrafter(BaseDrafter):
    """Wraps a drafter and records every proposal and feedback."""

    def __init__(self, inner):
        self.inner = inner
        self.name = "spy"
        self.needs_target_hidden = getattr(inner, "needs_target_hidden", ())
        self.proposals: list[DraftProposal] = []
        self.feedback = []

    def reset(self, prompt_ids, *, target_hidden=None):
        self.inner.reset(prompt_ids, target_hidden=target_hidden)

    def propose(self, request: DraftRequest) -> DraftProposal:
        proposal = self.inner.propose(request)
        self.proposals.append(proposal)
        return proposal

    def observe(self, feedback):
        self.feedback.append(feedback)
        self.inner.observe(feedback)


class FixedDrafter(BaseDrafter):
    """Proposes a fixed list of tokens as a chain every round (deterministic)."""

    name = "fixed"

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def propose(self, request: DraftRequest) -> DraftProposal:
        k = min(request.plan.num_draft_tokens, request.max_tokens, len(self.tokens))
        return DraftProposal.chain(self.tokens[:k])


@pytest.fixture(scope="module", autouse=False)
def one_thread():
    """Run a module with one torch thread (restored after): on a shared 2-core
    machine OpenMP spinning makes tiny-model forwards ~50x slower with 2 threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
