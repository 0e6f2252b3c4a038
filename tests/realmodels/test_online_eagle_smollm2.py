"""Online EAGLE-3 samples on the real SmolLM2-135M-Instruct with its shipped head:
every supervised output is labelled with the right token (real text does not
repeat one token, so a label one position off is caught)."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.online import OnlineAdapter, OnlineConfig, OnlineDrafter
from specloop.realmodels.policy import FixedDraftPolicy

PROMPTS = ["def fibonacci(n):", "The three primary colours are", "import numpy as np\n\ndef mean("]


@pytest.fixture(scope="module")
def target(smollm2_float32):
    return smollm2_float32


def test_eagle3_online_labels_each_output_with_the_token_two_ahead(target):
    """Output (step s, window index i) of the re-run predicts the token at window
    position i + 2 from the anchor i - s + 1 (`EagleHead.forward_ttt`), so its label
    -- the argmax of its target row under greedy decoding -- must be that token:
    next_tokens[i + 1], or, for the last verified position, the token the next
    round's window ends with (when that round follows in the same prompt)."""
    from specloop.realmodels.registry.drafters import make_drafter
    inner = make_drafter("eagle3", target, train_if_missing=False, progress=False)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=1e-4, mode="chunk"))
    decoder = SpeculativeDecoder(target, OnlineDrafter(inner, adapter), policy=FixedDraftPolicy(3))
    t2d = inner.target_to_draft.cpu()
    checked = {1: 0, 2: 0}
    for text in PROMPTS:
        adapter.chunk_samples = []
        decoder.generate(target.tokenizer(text)["input_ids"], 24)
        samples = adapter.chunk_samples
        for smp, nxt in zip(samples, samples[1:] + [None]):
            seq = smp.next_tokens
            if nxt is not None and nxt.next_tokens.numel() > smp.next_tokens.numel():
                grown = nxt.next_tokens.numel() - smp.next_tokens.numel()
                seq = torch.cat([seq, nxt.next_tokens[-grown:]])
            for s, i, rows, probs in zip(smp.steps.tolist(), smp.index.tolist(), smp.target_rows,
                                         smp.target_probs):
                if i + 1 >= seq.numel():
                    continue
                want = int(t2d[int(seq[i + 1])])
                if want < 0 or float(probs.max()) <= 0:
                    continue
                assert int(rows[int(probs.argmax())]) == want, (text, s, i)
                checked[s] += 1
    assert min(checked.values()) >= 10, checked
