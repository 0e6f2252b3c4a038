"""EAGLE / EAGLE-3 heads on a tiny random Llama target: training-time test equals
incremental inference, training learns, save/reload is exact, and speculative
decoding with the heads (chain and trees, hybrid too) equals plain greedy."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.heads.common import ReducedVocab, build_reduced_vocab
from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
from specloop.realmodels.heads.eagle_drafter import EagleDrafter, select_nodes
from specloop.realmodels.registry.head_factories import load_eagle_drafter
from specloop.realmodels.heads.hybrid import HybridDrafter
from specloop.realmodels.loading import LoadedModel
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.training.features import (chunk_stream, create_part, default_layers,
                                                   extract_features)
from specloop.realmodels.training.train_eagle import evaluate_head, train_eagle
from specloop.realmodels.training.trainer import FeatureBatcher, TrainConfig
from specloop.strategies.base import TreePlan

VOCAB, HIDDEN, LAYERS, CHUNK = 128, 32, 8, 64


def _tiny_target() -> LoadedModel:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)   # sharper next-token distributions
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=None, name="tiny-llama", source="test")


def _stream(n: int, seed: int) -> np.ndarray:
    """Structured text stand-in: x_{i+1} = 5 x_i + 3 (mod V) with 25 % noise."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    out[0] = 7
    for i in range(1, n):
        out[i] = (5 * out[i - 1] + 3) % VOCAB if rng.random() > 0.25 else rng.integers(3, VOCAB)
    return out


@pytest.fixture(scope="module")
def tiny():
    return _tiny_target()


