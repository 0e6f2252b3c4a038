"""Verification on probability vectors: losslessness (chi-square), p = 0 never
accepted, greedy = argmax path."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specloop.realmodels.sampling import SamplingConfig, processed_probs, sample_from
from specloop.realmodels.verify import verify_tree


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with p = 0 was emitted"
    return float(stats.chisquare(counts[keep], expected[keep]).pvalue)


@pytest.mark.parametrize("num_siblings", [1, 3])
def test_first_token_distribution_is_p(num_siblings):
    """Siblings drawn i.i.d. from q, verified recursively: the first committed
    token is distributed as p (SpecInfer Alg. 2)."""
    gen = torch.Generator().manual_seed(0)
    vocab = 6
    p = torch.tensor([0.4, 0.0, 0.3, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.5, 0.1, 0.1, 0.1, 0.1])
    n = 6000
    counts = np.zeros(vocab)
    for _ in range(n):
        toks = [sample_from(q, gen) for _ in range(num_siblings)]
        tokens = torch.tensor(toks)
        parents = torch.full((num_siblings,), -1)
        p_rows = torch.cat([p[None], torch.full((num_siblings, vocab), 1.0 / vocab)])
        out = verify_tree(p_rows, tokens, parents, q.expand(num_siblings, vocab), gen)
        first = int(tokens[out.accepted_nodes[0]]) if out.accepted_nodes else out.next_token
        counts[first] += 1
    assert _chi2_pvalue(counts, p.numpy()) > 1e-3


def test_deterministic_draft_is_lossless():
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([0.2, 0.5, 0.3])
    counts = np.zeros(3)
    for _ in range(4000):
        out = verify_tree(torch.stack([p, p]), torch.tensor([1]), torch.tensor([-1]), None, gen)
        counts[1 if out.accepted_nodes else out.next_token] += 1
    assert _chi2_pvalue(counts, p.numpy()) > 1e-3


def test_zero_probability_token_never_accepted():
    gen = torch.Generator().manual_seed(2)
    p = torch.tensor([0.0, 1.0, 0.0])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    for _ in range(200):
        out = verify_tree(torch.stack([p, p]), torch.tensor([0]), torch.tensor([-1]), q, gen)
        assert out.accepted_nodes == () and out.next_token == 1 and out.child_acceptance_ratios == (0.0,)


def test_greedy_walks_the_argmax_path():
    cfg = SamplingConfig(0.0)
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    p = processed_probs(logits, cfg)
    # nodes: 0: tok 2 (root child), 1: tok 1 (root child), 2: tok 2 (child of 1)
    out = verify_tree(p, torch.tensor([2, 1, 2]), torch.tensor([-1, -1, 1]), None, torch.Generator())
    assert out.accepted_nodes == (1, 2) and out.next_token == 0


def test_q_row_must_cover_its_token():
    with pytest.raises(ValueError, match="q_draft"):
        verify_tree(torch.full((2, 3), 1 / 3), torch.tensor([0]), torch.tensor([-1]),
                    torch.tensor([[0.0, 1.0, 0.0]]), torch.Generator())


def test_top_k_top_p_processing():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    probs = processed_probs(logits, SamplingConfig(1.0, top_k=2))
    assert (probs[2:] == 0).all() and probs.sum().item() == pytest.approx(1.0)
    probs = processed_probs(logits, SamplingConfig(1.0, top_p=0.5))
    assert probs[0] == 1.0
    with pytest.raises(ValueError, match="NaN"):
        processed_probs(torch.tensor([float("nan"), 0.0]), SamplingConfig(1.0))
    with pytest.raises(ValueError):
        SamplingConfig(-1.0)
    with pytest.raises(ValueError):
        SamplingConfig(1.0, top_p=0.0)
