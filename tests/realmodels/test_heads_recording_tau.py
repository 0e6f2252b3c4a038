"""benchmarks/heads_recording_tau.py: the per-depth acceptance on known rounds, the head
spec parser, and its replayed rows against the real decoder on a tiny recorded target
(the benchmark's tau must be the decoder's, round for round)."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.heads_recording_tau import acceptance_by_depth, cell, parse_head, plans, replay_rows

from .decoder_util import one_thread  # noqa: F401
from .test_train_from_recording import EOS, _config, _record, target  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def test_acceptance_by_depth_is_conditional_on_the_earlier_steps():
    # four k=3 rounds accepting 0, 1, 3, 2 tokens and one truncated k=1 round accepting 1
    cols = {"nodes": np.array([3, 3, 3, 3, 1]), "accepted": np.array([0, 1, 3, 2, 1])}
    step1, step2, step3 = acceptance_by_depth(cols, 3)
    assert step1 == pytest.approx(4 / 5)        # 4 of 5 rounds accepted step 1
    assert step2 == pytest.approx(2 / 3)        # of the 3 k=3 rounds past step 1, 2 accepted step 2
    assert step3 == pytest.approx(1 / 2)
    assert np.isnan(acceptance_by_depth({"nodes": np.array([1]), "accepted": np.array([0])}, 2)[1])


def test_parse_head():
    assert parse_head("warm=eagle3@/d/x") == ("warm", "eagle3", "/d/x")
    assert parse_head("shipped=hydra") == ("shipped", "hydra", None)
    for bad in ("eagle3", "=eagle3", "x=gpt2", "x="):
        with pytest.raises(ValueError):
            parse_head(bad)


def test_replayed_rows_equal_the_real_decoder(target, tmp_path):
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.streams.replay import load_verify_cost
    from specloop.realmodels.recording import open_recording, recorded_items
    from specloop.realmodels.training.trainer import get_trainer
    folder = _record(target, tmp_path / "rec")
    get_trainer("eagle3")(_config("eagle3", folder, tmp_path / "head", steps=60), loaded=target, progress=False)
    drafter = make_drafter("eagle3", target, checkpoint=str(tmp_path / "head"), train_if_missing=False,
                           progress=False)
    rec = open_recording(folder)
    items = recorded_items(rec, every=3)
    costs = {d: load_verify_cost(None, d) for d in ("float32", "bfloat16")}
    for name, policy in plans([3], "topk=2,depth=3,v=5").items():
        cols = replay_rows(rec, target, drafter, policy, items)
        real = []
        for item in items:
            result = SpeculativeDecoder(target, drafter, policy=policy, eos_token_id=EOS).generate(
                list(item.ids), rec.prompt(item.index)["new_tokens"])
            real += [r.tokens_per_round for r in result.trace]
        assert cols["tokens"].tolist() == real
        row = cell(cols, {it.index: it.dataset for it in items}, costs, 3 if name == "chain-k3" else None)
        assert row["mean_accepted_length"] == pytest.approx(sum(real) / len(real))
        assert set(row["tau_per_domain"]) == {"a", "b"}
        if name == "chain-k3":
            drafted = cols["nodes"] >= 1
            assert row["acceptance_by_depth"][0] == pytest.approx(float(np.mean(cols["accepted"][drafted] >= 1)))
    assert cols["accepted"].sum() > 0            # some drafts accepted: the comparison has teeth


def test_vocab_coverage_counts_continuation_tokens_per_domain():
    from types import SimpleNamespace

    import torch

    from benchmarks.heads_recording_tau import vocab_coverage
    records = {0: {"tokens": np.array([9, 9, 1, 2, 3]), "prompt_length": 2},      # continuation 1 2 3
               1: {"tokens": np.array([4, 5]), "prompt_length": 1}}               # continuation 5
    rec = SimpleNamespace(manifest={"model": {"vocab_size": 10}}, prompt=records.__getitem__)
    items = [SimpleNamespace(index=0, dataset="a"), SimpleNamespace(index=1, dataset="b")]
    drafter = SimpleNamespace(vocab=SimpleNamespace(d2t=torch.tensor([1, 3, 9])))
    assert vocab_coverage(drafter, rec, items) == {"a": pytest.approx(2 / 3), "b": 0.0}
    hydra_like = SimpleNamespace(vocab=SimpleNamespace(draft_to_target=torch.tensor([5])))
    assert vocab_coverage(hydra_like, rec, items) == {"a": 0.0, "b": 1.0}
    assert vocab_coverage(SimpleNamespace(), rec, items) == {}
