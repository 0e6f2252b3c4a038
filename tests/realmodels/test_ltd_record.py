"""Recorded LTD rounds replay the real decoder exactly (float32 SmolLM2-135M with
the shipped EAGLE-3 head): same greedy output, and for static and dynamic tree
policies the same depth, verification size and committed tokens per round as the
decoder itself running the policy through the drafter's native hooks."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specloop.realmodels.registry.drafters import make_drafter
from specloop.ltd.env_real import RealHarness
from specloop.ltd.record import record_replay
from specloop.ltd.env_replay import load_replay, run_replay_policy
from specloop.ltd.policy import LTDConfig, LTDPolicy

CFG = LTDConfig(top_k=6, max_depth=4, verify_sizes=(2, 4, 8, 12, 16))
TOKENS = 14


class ConfidencePolicy(LTDPolicy):
    """Stops when the layer's best path is unlikely; V from the tree's mass."""

    def continue_drafting(self, step):
        return step.depth < 4 and step.path_prob > 0.25

    def verify_size(self, candidates):
        return 4 if candidates.node_probs.max() < 0.5 else 12


@pytest.fixture(scope="module")
def recorded(smollm2_float32, tmp_path_factory):
    target = smollm2_float32
    drafter = make_drafter("eagle3", target, train_if_missing=False, progress=False)
    texts = ["def fibonacci(n):\n    ", "The capital of France is"]
    prompts = [torch.tensor(target.tokenizer(t)["input_ids"], dtype=torch.long) for t in texts]
    out, costs = tmp_path_factory.mktemp("replay"), tmp_path_factory.mktemp("costs")
    (costs / "costs.json").write_text(json.dumps({   # timing is tested on a tiny model (test_ltd_env.py)
        "verify_seconds": [0.0] + [0.05 + 0.002 * n for n in range(1, 18)],
        "layer_seconds": [0, .004, .008, .012, .016],
        "round_overhead_s": 0.0, "autoregressive_step_s": 0.05, "max_depth": 4, "max_verify": 16}))
    record_replay(target, drafter, prompts, out, CFG, max_depth=4, max_verify=16, max_new_tokens=TOKENS,
                  costs_from=costs)
    return target, drafter, prompts, out


def test_recording_is_plain_greedy_and_resumable(recorded):
    target, drafter, prompts, out = recorded
    data = load_replay(out)
    for prompt, rec in zip(prompts, data.prompts):
        ids = prompt[None]
        greedy = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=TOKENS,
                                       do_sample=False, temperature=None, top_p=None, top_k=None)
        assert rec.root_next.tolist() == greedy[0, ids.shape[1]:].tolist()
        assert rec.positions == TOKENS and (np.diff(rec.context_length) == 1).all()
    before = (out / "prompt-0001.npz").read_bytes()
    (out / "prompt-0001.npz").unlink()
    record_replay(target, drafter, prompts, out, CFG, max_depth=4, max_verify=16, max_new_tokens=TOKENS)
    again = load_replay(out).prompts[1]
    for key in ("tokens", "parents", "probs", "target_next", "root_next"):
        np.testing.assert_array_equal(getattr(again, key), getattr(data.prompts[1], key))
    assert len(before) > 0 and data.meta["costs_from"].endswith("costs.json")
    with pytest.raises(ValueError, match="other settings"):        # resuming must not mix recordings
        record_replay(target, drafter, prompts, out, CFG, max_depth=3, max_verify=16, max_new_tokens=TOKENS)


@pytest.mark.parametrize("policy", [LTDPolicy(CFG, static_depth=1, static_verify_size=4),
                                    LTDPolicy(CFG, static_depth=3, static_verify_size=8),
                                    LTDPolicy(CFG, static_depth=4, static_verify_size=16),
                                    ConfidencePolicy(CFG, static_depth=4)], ids=["D1V4", "D3V8", "D4V16", "dynamic"])
def test_replay_matches_the_real_decoder_round_by_round(recorded, policy):
    target, drafter, prompts, out = recorded
    real, real_depths, real_sizes = RealHarness(target, drafter, prompts, CFG, TOKENS, native=True).run(policy)
    replay, depths, sizes = run_replay_policy(policy, load_replay(out), CFG)
    assert [r.tokens_per_round for r in replay] == [r.tokens_per_round for r in real]
    np.testing.assert_array_equal(sizes, real_sizes)
    assert [r.stream_index for r in replay] == [r.stream_index for r in real]
    assert sum(r.accepted_tokens for r in replay) > 0          # the drafts do get accepted
