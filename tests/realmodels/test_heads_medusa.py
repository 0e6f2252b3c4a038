"""Medusa heads: shapes and errors, training on a tiny cache, save/reload, lossless
chain/tree drafting through the decoder (tiny target)."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.heads.common import load_draft, save_draft
from specloop.realmodels.heads.head_drafting import MedusaDrafter
from specloop.realmodels.heads.medusa import MedusaConfig, MedusaHeads, build_medusa, medusa_from_saved
from specloop.realmodels.loading import LoadedModel
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.training.head_loop import LoopConfig
from specloop.realmodels.training.train_hydra import fixed_eval_batch
from specloop.realmodels.training.train_medusa import MedusaTrainConfig, train_medusa_heads
from specloop.strategies.base import TreePlan
from tests.realmodels.heads_b_util import HIDDEN, VOCAB, frequency_vocab, tiny_cache, tiny_target, token_stream

NO_EOS = [VOCAB + 7]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model = tiny_target()
    folder = tmp_path_factory.mktemp("medusa_cache")
    train = tiny_cache(model, folder / "train", 8192, seed=0)
    val = tiny_cache(model, folder / "val", 2048, seed=1)
    torch.manual_seed(0)
    heads = build_medusa(model, frequency_vocab(train, 80), num_heads=3)
    batch = fixed_eval_batch(val, 3, 1024)
    with torch.no_grad():
        logits0 = heads(batch.h)
    report = train_medusa_heads(heads, train, val, LoopConfig(steps=150, batch_size=64, lr=3e-3, warmup=10),
                                MedusaTrainConfig(eval_positions=1024), progress=False)
    return model, heads, report, logits0, batch


def test_config_errors():
    with pytest.raises(ValueError):
        MedusaConfig(hidden_size=8, num_layers=0)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        MedusaHeads(MedusaConfig(8, 2, 1, 10, 4), torch.tensor([0, 1, 2]))
    heads = MedusaHeads(MedusaConfig(8, 2, 1, 10, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="depth"):
        heads.head_logits(torch.zeros(1, 8), 2)


def test_fresh_heads_copy_the_target_lm_head():
    """ResBlocks start as the identity: a fresh head's logits = the target LM head's rows."""
    model = tiny_target()
    vocab = torch.arange(0, VOCAB, 3)
    heads = build_medusa(model, vocab, num_heads=2)
    h = torch.randn(4, HIDDEN)
    expect = model.lm_head(h)[:, vocab]
    out = heads(h)
    assert out.shape == (4, 2, vocab.numel())
    assert torch.allclose(out[:, 0], expect, atol=1e-5) and torch.allclose(out[:, 1], expect, atol=1e-5)
    assert torch.allclose(heads.head_logits(h, 1), out[:, 1])


def test_training_improves_heldout_agreement(trained):
    _, heads, report, logits0, batch = trained
    agree0 = (heads.lm_head.draft_to_target[logits0.argmax(-1)] == batch.topk_ids[..., 0]).float().mean(0)
    for i in range(3):
        assert report["final"][f"top1_head{i + 1}"] > float(agree0[i]) + 0.1
    assert report["positions"] == 150 * 64


def test_saved_heads_reload_to_identical_predictions(trained, tmp_path):
    model, heads, report, _, batch = trained
    save_draft(heads.state_dict(), {"architecture": heads.config.to_dict(), "training": report["final"]},
               "tiny", "medusa", tmp_path)
    tensors, config = load_draft("tiny", "medusa", tmp_path)
    again = medusa_from_saved(model, tensors, config)
    with torch.no_grad():
        assert torch.equal(again(batch.h), heads(batch.h))
    assert config["training"] == report["final"]
    bigger = tiny_target()
    bigger.resize_token_embeddings(VOCAB + 4)
    with pytest.raises(ValueError, match="vocabulary"):
        medusa_from_saved(bigger, tensors, config)


@pytest.mark.parametrize("tree", [None, TreePlan(branching=(4, 2, 1)), TreePlan(top_k=3, max_depth=3)])
def test_greedy_speculative_equals_plain_greedy(trained, tree):
    model, heads, *_ = trained
    target = LoadedModel(model, None, "tiny", "test")
    for seed, length in ((5, 20), (6, 1), (8, 13)):
        prompt = token_stream(length, seed).tolist()
        plain = SpeculativeDecoder(target, MedusaDrafter(heads), policy=FixedDraftPolicy(0),
                                   eos_token_id=NO_EOS).generate(prompt, 30)
        spec = SpeculativeDecoder(target, MedusaDrafter(heads), policy=FixedDraftPolicy(3, tree),
                                  eos_token_id=NO_EOS).generate(prompt, 30)
        assert spec.new_tokens == plain.new_tokens
        assert max(r.tree_depth for r in spec.trace) <= 3


def test_registered_trainer_saves_a_draft_the_registry_loads(tmp_path):
    from tests.realmodels.heads_b_util import registered_roundtrip
    drafter, report, target = registered_roundtrip("medusa", tmp_path)
    assert report["optimizer_steps"] == 20 and len(report["heldout_top1_per_step"]) == 5
    assert drafter.name == "medusa" and drafter.parameters()
    prompt = token_stream(10, 3).tolist()
    plain = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(0), eos_token_id=NO_EOS).generate(prompt, 12)
    spec = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3, TreePlan(branching=(2, 2))),
                              eos_token_id=NO_EOS).generate(prompt, 12)
    assert spec.new_tokens == plain.new_tokens
