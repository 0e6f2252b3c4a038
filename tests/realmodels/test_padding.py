"""Verification-width padding (`specloop.realmodels.padding`): padded blocks change
no output (greedy identity, the same sampled tokens and round records for the same
seed), widths are validated, and the calibration returns a well-formed map."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.drafters.small_lm import SmallLMDrafter
from specloop.realmodels.padding import calibrate_verify_widths, check_widths, pad_block
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from specloop.realmodels.sampling import SamplingConfig
from tests.realmodels.decoder_util import as_loaded, plain_greedy, tiny_llama

VOCAB = 12
WIDTHS = {n: n + 1 + n % 3 for n in range(1, 16)}   # pads plain steps, chains and trees alike
PROMPTS = [[5], [1, 2, 3, 1, 2], [4, 7, 1, 9, 4, 7], [8, 8, 2, 6, 3, 0, 1]]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=0)


@pytest.fixture(scope="module")
def draft():
    return tiny_llama(VOCAB, seed=0, layers=1)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("drafter", ["ngram", "small-lm"])
def test_padded_greedy_equals_plain_greedy(target, draft, drafter, k):
    make = {"ngram": NGramDrafter, "small-lm": lambda: SmallLMDrafter(draft)}[drafter]
    dec = SpeculativeDecoder(as_loaded(target), make(), policy=FixedDraftPolicy(k), eos_token_id=[],
                             verify_widths=WIDTHS)
    for prompt in PROMPTS:
        assert dec.generate(prompt, 12).new_tokens == plain_greedy(target, prompt, 12), (drafter, k, prompt)


def test_padded_tree_and_sampling_match_unpadded(target, draft, monkeypatch):
    """Same seed, same drafter: padding changes neither the sampled tokens nor the
    round records (accepted lengths, verified tokens = real nodes + 1)."""
    import specloop.realmodels.session as session_mod   # the round's verify forward pads there
    padded = []

    def counting(tokens, parents, width, filler):
        padded.append(width - tokens.shape[0] - 1)
        return pad_block(tokens, parents, width, filler)
    monkeypatch.setattr(session_mod, "pad_block", counting)
    tree = parse_tree_shape("2x2x1")
    for sampling in (SamplingConfig(0.0), SamplingConfig(1.0)):
        runs = []
        for widths in (None, WIDTHS):
            dec = SpeculativeDecoder(as_loaded(target), SmallLMDrafter(draft), policy=FixedDraftPolicy(tree.max_depth, tree),
                                     sampling=sampling, seed=7, eos_token_id=[], verify_widths=widths)
            res = [dec.generate(p, 10) for p in PROMPTS]
            runs.append(([r.new_tokens for r in res],
                         [(rec.accepted_tokens, rec.verified_tokens) for r in res for rec in r.trace]))
        assert runs[0] == runs[1], sampling
    assert sum(1 for n in padded if n > 0) >= 20      # the padded runs did pad every block


def test_pad_block_and_width_validation():
    tokens, parents = torch.tensor([4, 5]), torch.tensor([-1, 0])
    t, p = pad_block(tokens, parents, 5, 9)
    assert t.tolist() == [4, 5, 9, 9] and p.tolist() == [-1, 0, -1, -1]
    assert pad_block(tokens, parents, 3, 9)[0] is tokens
    with pytest.raises(ValueError, match="smaller than the block"):
        pad_block(tokens, parents, 2, 9)
    assert check_widths({"2": 5.0}) == {2: 5}
    for bad in ({3: 2}, {0: 4}):
        with pytest.raises(ValueError, match="verify width"):
            check_widths(bad)
    with pytest.raises(ValueError, match="verify_widths"):
        SpeculativeDecoder(as_loaded(tiny_llama(VOCAB)), NGramDrafter(), verify_widths="fast")


def test_calibration_returns_wider_widths_only(target):
    widths = calibrate_verify_widths(target, max_width=4, context=8, repeats=1)
    assert all(1 <= n < w <= 4 for n, w in widths.items())
    with pytest.raises(ValueError, match="max_width"):
        calibrate_verify_widths(target, max_width=0)
    with pytest.raises(ValueError, match="min_gain"):
        calibrate_verify_widths(target, min_gain=1.0)
    dec = SpeculativeDecoder(as_loaded(target), NGramDrafter(), policy=FixedDraftPolicy(3), eos_token_id=[],
                             verify_widths="auto")
    assert dec.generate([1, 2, 3, 1, 2], 8).new_tokens == plain_greedy(target, [1, 2, 3, 1, 2], 8)
    assert isinstance(dec.verify_widths, dict)          # calibrated once, then reused


def test_measured_verify_cost_is_a_positive_non_decreasing_table_per_width():
    from specloop.realmodels.padding import measure_verify_cost
    target = tiny_llama(vocab=32, hidden=16, layers=1)
    table = measure_verify_cost(target, max_width=5, context=8, repeats=1)
    assert len(table) == 5 and all(t > 0 for t in table)
    assert all(b >= a for a, b in zip(table, table[1:]))
    with pytest.raises(ValueError, match="max_width, context, repeats >= 1"):
        measure_verify_cost(target, max_width=0)
