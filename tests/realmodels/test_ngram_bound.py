"""benchmarks/ngram_bound.py's replay pieces: its copy of HF prompt lookup proposes
exactly what transformers' PromptLookupCandidateGenerator proposes, and trie
acceptance / round replay follow greedy verification."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from benchmarks.ngram_bound import accepted_in_trie, hf_prompt_lookup, replay


@pytest.mark.parametrize("seed", range(6))
def test_hf_prompt_lookup_copy_matches_transformers(seed):
    rng = np.random.default_rng(seed)
    eos = 3
    for _ in range(40):
        length = int(rng.integers(2, 40))
        context = rng.integers(0, 6, size=length)           # small vocabulary: many matches, some EOS
        max_length = length + int(rng.integers(1, 12))
        gen = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([eos]), num_output_tokens=5,
                                             max_matching_ngram_size=2, max_length=max_length)
        ids, _ = gen.get_candidates(torch.from_numpy(context)[None])
        theirs = ids[0, length:].tolist()
        assert hf_prompt_lookup(context, 5, 2, (eos,), max_length) == theirs


def test_trie_acceptance_and_replay():
    # trie: 5 -> 6 -> 7 and 5 -> 8
    tokens, parents = [5, 6, 7, 8], [-1, 0, 1, 0]
    assert accepted_in_trie(tokens, parents, [5, 8, 1]) == 2
    assert accepted_in_trie(tokens, parents, [5, 6, 7, 9]) == 3
    assert accepted_in_trie(tokens, parents, [9]) == 0
    assert accepted_in_trie([], [], [1]) == 0
    # a drafter that always proposes the true next two tokens emits 3 per round (bonus included)
    output = list(range(10, 20))

    def perfect(context):
        pos = len(context) - 2
        nxt = output[pos: pos + 2]
        return nxt, list(range(-1, len(nxt) - 1)), len(nxt) + 1
    rounds = replay([1, 2], output, perfect)
    assert [e for e, _ in rounds] == [3, 3, 3, 1] and sum(e for e, _ in rounds) == len(output)
    assert [e for e, _ in replay([1, 2], output, lambda c: ([], [], 1))] == [1] * 10
