"""Device bugs caught on CPU: host helpers under a meta default device, drafters built
for a target on another device, and the stream syncs per round of every drafter
(`sync_probe`: the target's and the drafter's tensors treated as device tensors)."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.strategies.base import TreePlan
from tests.realmodels.decoder_util import as_loaded, plain_greedy, tiny_llama
from tests.realmodels.sync_probe import count_syncs

V = 64
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
PLANS = {"chain5": FixedDraftPolicy(5), "tree321": FixedDraftPolicy(3, TreePlan(branching=(3, 2, 1))),
         "eagle2_k4d4v12": FixedDraftPolicy(4, TreePlan(top_k=4, max_depth=4, verify_size=12))}
#: stream syncs per round (greedy) at most, for every plan (the separate small LM's
#: EAGLE-2 tree reads each level's top-k and copies each level's block: 13 measured)
BUDGET = 12
BUDGETS = {"small-lm": 14}


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(vocab=V, hidden=32, layers=2, max_positions=256, scale=2.0)
    return model


def _drafter(kind: str, model):
    """(drafter, the modules whose tensors live on the device)."""
    d2t = torch.arange(0, V, 2)
    if kind == "ngram":
        from specloop.realmodels.drafters.ngram import NGramDrafter
        return NGramDrafter(), []
    if kind in ("suffix", "hedge"):
        from specloop.realmodels.registry.drafters import make_drafter
        return make_drafter("suffix" if kind == "suffix" else "hedge:suffix,ngram", as_loaded(model)), []
    if kind in ("eagle", "eagle3"):
        from specloop.realmodels.heads.common import ReducedVocab
        from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
        from specloop.realmodels.heads.eagle_drafter import EagleDrafter
        cfg = EagleConfig.from_target(model.config, kind, int(d2t.numel()))
        head = EagleHead(cfg, model.get_input_embeddings().weight.detach(),
                         model.get_output_embeddings().weight.detach()[d2t])
        drafter = EagleDrafter(head, ReducedVocab(d2t, V), name=kind)
        return drafter, [head, drafter._d2t]
    if kind == "hydra":
        from specloop.realmodels.heads.head_drafting import HydraDrafter
        from specloop.realmodels.heads.hydra import build_hydra
        heads = build_hydra(model, d2t, num_heads=4)
        return HydraDrafter(heads), [heads]
    if kind == "medusa":
        from specloop.realmodels.heads.head_drafting import MedusaDrafter
        from specloop.realmodels.heads.medusa import build_medusa
        heads = build_medusa(model, d2t, num_heads=4)
        return MedusaDrafter(heads), [heads]
    if kind == "small-lm":
        from specloop.realmodels.drafters.small_lm import SmallLMDrafter
        draft = tiny_llama(vocab=V, hidden=16, layers=1, max_positions=256, seed=1)
        return SmallLMDrafter(draft), [draft]
    if kind == "distilled":
        from specloop.realmodels.heads.small_lm import SmallLMDraft, SmallLMDraftDrafter
        draft = SmallLMDraft.from_target(model, d2t, num_layers=1)
        return SmallLMDraftDrafter(draft), [draft]
    raise AssertionError(kind)


KINDS = ("ngram", "suffix", "hedge", "hydra", "medusa", "eagle", "eagle3", "small-lm", "distilled")


def measure(model, kind: str, plan: str, max_new_tokens: int = 24) -> tuple[list[int], list[int]]:
    """(syncs of each round, new tokens) of a greedy decode of ``kind`` with ``plan``."""
    drafter, modules = _drafter(kind, model)
    decoder = SpeculativeDecoder(as_loaded(model), drafter, policy=PLANS[plan], eos_token_id=-1)
    rounds, _, result = count_syncs(decoder, PROMPT, max_new_tokens, modules)
    return rounds, result.new_tokens


@pytest.mark.parametrize("kind", KINDS)
def test_syncs_per_round_within_budget_and_lossless(target, kind):
    reference = plain_greedy(target, PROMPT, 24)
    for plan in PLANS:
        rounds, tokens = measure(target, kind, plan)
        assert tokens == reference, (kind, plan)
        assert max(rounds) <= BUDGETS.get(kind, BUDGET), f"{kind} {plan}: {max(rounds)} syncs in a round (each: {rounds})"


def test_counter_sees_a_sync(target):
    """The counter can fail: a .tolist() of a device tensor in specloop code counts."""
    from tests.realmodels.sync_probe import SyncCounter, mark_device, unmark
    from specloop.realmodels.session import TargetPass
    from specloop.realmodels.drafters.base import DraftProposal
    logits = torch.randn(3, V)
    mark_device(logits)
    counter = SyncCounter()
    counter.round = 0
    with counter:
        TargetPass(DraftProposal.chain([1, 2]), logits, None, 0).host_values()
    unmark(logits)
    assert counter.per_round[0] >= 1
    assert any("session.py" in site for _, site in counter.sites)


def test_host_helpers_under_meta_default_device():
    """Helpers that make host tensors name the host (a meta / cuda default device would
    otherwise put them there)."""
    from specloop.realmodels.drafters.base import DraftProposal
    from specloop.realmodels.padding import pad_block
    from specloop.realmodels.tree import ancestor_matrix, block_inputs, node_depths
    from specloop.realmodels.verify import verify_greedy, verify_tree
    cpu = {"device": "cpu"}
    parents = torch.tensor([-1, 0, 0, 1], **cpu)
    tokens = torch.tensor([3, 4, 5, 6], **cpu)
    p = torch.softmax(torch.randn(5, 8, **cpu), -1)
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.device("meta"):
        assert node_depths(parents).tolist() == [1, 2, 2, 3]
        assert ancestor_matrix(parents).device.type == "cpu"
        padded = pad_block(tokens, parents, 7, 0)
        assert padded[0].device.type == "cpu" and padded[0].shape[0] == 6
        block = block_inputs(2, tokens, parents, 3, torch.float32, "cpu")
        assert block.positions.tolist() == [[3, 4, 5, 5, 6]]
        proposal = DraftProposal(tokens, parents)
        assert proposal.depths().tolist() == [1, 2, 2, 3] and not proposal.is_chain
        verify_tree(p, tokens, parents, None, gen)
        verify_tree(p, tokens, parents, torch.softmax(torch.randn(4, 8, **cpu), -1), gen)
        assert verify_greedy([3, 4, 0, 0, 0], [3, 4, 5, 6], [-1, 0, 0, 1], gen).accepted_nodes == (0, 1)


def test_block_inputs_mask_equals_dense_mask():
    from specloop.realmodels.tree import additive_mask, ancestor_matrix, block_inputs
    parents = torch.tensor([-1, 0, 0, 1, -1])
    out = block_inputs(7, torch.arange(5), parents, 4, torch.float32, "cpu")
    visible = torch.zeros(6, 10, dtype=torch.bool)
    visible[:, :5] = True
    visible[1:, 5:] = ancestor_matrix(parents)
    assert torch.equal(out.mask, additive_mask(visible, torch.float32, "cpu"))
    assert out.input_ids.tolist() == [7, 0, 1, 2, 3, 4]
    assert out.parent_rows.tolist() == [0, 1, 1, 2, 0]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_saved_eagle_head_lands_on_the_target_device(target, kind):
    """The trained EAGLE head is built on the target's device (meta here) and dtype."""
    from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
    from specloop.realmodels.heads.eagle_drafter import eagle_drafter_from_saved
    import dataclasses
    d2t = torch.arange(0, V, 2)
    cfg = EagleConfig.from_target(target.config, kind, int(d2t.numel()))
    head = EagleHead(cfg, target.get_input_embeddings().weight.detach(),
                     target.get_output_embeddings().weight.detach()[d2t])
    tensors = dict(head.state_dict())
    tensors["d2t"] = d2t
    meta = {"config": {**dataclasses.asdict(cfg), "feature_layers": list(cfg.feature_layers)}}
    on_meta = tiny_llama(vocab=V, hidden=32, layers=2, max_positions=256).to("meta")
    drafter = eagle_drafter_from_saved(as_loaded(on_meta), kind, dict(tensors), meta, dtype="bfloat16")
    placed = list(drafter.head.parameters()) + list(drafter.head.buffers()) + [drafter._d2t]
    assert all(t.device.type == "meta" for t in placed)
    assert all(t.dtype == torch.bfloat16 for t in drafter.head.parameters())


