"""The compiled verification forward (`SpeculativeDecoder(compile_target=True)`,
`compile_verify_forward`) against the eager path: greedy float32 output token for
token and round for round (chain and tree, the plain one-token path included), and the
warm-up that compiles before timing touches no drafter state. Tiny models built in the
test (inductor on CPU compiles each graph in seconds for them)."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder, compile_verify_forward
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from tests.realmodels.decoder_util import as_loaded, plain_greedy, tiny_llama

VOCAB = 12
PROMPTS = [[5], [1, 2, 3, 1, 2], [4, 7, 1, 9, 4, 7], [8, 8, 2, 6, 3, 0, 1, 8, 8, 2]]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=3)


def _rounds(result) -> list[tuple[int, int]]:
    return [(r.verified_tokens, r.tokens_per_round) for r in result.trace]


@pytest.mark.parametrize("policy", [FixedDraftPolicy(0), FixedDraftPolicy(3),
                                    FixedDraftPolicy(4, parse_tree_shape("2x2x1"))],
                         ids=["plain", "chain-k3", "tree-2x2x1"])
def test_compiled_greedy_equals_eager_and_plain_greedy(target, policy):
    eager = SpeculativeDecoder(as_loaded(target), NGramDrafter(max_matches=2), policy=policy, eos_token_id=[])
    compiled = SpeculativeDecoder(as_loaded(target), NGramDrafter(max_matches=2), policy=policy, eos_token_id=[],
                                  compile_target=True)
    assert compiled._verify_model is not target
    for prompt in PROMPTS:
        want = plain_greedy(target, prompt, 16)
        got_eager, got_compiled = eager.generate(prompt, 16), compiled.generate(prompt, 16)
        assert got_compiled.new_tokens == want == got_eager.new_tokens, prompt
        assert _rounds(got_compiled) == _rounds(got_eager), prompt


def test_compiled_module_is_shared_and_leaves_the_model_alone(target):
    keys = list(target.state_dict())
    children = [name for name, _ in target.named_children()]
    first, second = compile_verify_forward(target), compile_verify_forward(target)
    assert first is second
    assert list(target.state_dict()) == keys
    assert [name for name, _ in target.named_children()] == children


class _Recorder(NGramDrafter):
    """An n-gram drafter that counts every reset / propose / observe it receives."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def reset(self, prompt_ids, *, target_hidden=None):
        self.calls += 1
        return super().reset(prompt_ids, target_hidden=target_hidden)

    def propose(self, request):
        self.calls += 1
        return super().propose(request)

    def observe(self, feedback):
        self.calls += 1
        return super().observe(feedback)


def test_warm_up_compiles_without_touching_the_drafter(target):
    drafter = _Recorder()
    eager = SpeculativeDecoder(as_loaded(target), drafter, policy=FixedDraftPolicy(3), eos_token_id=[])
    assert eager.warm_up(PROMPTS[1]) == 0.0
    compiled = SpeculativeDecoder(as_loaded(target), drafter, policy=FixedDraftPolicy(3), eos_token_id=[],
                                  compile_target=True)
    assert compiled.warm_up(PROMPTS[1]) > 0.0
    assert drafter.calls == 0
    assert compiled.generate(PROMPTS[2], 12).new_tokens == plain_greedy(target, PROMPTS[2], 12)
    with pytest.raises(ValueError):
        compiled.warm_up([])
    with torch.inference_mode():          # the model's weights are the eager ones, unchanged
        assert all(not p.requires_grad for p in target.parameters())


def test_no_recompilation_after_warm_up(target):
    """After `warm_up`, decoding (chain and tree rounds, cropped and index-selected caches,
    growing cache lengths) compiles no new graph: a recompile every few rounds made the
    compiled decoder far slower than the eager one before caches were compacted. Prompts of
    5+ tokens: dynamo specialises sizes 0 and 1, so a cache of 0 or 1 tokens (a 1-token
    prompt) gets graphs of its own."""
    from torch._dynamo.utils import counters
    other = tiny_llama(VOCAB, seed=4)
    for policy in (FixedDraftPolicy(3), FixedDraftPolicy(4, parse_tree_shape("2x2x1"))):
        dec = SpeculativeDecoder(as_loaded(other), NGramDrafter(max_matches=2), policy=policy, eos_token_id=[],
                                 compile_target=True)
        dec.warm_up(PROMPTS[3])
        before = counters["stats"]["unique_graphs"]
        for prompt in PROMPTS[1:]:
            assert dec.generate(prompt, 20).new_tokens == plain_greedy(other, prompt, 20)
        assert counters["stats"]["unique_graphs"] == before, policy
