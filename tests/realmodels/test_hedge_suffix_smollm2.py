"""The ``suffix`` and ``hedge:`` drafters on the real SmolLM2-135M-Instruct (float32):
greedy speculative output equals HF greedy token for token on 21 short prompts (and a
second pass over some of them, drafted from the suffix source's global trie), chain and
tree (Hedge: choose and merge); EOS inside an accepted block."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.hedge import HedgeDrafter
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.drafters.suffix import SuffixDrafter, shipped_verify_cost
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from tests.realmodels.decoder_util import SpyDrafter, one_thread  # noqa: F401
from tests.realmodels.test_smollm2 import NEVER, TEXTS

MAX_NEW = 10
POLICIES = {"chain": lambda: FixedDraftPolicy(6),
            "tree": lambda: FixedDraftPolicy(6, parse_tree_shape("topk=2,depth=6,v=12"))}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def prompts(smollm2_float32):
    from specloop.cli.generate_cmd import encode_prompt
    tok = smollm2_float32.tokenizer
    out = [[tok.encode("Hello")[0]]] + [encode_prompt(tok, text, raw=i % 2 == 0) for i, text in enumerate(TEXTS)]
    return out + out[:6]                                   # a second pass: drafted from earlier outputs


@pytest.fixture(scope="module")
def references(smollm2_float32, prompts):
    refs = {}
    for ids in prompts:
        if tuple(ids) in refs:
            continue
        with torch.inference_mode():
            out = smollm2_float32.model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                                 eos_token_id=NEVER, pad_token_id=0, temperature=None,
                                                 top_p=None, top_k=None)
        refs[tuple(ids)] = out[0, len(ids):].tolist()
    return refs


def _drafter(kind: str):
    cost = shipped_verify_cost("float32")
    if kind == "suffix":
        return SuffixDrafter(verify_cost=cost)
    mode = "merge" if kind == "hedge-merge" else "choose"
    return HedgeDrafter([SuffixDrafter(verify_cost=cost), NGramDrafter()], ["suffix", "ngram"],
                        verify_cost=cost, mode=mode, draft_seconds=[160e-6, 70e-6], seed=0)


@pytest.mark.parametrize("case", ["suffix-chain", "suffix-tree", "hedge-chain", "hedge-tree", "hedge-merge-tree"])
def test_greedy_identical_to_hf(smollm2_float32, prompts, references, case):
    kind, shape = case.rsplit("-", 1)
    spy = SpyDrafter(_drafter(kind))
    dec = SpeculativeDecoder(smollm2_float32, spy, policy=POLICIES[shape](), eos_token_id=[])
    assert len(prompts) >= 20
    for i, ids in enumerate(prompts):
        result = dec.generate(ids, MAX_NEW)
        assert result.new_tokens == references[tuple(ids)], (case, i)
    drafted = [p for p in spy.proposals if p.size]
    assert drafted and all(p.q_draft is None for p in drafted)
    assert any(not p.is_chain for p in drafted) == (shape == "tree")
    # the second pass really was drafted from the first (long accepted blocks)
    assert max(f.num_accepted for f in spy.feedback) >= 4
    if kind.startswith("hedge"):
        report = spy.inner.report()
        assert report["pending_rounds"] == 0 and sum(report["chosen_counts"]) == len(spy.proposals)
        assert report["regret"]["rounds"] == report["requests"] == len(prompts)   # a choice per request


@pytest.mark.parametrize("kind", ["suffix", "hedge"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_eos_inside_an_accepted_block(smollm2_float32, prompts, references, kind, shape):
    ids = prompts[3]
    ref = references[tuple(ids)]
    eos = ref[4]
    stop = ref.index(eos)
    drafter = _drafter("suffix") if kind == "suffix" else \
        HedgeDrafter([SuffixDrafter(verify_cost=shipped_verify_cost("float32")), NGramDrafter()], ["suffix", "ngram"],
                     verify_cost=shipped_verify_cost("float32"), choose="argmax", draft_seconds=[0.0, 1.0])
    dec = SpeculativeDecoder(smollm2_float32, drafter, policy=POLICIES[shape](), eos_token_id=eos)
    first = dec.generate(ids, MAX_NEW)
    assert first.new_tokens == ref[: stop + 1] and first.stop_reason == "eos"
    second = dec.generate(ids, MAX_NEW)                    # drafted from the global trie
    assert second.new_tokens == ref[: stop + 1] and second.stop_reason == "eos"
    assert second.trace[0].accepted_tokens >= stop and len(second.trace) == 1


def test_registry_builds_the_stream_method_drafter(smollm2_float32):
    drafter = make_drafter("hedge:suffix@160us,ngram@70us", smollm2_float32)
    assert isinstance(drafter, HedgeDrafter) and drafter.names == ["suffix", "ngram"]
    assert drafter.keeps_stream_state and drafter.draft_seconds == pytest.approx([160e-6, 70e-6])