def test_flash_attention_is_refused_in_one_line(target):
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.kvcache import check_tree_attention
    check_tree_attention(target)                   # sdpa: fine
    config = target.config
    saved = config._attn_implementation
    try:
        config._attn_implementation = "flash_attention_2"
        with pytest.raises(ValueError, match="attn_implementation"):
            SpeculativeDecoder(as_loaded(target), NGramDrafter())
    finally:
        config._attn_implementation = saved


def test_cost_pruning_drafters_time_a_device_target_on_its_device(monkeypatch):
    """Off the CPU, the suffix drafter and Hedge price verification by a table measured on
    the target's device, not the shipped CPU one; their sources prune by the same table."""
    import numpy as np
    from specloop.realmodels import padding
    from specloop.realmodels.drafters.suffix import shipped_verify_cost, verify_cost_for
    from specloop.realmodels.registry.drafters import make_drafter
    calls = []

    def fake_measure(model, *, max_width, context=64, repeats=3):
        calls.append(max_width)
        return [1e-3 * (1 + 0.01 * w) for w in range(1, max_width + 1)]

    monkeypatch.setattr(padding, "measure_verify_cost", fake_measure)
    on_device = torch.nn.Linear(4, 4, device="meta")          # parameters off the CPU
    shipped = shipped_verify_cost("float32")
    measured = verify_cost_for(on_device)
    assert calls == [shipped.size] and measured[0] == pytest.approx(1.01e-3)
    assert not np.allclose(measured, shipped)
    np.testing.assert_array_equal(verify_cost_for(torch.nn.Linear(4, 4)), shipped)   # CPU: the shipped table
    suffix = make_drafter("suffix", on_device)
    np.testing.assert_allclose(suffix.verify_cost, measured)
    hedge = make_drafter("hedge:suffix,ngram", on_device)
    np.testing.assert_allclose(hedge.sources[0].verify_cost, measured)
    assert len(calls) == 3                                    # suffix once, hedge once for itself and its sources


