"""Small distilled LM draft: initialisation from the target, distillation on a tiny
cache, save/reload, lossless chain/tree drafting with its own KV cache."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.heads.common import load_draft, save_draft
from specloop.realmodels.heads.small_lm import (SmallLMConfig, SmallLMDraft, SmallLMDraftDrafter,
                                                default_init_layers, small_lm_from_saved)
from specloop.realmodels.loading import LoadedModel
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.training.head_loop import LoopConfig
from specloop.realmodels.training.train_small_lm import SmallLMTrainConfig, train_small_lm_draft
from specloop.strategies.base import TreePlan
from tests.realmodels.heads_b_util import VOCAB, frequency_vocab, tiny_cache, tiny_target, token_stream

NO_EOS = [VOCAB + 7]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = tiny_target(layers=3)
    folder = tmp_path_factory.mktemp("small_lm_cache")
    train = tiny_cache(model, folder / "train", 8192, seed=0)
    val = tiny_cache(model, folder / "val", 2048, seed=1)
    return model, train, val


@pytest.fixture(scope="module")
def trained(setup):
    model, train, val = setup
    torch.manual_seed(0)
    draft = SmallLMDraft.from_target(model, frequency_vocab(train, 80), num_layers=1)
    with torch.no_grad():   # forget the target's LM head: the test must see distillation work
        draft.lm_head.proj.weight.normal_(0.0, 0.02)
    cfg = SmallLMTrainConfig(window=24, eval_windows=16)
    before = train_small_lm_draft(draft, train, val, LoopConfig(steps=1, batch_size=1, lr=1e-9, warmup=1),
                                  cfg, progress=False)["final"]
    report = train_small_lm_draft(draft, train, val, LoopConfig(steps=120, batch_size=8, lr=3e-3, warmup=10),
                                  cfg, progress=False)
    return draft, before, report


def test_init_layers_and_errors():
    assert default_init_layers(4, 30) == (0, 1, 2, 29)
    assert default_init_layers(1, 30) == (29,)
    with pytest.raises(ValueError):
        default_init_layers(31, 30)
    with pytest.raises(ValueError, match="init_layers"):
        SmallLMConfig(num_layers=2, init_layers=(0,))
    model = tiny_target(layers=3)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        SmallLMDraft(SmallLMDraft.from_target(model, torch.arange(10), 1).config, torch.arange(9),
                     model.get_input_embeddings().weight)


def test_full_copy_equals_target_and_is_fully_accepted():
    """All target layers + the full vocabulary: the draft IS the target, so greedy
    drafts are always accepted (tau = k + 1) and outputs match."""
    model = tiny_target(layers=3)
    draft = SmallLMDraft.from_target(model, torch.arange(VOCAB), num_layers=3, init_layers=(0, 1, 2))
    ids = torch.from_numpy(token_stream(30, 1))[None]
    with torch.no_grad():
        assert torch.allclose(draft(ids)[0], model(ids).logits, atol=1e-4)
    target = LoadedModel(model, None, "tiny", "test")
    prompt = token_stream(15, 2).tolist()
    out = SpeculativeDecoder(target, SmallLMDraftDrafter(draft), policy=FixedDraftPolicy(4),
                             eos_token_id=NO_EOS).generate(prompt, 25)
    assert [r.tokens_per_round for r in out.trace] == [5] * 5


def test_distillation_improves_heldout_agreement(trained):
    _, before, report = trained
    assert report["final"]["top1"] > before["top1"] + 0.1
    assert report["final"]["loss"] < before["loss"]
    assert report["train_positions"] == 120 * 8 * 24


def test_saved_draft_reloads_to_identical_predictions(setup, trained, tmp_path):
    model, *_ = setup
    draft, _, report = trained
    save_draft(draft.state_dict(), {"architecture": draft.config.to_dict()}, "tiny", "small-lm", tmp_path)
    again = small_lm_from_saved(model, *load_draft("tiny", "small-lm", tmp_path))
    ids = torch.from_numpy(token_stream(20, 4))[None]
    with torch.no_grad():
        assert torch.equal(again(ids)[0], draft(ids)[0])


@pytest.mark.parametrize("tree", [None, TreePlan(branching=(3, 2, 1)), TreePlan(top_k=3, max_depth=4)])
def test_greedy_speculative_equals_plain_greedy(setup, trained, tree):
    model, *_ = setup
    draft, *_ = trained
    target = LoadedModel(model, None, "tiny", "test")
    drafter = SmallLMDraftDrafter(draft)          # reused across prompts: reset must clear its cache
    for seed, length in ((5, 20), (6, 1), (9, 7)):
        prompt = token_stream(length, seed).tolist()
        plain = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(0),
                                   eos_token_id=NO_EOS).generate(prompt, 30)
        spec = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(4, tree),
                                  eos_token_id=NO_EOS).generate(prompt, 30)
        assert spec.new_tokens == plain.new_tokens


def test_propose_before_reset_raises(trained):
    from specloop.realmodels.drafters.base import DraftRequest
    from specloop.realmodels.sampling import SamplingConfig
    from specloop.strategies.base import DraftPlan
    draft, *_ = trained
    request = DraftRequest(torch.tensor([1, 2]), DraftPlan(2), 4, SamplingConfig(), torch.Generator())
    with pytest.raises(ValueError, match="reset"):
        SmallLMDraftDrafter(draft).propose(request)
    with pytest.raises(ValueError, match="empty"):
        SmallLMDraftDrafter(draft).reset(torch.zeros(0, dtype=torch.long))


def test_registered_trainer_saves_a_draft_the_registry_loads(tmp_path):
    from tests.realmodels.heads_b_util import registered_roundtrip
    drafter, report, target = registered_roundtrip("small-lm", tmp_path)
    assert report["optimizer_steps"] == 20 and report["positions_seen"] == 20 * 2 * 17
    assert drafter.name == "small-lm" and report["architecture"]["num_layers"] == 2
    prompt = token_stream(10, 3).tolist()
    plain = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(0), eos_token_id=NO_EOS).generate(prompt, 12)
    spec = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(4), eos_token_id=NO_EOS).generate(prompt, 12)
    assert spec.new_tokens == plain.new_tokens


def test_small_lm_name_with_a_model_option_delegates_to_the_decoder_factory():
    from specloop.realmodels.registry.head_factories import make_distilled_small_lm_drafter
    target = LoadedModel(tiny_target(), None, "tiny", "test")
    with pytest.raises(FileNotFoundError):
        make_distilled_small_lm_drafter(target, model="/nonexistent/model/dir")


def test_tree_expand_scores_each_path_as_if_alone_and_leaves_the_prefix_cache(trained):
    """One depth of the tree (B paths as one masked sequence over the prefix cache)
    gives each path the logits a plain forward of prefix + path gives, and the cache
    holds the prefix again afterwards."""
    draft, *_ = trained
    drafter = SmallLMDraftDrafter(draft)
    prompt = token_stream(12, 3).tolist()
    drafter.reset(torch.tensor(prompt))
    root = drafter._sync(prompt)
    expand = drafter._tree_expand(prompt, root)
    prefix = len(drafter._cached)
    paths, _ = expand(None, None, 0)
    tokens = torch.tensor([[5], [9], [5]])
    paths = torch.tensor([[3], [3], [11]])
    grown, logits = expand(paths, tokens, 2)
    assert grown.shape == (3, 2) and drafter._cache.get_seq_length() == prefix
    for b in range(3):
        ids = torch.tensor(drafter._cached + grown[b].tolist())[None]
        with torch.no_grad():
            alone = draft(ids)[0][0, -1]
        torch.testing.assert_close(logits[b], alone, atol=1e-4, rtol=1e-4)