@pytest.fixture(scope="module")
def feature_root(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    for name, n, seed in (("train", 64 * CHUNK, 1), ("val", 8 * CHUNK, 2)):
        part = create_part(root / name, chunk_stream(_stream(n, seed), CHUNK), layers=default_layers(LAYERS),
                           hidden_size=HIDDEN, top_k=8, target="tiny-llama", fingerprint=f"{name}-{n}")
        extract_features(tiny.model, part, batch_size=16, progress=False)
    return root


@pytest.fixture(scope="module")
def trained(tiny, feature_root, tmp_path_factory):
    out = {}
    for kind in ("eagle", "eagle3"):
        folder = tmp_path_factory.mktemp(kind)
        cfg = TrainConfig(target="tiny-llama", kind=kind, steps=100, batch_size=8, window=32, lr=3e-3,
                          ttt_steps=3, draft_vocab_size=96, feature_root=str(feature_root),
                          out_dir=str(folder), quick=True)
        report = train_eagle(cfg, loaded=tiny, progress=False)
        out[kind] = (folder, report)
    return out


def _random_head(kind: str, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    layers = (-1,) if kind == "eagle" else (1, 2, 3)
    cfg = EagleConfig(kind, 32, 4, 2, 8, 64, 1e-6, 10000.0, 50, 100, layers)
    head = EagleHead(cfg, torch.randn(100, 32), torch.randn(50, 32))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
    return head


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_time_test_matches_incremental_inference(kind):
    """Step s of forward_ttt at position m+s-1 == drafting s steps from anchor m."""
    head = _random_head(kind)
    width = 32 if kind == "eagle" else 96
    steps, t = 4, 10
    feats, nxt = torch.randn(1, t, width), torch.randint(0, 100, (1, t))
    outs = head.forward_ttt(feats, nxt, steps)
    for m in range(t - steps + 1):
        cache, h = head.extend(head.empty_cache(), feats[0, :m + 1], nxt[0, :m + 1])
        torch.testing.assert_close(h[-1], outs[0][0][0, m], atol=1e-5, rtol=1e-5)
        nk, nv, ph = cache.k[:, :0], cache.v[:, :0], h[-1:]
        for s in range(2, steps + 1):
            p = m + s - 1
            mask = torch.ones(1, nk.shape[1], dtype=torch.bool)
            ph, logits, k, v = head.step_nodes(cache, ph, nxt[0, p:p + 1], torch.tensor([p]), nk, nv, mask)
            torch.testing.assert_close(ph[0], outs[s - 1][0][0, p], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(logits[0], outs[s - 1][1][0, p], atol=1e-3, rtol=1e-4)
            nk, nv = torch.cat([nk, k], 1), torch.cat([nv, v], 1)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_batch_of_tree_nodes_equals_each_node_drafted_alone(kind):
    """step_nodes over n nodes with a tree mask == n calls with one node each, each
    seeing only its own ancestors among the earlier nodes (the batch shares one key
    set; nothing may leak between siblings)."""
    head = _random_head(kind, seed=3)
    width = 32 if kind == "eagle" else 96
    torch.manual_seed(4)
    cache, h = head.extend(head.empty_cache(), torch.randn(6, width), torch.randint(0, 100, (6,)))
    m, n = 5, 4
    node_k, node_v = torch.randn(2, m, 8), torch.randn(2, m, 8)
    mask = torch.tensor([[1, 0, 1, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 1, 1], [1, 0, 0, 0, 1]], dtype=torch.bool)
    parent_h, tokens = torch.randn(n, 32), torch.randint(0, 100, (n,))
    positions = torch.tensor([7, 7, 8, 9])
    h_all, lg_all, k_all, v_all = head.step_nodes(cache, parent_h, tokens, positions, node_k, node_v, mask)
    assert h_all.shape == (n, 32) and lg_all.shape == (n, 50) and k_all.shape == (2, n, 8)
    for i in range(n):
        seen = mask[i].nonzero()[:, 0]
        h_i, lg_i, k_i, v_i = head.step_nodes(cache, parent_h[i:i + 1], tokens[i:i + 1], positions[i:i + 1],
                                              node_k[:, seen], node_v[:, seen],
                                              torch.ones(1, len(seen), dtype=torch.bool))
        torch.testing.assert_close(h_all[i], h_i[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lg_all[i], lg_i[0], atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(k_all[:, i], k_i[:, 0])


def test_config_rejects_bad_input():
    with pytest.raises(ValueError):
        EagleConfig("medusa", 32, 4, 2, 8, 64, 1e-6, 1e4, 50, 100)
    with pytest.raises(ValueError):
        EagleConfig("eagle3", 32, 4, 2, 8, 64, 1e-6, 1e4, 50, 100, (-1,))
    with pytest.raises(ValueError):
        EagleConfig("eagle", 32, 4, 2, 8, 64, 1e-6, 1e4, 200, 100)
    with pytest.raises(ValueError):
        _random_head("eagle").forward_ttt(torch.randn(1, 4, 32), torch.zeros(1, 4, dtype=torch.long), 0)


@given(st.lists(st.floats(-20, 0, allow_nan=False), min_size=1, max_size=30), st.integers(0, 40))
def test_select_nodes_keeps_the_best_budget(logcum, budget):
    keep = select_nodes(logcum, budget)
    assert keep == sorted(keep) and len(keep) == min(budget, len(logcum))
    if keep and len(keep) < len(logcum):
        dropped = [logcum[i] for i in range(len(logcum)) if i not in keep]
        assert min(logcum[i] for i in keep) >= max(dropped)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_learns_and_reports(trained, kind, tiny, feature_root):
    folder, report = trained[kind]
    assert report["draft_vocab_size"] == 96
    assert report["optimizer_steps"] == 100
    assert len(report["heldout_top1_per_step"]) == 3
    # an untrained head of the same shape agrees far less often with the target
    drafter = load_eagle_drafter(tiny, kind, folder=folder, train_if_missing=False, progress=False)
    fresh = EagleHead(drafter.head.config, drafter.head.embed_weight, drafter.head.lm_head.detach()
                      if kind == "eagle" else drafter.head.lm_head.detach().clone())
    layers = tuple(sorted(set(fresh.config.feature_layers) | {-1}))
    from specloop.realmodels.training.features import open_part
    val = FeatureBatcher([open_part(feature_root / "val")], layers, CHUNK, 1)
    t2d = drafter.vocab.t2d
    before = evaluate_head(fresh, val, t2d, drafter.vocab.d2t, 3)
    after = evaluate_head(drafter.head, val, t2d, drafter.vocab.d2t, 3)
    assert after[0] == pytest.approx(report["heldout_top1"])
    assert after[0] > before[0] + 0.2, (before, after)
    assert after[2] > before[2] + 0.1, (before, after)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_saved_draft_reloads_to_identical_predictions(trained, kind, tiny):
    folder, _ = trained[kind]
    a = load_eagle_drafter(tiny, kind, folder=folder, train_if_missing=False, progress=False)
    b = load_eagle_drafter(tiny, kind, folder=folder, train_if_missing=False, progress=False)
    width = HIDDEN if kind == "eagle" else 3 * HIDDEN
    feats, nxt = torch.randn(1, 20, width), torch.randint(0, VOCAB, (1, 20))
    with torch.no_grad():
        for (ha, la), (hb, lb) in zip(a.head.forward_ttt(feats, nxt, 3), b.head.forward_ttt(feats, nxt, 3)):
            assert torch.equal(la, lb) and torch.equal(ha, hb)
    assert torch.equal(a.vocab.d2t, b.vocab.d2t)
    assert a.parameters() and all(p.requires_grad for p in a.parameters())


def test_missing_draft_raises_without_training(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="specloop draft train"):
        load_eagle_drafter(tiny, "eagle", folder=tmp_path / "nothing", train_if_missing=False)


_GREEDY: dict[tuple, list[int]] = {}


def _plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    key = (id(model), tuple(prompt), n)
    if key not in _GREEDY:
        _GREEDY[key] = _plain_greedy_uncached(model, prompt, n)
    return _GREEDY[key]


def _plain_greedy_uncached(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    return out


PLANS = [FixedDraftPolicy(1), FixedDraftPolicy(4), FixedDraftPolicy(6, tree=TreePlan(branching=(3, 2, 1))),
         FixedDraftPolicy(5, tree=TreePlan(top_k=3, max_depth=4, verify_size=10))]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("plan_index", range(len(PLANS)))
def test_speculative_greedy_equals_plain_greedy(trained, tiny, kind, plan_index):
    folder, _ = trained[kind]
    drafter = load_eagle_drafter(tiny, kind, folder=folder, train_if_missing=False, progress=False)
    decoder = SpeculativeDecoder(tiny, drafter, policy=PLANS[plan_index], eos_token_id=-1)
    for seed in (3, 4):
        prompt = [int(x) for x in _stream(12, seed)]
        result = decoder.generate(prompt, max_new_tokens=24)
        assert result.new_tokens == _plain_greedy(tiny.model, prompt, 24)
    tau = result.trace.mean_accepted_length() if callable(getattr(result.trace, "mean_accepted_length", None)) \
        else None
    if tau is not None:
        assert tau >= 1.0


def test_hybrid_uses_lookup_and_head_and_stays_exact(trained, tiny):
    folder, _ = trained["eagle"]
    head = load_eagle_drafter(tiny, "eagle", folder=folder, train_if_missing=False, progress=False)
    hybrid = HybridDrafter(head, min_ngram=2)
    decoder = SpeculativeDecoder(tiny, hybrid, policy=FixedDraftPolicy(4), eos_token_id=-1)
    prompt = [int(x) for x in _stream(40, 5)]
    result = decoder.generate(prompt, max_new_tokens=30)
    assert result.new_tokens == _plain_greedy(tiny.model, prompt, 30)
    assert 1 <= hybrid.head_rounds + hybrid.lookup_rounds <= len(result.trace)
    assert hybrid.head_rounds > 0


def test_reduced_vocab_maps_both_ways():
    counts = np.array([5, 0, 9, 1, 9, 3], dtype=float)
    vocab = build_reduced_vocab(counts, 3, always=(1,))
    assert vocab.d2t.tolist() == [1, 2, 4]
    assert vocab.t2d.tolist() == [-1, 0, 1, -1, 2, -1]
    assert vocab.coverage(np.array([1, 2, 3, 0])) == 0.5
    q = vocab.scatter_probs(torch.tensor([[0.2, 0.3, 0.5]]))
    assert q.shape == (1, 6) and float(q[0, 4]) == pytest.approx(0.5) and float(q.sum()) == pytest.approx(1.0)
    for bad in (lambda: build_reduced_vocab(counts, 0), lambda: build_reduced_vocab(-counts, 2),
                lambda: ReducedVocab(torch.tensor([1, 1]), 6), lambda: ReducedVocab(torch.tensor([7]), 6)):
        with pytest.raises(ValueError):
            bad()


class _HookedPolicy(FixedDraftPolicy):
    """A policy (chain of 6, or an EAGLE-2 tree of depth cap 6) whose hooks stop
    drafting at ``stop_depth`` and verify ``size`` nodes, recording every DraftStep /
    TreeCandidates it is shown."""

    def __init__(self, stop_depth: int, size: int, chain: bool):
        super().__init__(6, tree=None if chain else TreePlan(top_k=3, max_depth=6))
        self.stop_depth, self.size, self.steps, self.trees = stop_depth, size, [], []

    def continue_drafting(self, step) -> bool:
        self.steps.append(step)
        return step.depth < self.stop_depth

    def verify_size(self, candidates) -> int:
        self.trees.append(candidates)
        return self.size


@pytest.mark.parametrize("chain", [False, True])
def test_policy_hooks_set_depth_and_verification_size_and_stay_exact(trained, tiny, chain):
    """The decoder hands its policy to the drafter, which asks ``continue_drafting``
    after every draft step and ``verify_size`` after drafting a tree (DraftPolicy's
    optional hooks, the interface LTD's depth and size policies use)."""
    folder, _ = trained["eagle3"]
    drafter = load_eagle_drafter(tiny, "eagle3", folder=folder, train_if_missing=False, progress=False)
    policy = _HookedPolicy(stop_depth=3 if chain else 2, size=4, chain=chain)
    decoder = SpeculativeDecoder(tiny, drafter, policy=policy, eos_token_id=-1)
    prompt = [int(x) for x in _stream(12, 7)]
    result = decoder.generate(prompt, max_new_tokens=24)
    assert result.new_tokens == _plain_greedy(tiny.model, prompt, 24)
    assert policy.steps and max(s.depth for s in policy.steps) <= policy.stop_depth
    for step in policy.steps:
        assert step.context_length >= len(prompt) and 0.0 <= step.max_prob <= 1.0
        assert np.all(np.diff(step.candidate_probs) <= 0) and step.path_prob == step.candidate_probs[0]
    drafted = [r for r in result.trace if r.num_draft_tokens > 0]
    assert drafted
    if chain:
        assert not policy.trees and max(r.num_draft_tokens for r in drafted) == 3
    else:
        assert policy.trees and all(c.depth <= 2 and 1 <= c.node_probs.size <= 3 + 9 for c in policy.trees)
        assert max(r.num_draft_tokens for r in drafted) == 4 and max(r.tree_depth for r in drafted) <= 2


def test_hybrid_passes_on_its_heads_observation():
    """The hybrid's observation is its head's (a head reporting a loss keeps it)."""
    from specloop.realmodels.drafters.base import BaseDrafter
    from specloop.realmodels.heads.hybrid import HybridDrafter

    class LossHead(BaseDrafter):
        name, needs_target_hidden = "loss-head", ()

        def reset(self, prompt_ids, *, target_hidden=None):
            pass

        def propose(self, request):
            raise AssertionError("not called")

        def observe(self, feedback):
            return {"loss": 0.25}

    assert HybridDrafter(LossHead()).observe(None) == {"loss": 0.25}