def test_hedge_times_each_source_between_device_syncs():
    from specloop.realmodels.drafters.base import DraftRequest
    from specloop.realmodels.drafters.hedge import HedgeDrafter
    from specloop.realmodels.padding import device_sync
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.drafters.suffix import shipped_verify_cost
    assert device_sync(torch.nn.Linear(2, 2)) is None
    syncs = []
    hedge = HedgeDrafter([NGramDrafter(), NGramDrafter()], ["a", "b"], verify_cost=shipped_verify_cost(),
                         explore=1.0, sync=lambda: syncs.append(1))
    prompt = torch.tensor(PROMPT)
    hedge.reset(prompt)
    from specloop.realmodels.sampling import SamplingConfig
    from specloop.strategies.base import DraftPlan
    hedge.propose(DraftRequest(prompt, DraftPlan(4), 16, SamplingConfig(0.0), torch.Generator()))
    assert len(syncs) == 4                                    # before and after each of the two sources


def test_the_decoders_clock_waits_for_the_device_it_times():
    from specloop.realmodels.decoder import _Clock
    from specloop.realmodels.padding import sync_for_device
    assert sync_for_device(None) is None and sync_for_device(torch.device("cpu")) is None
    assert sync_for_device(torch.device("cuda")) is torch.cuda.synchronize
    assert sync_for_device(torch.device("mps")) is torch.mps.synchronize
    assert _Clock(torch.device("cpu")).sync is None
    assert _Clock(torch.device("mps")).sync is torch.mps.synchronize     # not only CUDA
