"""Tree attention and KV-cache surgery: tree logits equal sequential decoding of each
path; the cache after a round equals the cache after feeding the committed tokens
one at a time."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.kvcache import cache_tensors, causal_forward, keep_positions, model_forward, new_cache
from specloop.realmodels.tree import additive_mask, ancestor_matrix, node_depths, verify_block_inputs
from tests.realmodels.decoder_util import one_thread, tiny_llama

PARENTS = torch.tensor([-1, -1, 0, 0, 1, 2, 4, -1])
TOKENS = torch.tensor([3, 5, 7, 1, 2, 9, 4, 6])

pytestmark = pytest.mark.usefixtures("one_thread")


def _path(node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = int(PARENTS[node])
    return out[::-1]


def test_ancestors_and_depths():
    anc = ancestor_matrix(PARENTS)
    assert anc[6].nonzero().reshape(-1).tolist() == [1, 4, 6]
    assert node_depths(PARENTS).tolist() == [1, 1, 2, 2, 2, 3, 3, 1]


def test_mask_is_additive_float_not_bool():
    mask, pos = verify_block_inputs(PARENTS, 5, torch.float32, "cpu")
    assert mask.dtype == torch.float32 and mask.shape == (1, 1, 9, 14)
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float32).min}
    assert pos.tolist() == [[5, 6, 6, 7, 7, 7, 8, 8, 6]]
    assert additive_mask(torch.eye(2, dtype=torch.bool), torch.bfloat16, "cpu").dtype == torch.bfloat16


def test_tree_logits_equal_sequential_paths():
    model = tiny_llama(vocab=12, seed=1)
    prefix = [0, 4, 8, 2, 5]
    cache = new_cache()
    causal_forward(model, cache, torch.tensor(prefix[:-1]))
    mask, pos = verify_block_inputs(PARENTS, len(prefix) - 1, torch.float32, "cpu")
    block = torch.cat([torch.tensor(prefix[-1:]), TOKENS])
    tree_logits = model_forward(model, cache, block, mask, pos).logits[0]
    with torch.no_grad():
        root = model(torch.tensor([prefix])).logits[0, -1]
        torch.testing.assert_close(tree_logits[0], root, atol=1e-5, rtol=1e-5)
        for node in range(len(TOKENS)):
            seq = prefix + [int(TOKENS[j]) for j in _path(node)]
            ref = model(torch.tensor([seq])).logits[0, -1]
            torch.testing.assert_close(tree_logits[node + 1], ref, atol=1e-5, rtol=1e-5)


def test_lone_pending_token_goes_unmasked_and_equals_the_full_forward():
    """n = 0 (a round without a draft): no mask, position = cache length, and the
    logits equal the full-sequence forward's last row."""
    empty = torch.zeros(0, dtype=torch.long)
    mask, pos = verify_block_inputs(empty, 6, torch.float32, "cpu")
    assert mask is None and pos.tolist() == [[6]]
    model = tiny_llama(vocab=12, seed=3)
    seq = [1, 5, 9, 2, 7, 3, 11]
    cache = new_cache()
    causal_forward(model, cache, torch.tensor(seq[:-1]))
    logits = model_forward(model, cache, torch.tensor(seq[-1:]), mask, pos).logits[0, -1]
    with torch.no_grad():
        torch.testing.assert_close(logits, model(torch.tensor([seq])).logits[0, -1], atol=1e-5, rtol=1e-5)


def test_cache_after_pruning_equals_sequential_feed():
    model = tiny_llama(vocab=12, seed=2)
    prefix = [1, 2, 3, 4]
    cache = new_cache()
    causal_forward(model, cache, torch.tensor(prefix[:-1]))
    cache_len = len(prefix) - 1
    mask, pos = verify_block_inputs(PARENTS, cache_len, torch.float32, "cpu")
    model_forward(model, cache, torch.cat([torch.tensor(prefix[-1:]), TOKENS]), mask, pos)
    accepted = _path(6)  # nodes 1, 4, 6
    keep = torch.cat([torch.arange(cache_len + 1), cache_len + 1 + torch.tensor(accepted)])
    keep_positions(cache, keep)
    ref = new_cache()
    for tok in prefix + [int(TOKENS[j]) for j in accepted]:
        causal_forward(model, ref, torch.tensor([tok]))
    for (k1, v1), (k2, v2) in zip(cache_tensors(cache), cache_tensors(ref)):
        assert k1.shape == k2.shape
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)
