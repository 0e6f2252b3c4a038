"""Online adaptation in the real decoder: lossless under updates, the loss and its
gradient, the per-round loss f_t, the drafters' online-training accessors, learner
checkpoints, schedules (round / chunk / background), bad input."""
from __future__ import annotations

import math

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.online import (LEARNER_KINDS, FeatureHeadObjective, OnlineAdapter, OnlineConfig,
                                        OnlineDrafter, load_checkpoint, objective_for, save_checkpoint)
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.strategies.registry import LEARNER_ALIASES
from tests.realmodels.decoder_util import plain_greedy
from tests.realmodels.heads_b_util import HIDDEN
from tests.realmodels.test_online_util import (NO_EOS, eagle_drafter, hydra_drafter, medusa_drafter, prompts,
                                               small_lm_drafter, tiny_loaded)

LR = {"ogd": 0.05, "optimistic": 0.05, "ensemble": 0.02, "optimistic-ensemble": 0.02, "osd": 3e-3}
LR.update({alias: LR[name] for alias, name in LEARNER_ALIASES.items()})   # "opt", "ens", ... too


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


def serve(target, drafter, stream, max_new_tokens=20, k=3):
    outs = []
    for i, ids in enumerate(stream):
        dec = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(k), eos_token_id=NO_EOS, seed=i)
        outs.append(dec.generate(ids, max_new_tokens, stream_index=i))
    return outs


def params_of(drafter):
    return [p.detach().clone() for p in drafter.parameters()]


@pytest.mark.parametrize("learner", ["ogd", "ens", "osd"])
def test_updates_never_change_greedy_output(target, learner):
    inner = hydra_drafter(target)
    before = params_of(inner)
    adapter = OnlineAdapter(inner, OnlineConfig(learner=learner, lr=LR[learner], osd_interval=2))
    stream = prompts(3)
    results = serve(target, OnlineDrafter(inner, adapter), stream)
    assert adapter.num_steps > 0
    moved = sum(float((a - b.detach()).norm()) for a, b in zip(before, inner.parameters()))
    assert moved > 0, "the learner never changed the draft"
    for ids, res in zip(stream, results):
        assert res.new_tokens == plain_greedy(target.model, ids, 20)
    # and after all updates: served again, still the target's greedy output
    again = serve(target, OnlineDrafter(inner, adapter), stream[:1])
    assert again[0].new_tokens == results[0].new_tokens


def test_online_rounds_time_their_updates_and_record_losses(target):
    inner = hydra_drafter(target)
    drafter = OnlineDrafter(inner, OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=0.05)))
    res = serve(target, drafter, prompts(1))[0]
    assert len(drafter.round_losses) == len(res.trace)
    assert sum(math.isfinite(x) for x in drafter.round_losses) >= len(res.trace) - 1
    assert sum(r.update_time for r in res.trace) > 0


@pytest.mark.parametrize("make", [hydra_drafter, medusa_drafter])
def test_loss_is_cross_entropy_and_ogd_descends(target, make):
    inner = make(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=0.05, mode="chunk"))
    serve(target, OnlineDrafter(inner, adapter), prompts(2))
    samples = adapter.chunk_samples[:6]
    assert samples
    s = max(samples, key=lambda x: x.tokens.numel())
    # manual cross-entropy over the sample's verified positions (heads unrolled)
    with torch.no_grad():
        z, terms = s.h[None], []
        for depth in range(s.tokens.numel()):
            if adapter.objective.is_hydra:
                z, logits = inner.heads.step(depth, z, s.tokens[depth:depth + 1])
            else:
                logits = inner.heads.head_logits(s.h[None], depth)
            logp = torch.log_softmax(logits[0], -1)
            valid = s.target_rows[depth] >= 0
            terms.append(-(s.target_probs[depth][valid] * logp[s.target_rows[depth][valid]]).sum())
        manual = float(torch.stack(terms).mean())
        assert float(adapter.objective.loss([s])) == pytest.approx(manual, rel=1e-5)
        assert torch.allclose(s.target_probs.sum(-1), torch.ones(s.tokens.numel()), atol=1e-5)
    loss0, _ = adapter._loss_grad(samples)
    for _ in range(5):
        adapter._step(samples)
    loss1, _ = adapter._loss_grad(samples)
    assert loss1 < loss0


def test_chunk_mode_updates_only_at_chunk_end(target):
    inner = hydra_drafter(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="opt", lr=0.05, mode="chunk", epochs=2, batch_size=4))
    serve(target, OnlineDrafter(inner, adapter), prompts(2))
    n = len(adapter.chunk_samples)
    assert adapter.num_steps == 0 and n > 0
    adapter.end_chunk()
    assert adapter.num_steps == 2 * math.ceil(n / 4) and not adapter.chunk_samples


def test_background_updates_keep_output_and_finish(target):
    inner = hydra_drafter(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=0.05, background=True))
    stream = prompts(2)
    results = serve(target, OnlineDrafter(inner, adapter), stream)
    adapter.end_chunk()
    assert adapter.num_steps > 0
    assert all(torch.isfinite(p).all() for p in inner.parameters())
    for ids, res in zip(stream, results):
        assert res.new_tokens == plain_greedy(target.model, ids, 20)
    adapter.close()


@pytest.mark.parametrize("learner", LEARNER_KINDS)
def test_checkpoint_round_trip_continues_identically(target, learner, tmp_path):
    inner = hydra_drafter(target)
    config = OnlineConfig(learner=learner, lr=LR[learner], osd_interval=3, batch_size=2)
    adapter = OnlineAdapter(inner, config)
    serve(target, OnlineDrafter(inner, adapter), prompts(1), max_new_tokens=12)
    save_checkpoint(tmp_path / "state.pt", adapter.state_dict())
    other_inner = hydra_drafter(target, seed=5)
    other = OnlineAdapter(other_inner, config)
    other.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    for a, b in zip(inner.parameters(), other_inner.parameters()):
        assert torch.equal(a, b)
    assert other.rounds == adapter.rounds and len(other.buffer) == len(adapter.buffer)
    # the same further feedback gives the same parameters
    stream = prompts(3)[1:]
    ra = serve(target, OnlineDrafter(inner, adapter), stream, max_new_tokens=12)
    rb = serve(target, OnlineDrafter(other_inner, other), stream, max_new_tokens=12)
    assert [r.trace.column("accepted_tokens").tolist() for r in ra] == \
        [r.trace.column("accepted_tokens").tolist() for r in rb]
    for a, b in zip(inner.parameters(), other_inner.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_bad_input(target, tmp_path):
    with pytest.raises(ValueError, match="learner"):
        OnlineConfig(learner="sgd")
    with pytest.raises(ValueError, match="lr"):
        OnlineConfig(lr=-1.0)
    with pytest.raises(ValueError, match="mode"):
        OnlineConfig(mode="epoch")
    with pytest.raises(ValueError, match="batch_size"):
        OnlineConfig(batch_size=0)
    with pytest.raises(ValueError, match="no online objective"):
        objective_for(NGramDrafter())
    with pytest.raises(ValueError, match="Hydra or Medusa"):
        FeatureHeadObjective(NGramDrafter())
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    inner = hydra_drafter(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=0.05))
    state = adapter.state_dict()
    with pytest.raises(ValueError, match="learner"):
        OnlineAdapter(hydra_drafter(target), OnlineConfig(learner="opt")).load_state_dict(state)
    huge = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=1e30, mode="chunk"))
    serve(target, OnlineDrafter(inner, huge), prompts(1), max_new_tokens=8)
    with pytest.raises(ValueError, match="non-finite|NaN"):
        huge.end_chunk()


def test_small_lm_online_is_lossless_learns_and_round_trips(target, tmp_path):
    from tests.realmodels.test_online_util import small_lm_drafter
    inner = small_lm_drafter(target)
    before = params_of(inner)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="opt", lr=3e-3, batch_size=2))
    stream = prompts(2)
    results = serve(target, OnlineDrafter(inner, adapter), stream, max_new_tokens=14)
    for ids, res in zip(stream, results):
        assert res.new_tokens == plain_greedy(target.model, ids, 14)
    assert adapter.num_steps > 0 and adapter.buffer[0].to_dict()["kind"] == "context"
    assert sum(float((a - b.detach()).norm()) for a, b in zip(before, inner.parameters())) > 0
    samples = adapter.buffer[:6]
    loss0, _ = adapter._loss_grad(samples)
    for _ in range(4):
        adapter._step(samples)
    assert adapter._loss_grad(samples)[0] < loss0
    save_checkpoint(tmp_path / "s.pt", adapter.state_dict())
    other_inner = small_lm_drafter(target)
    other = OnlineAdapter(other_inner, OnlineConfig(learner="opt", lr=3e-3, batch_size=2))
    other.load_state_dict(load_checkpoint(tmp_path / "s.pt"))
    assert all(torch.equal(a, b) for a, b in zip(inner.parameters(), other_inner.parameters()))
    assert [s.ids.tolist() for s in other.buffer] == [s.ids.tolist() for s in adapter.buffer]


@pytest.mark.parametrize("kind", [pytest.param("eagle", marks=pytest.mark.slow), "eagle3"])
def test_eagle_online_matches_drafting_and_learns(target, kind):
    from tests.realmodels.test_online_util import eagle_drafter
    inner = eagle_drafter(target, kind)
    roots = []
    original = inner.propose

    def spy(request):
        out = original(request)
        if inner._root_logits is not None:   # the sample this round will give gets index len(...)
            roots.append((len(adapter.chunk_samples), inner._root_logits.clone()))
        return out
    inner.propose = spy
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ens", lr=3e-3, mode="chunk", batch_size=4))
    stream = prompts(2, length=12)
    results = serve(target, OnlineDrafter(inner, adapter), stream, max_new_tokens=16)
    for ids, res in zip(stream, results):
        assert res.new_tokens == plain_greedy(target.model, ids, 16)
    samples = adapter.chunk_samples
    assert len(roots) >= 20 and samples[0].to_dict()["kind"] == "eagle"
    # the re-run's step-1 output for row 0 is exactly the logits the drafter drafted from
    with torch.no_grad():
        for at, root in roots[:8]:
            smp = samples[at]
            first = int(((smp.steps == 1)).nonzero()[0])
            out = inner.ttt_logits(smp.features[None], smp.next_tokens[None], 1)[0][0]
            assert torch.allclose(out[smp.index[first]], root, atol=1e-4)
    # the batched objective (one right-padded forward, LM head at supervised rows only)
    # equals each sample's own unpadded ttt_logits cross-entropy
    batch = samples[:6]
    assert len({int(smp.features.shape[0]) for smp in batch}) > 1   # padding is exercised
    with torch.no_grad():
        total, per = adapter.objective.loss_and_sample_losses(batch)
        want = []
        for smp in batch:
            outs = inner.ttt_logits(smp.features[None], smp.next_tokens[None], int(smp.steps.max()))
            ce = sum(-(smp.target_probs[j] * torch.log_softmax(outs[int(s) - 1][0, int(i)].float(), -1)
                       [smp.target_rows[j].clamp_min(0)] * (smp.target_rows[j] >= 0)).sum()
                     for j, (s, i) in enumerate(zip(smp.steps, smp.index)))
            want.append(float(ce) / smp.steps.numel())
    assert torch.allclose(per, torch.tensor(want), rtol=1e-4, atol=1e-5)
    counts = torch.tensor([smp.steps.numel() for smp in batch], dtype=torch.float32)
    assert float(total) == pytest.approx(float((per * counts).sum() / counts.sum()), rel=1e-5)
    loss0, _ = adapter._loss_grad(samples[:6])
    adapter.end_chunk()
    assert adapter.num_steps > 0 and adapter._loss_grad(samples[:6])[0] < loss0


@pytest.mark.parametrize("learner,mode,make", [("opt", "round", hydra_drafter), ("ens", "round", hydra_drafter),
                                               ("osd", "round", hydra_drafter), ("ogd", "chunk", medusa_drafter),
                                               ("ogd", "round", small_lm_drafter)])
def test_round_losses_are_f_t_at_the_drafting_parameters(target, learner, mode, make):
    """round_losses[t] = the round's own cross-entropy at the parameters that drafted it
    (the optimistic / ensemble learners evaluate other points too; OSD and chunk mode
    take no step in the round)."""
    inner = make(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner=learner, lr=LR[learner], mode=mode, batch_size=2,
                                                osd_interval=2))
    seen, record = [], adapter.record

    def spy(sample):
        seen.append((sample, params_of(inner)))
        return record(sample)
    adapter.record = spy
    drafter = OnlineDrafter(inner, adapter)
    results = serve(target, drafter, prompts(2), max_new_tokens=14)
    assert len(drafter.round_losses) == len(seen) == sum(len(r.trace) for r in results)
    assert mode == "chunk" or adapter.num_steps > 0
    final, checked = params_of(inner), 0
    for (sample, params), got in zip(seen, drafter.round_losses):
        if sample is None:
            assert math.isnan(got)
            continue
        adapter._write(params)
        with torch.no_grad():
            assert got == pytest.approx(float(adapter.objective.loss([sample])), rel=1e-4, abs=1e-6)
        checked += 1
    adapter._write(final)
    assert checked >= len(seen) - 2
    assert drafter.round_loss == pytest.approx(drafter.round_losses[-1], nan_ok=True)


def test_loss_is_the_position_weighted_mean_of_the_sample_losses(target):
    inner = hydra_drafter(target)
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", mode="chunk"))
    serve(target, OnlineDrafter(inner, adapter), prompts(1))
    samples = adapter.chunk_samples[:5]
    with torch.no_grad():
        loss, per = adapter.objective.loss_and_sample_losses(samples)
        counts = torch.tensor([s.tokens.numel() for s in samples], dtype=torch.float32)
        assert float(loss) == pytest.approx(float((per * counts).sum() / counts.sum()), rel=1e-5)
        for s, value in zip(samples, per):
            assert float(value) == pytest.approx(float(adapter.objective.loss([s])), rel=1e-5)
    with pytest.raises(ValueError, match="empty"):
        adapter.objective.loss_and_sample_losses([])


@pytest.mark.parametrize("make", [hydra_drafter, medusa_drafter])
def test_feature_head_training_accessors(target, make):
    drafter = make(target)
    assert drafter.feature_state() is None
    ids = torch.tensor(prompts(1)[0])
    hidden = torch.randn(ids.numel() - 1, HIDDEN)
    drafter.reset(ids, target_hidden=(hidden,))
    h, pending = drafter.feature_state()
    assert pending == int(ids[-1]) and torch.equal(h, hidden[-1]) and h.dtype == torch.float32
    h.zero_()                                                    # a copy: the drafter is untouched
    assert torch.equal(drafter.feature_state()[0], hidden[-1])
    assert torch.equal(drafter.target_to_draft, drafter.vocab.target_to_draft)
    batch = torch.randn(2, HIDDEN)
    tokens = torch.tensor([[int(ids[-1]), 5, 9], [3, 4, 7]])
    logits = drafter.unrolled_logits(batch, tokens)
    with torch.no_grad():                                        # the same unroll as drafting
        z = batch
        for depth, got in enumerate(logits):
            z, want = drafter.expand(z, tokens[:, depth], depth)
            assert got.shape == (2, drafter.vocab.draft_vocab_size) and torch.allclose(got, want)
    logits[-1].sum().backward()
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in drafter.parameters())
    with pytest.raises(ValueError, match="depths"):
        drafter.unrolled_logits(batch, torch.zeros(2, drafter.max_depth + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="need h"):
        drafter.unrolled_logits(batch, tokens[:1])


def test_eagle_and_small_lm_training_accessors(target):
    eagle = eagle_drafter(target, "eagle3")
    feats, nxt = torch.randn(1, 6, 3 * HIDDEN), torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        want = [lg for _, lg in eagle.head.forward_ttt(feats, nxt, 2)]
        got = eagle.ttt_logits(feats, nxt, 2)
    assert len(got) == 2 and all(torch.allclose(a, b) for a, b in zip(got, want))
    assert torch.equal(eagle.target_to_draft, eagle.vocab.t2d)
    with pytest.raises(ValueError, match="need features"):
        eagle.ttt_logits(feats, nxt[:, :3], 2)
    small = small_lm_drafter(target)
    ids = torch.tensor(prompts(1)[0])
    with torch.no_grad():
        want, _ = small.draft(ids[None], None, torch.arange(4, 4 + ids.numel())[None], use_cache=False)
        got = small.context_logits(ids, 4)
    assert torch.allclose(got, want[0])
    assert torch.equal(small.target_to_draft, small.draft.lm_head.target_to_draft)
    with pytest.raises(ValueError, match="non-empty"):
        small.context_logits(ids[:0], 0)


def test_rms_preconditioner_scales_steps_per_element_and_round_trips(target, tmp_path):
    """precondition="rms": the learner's gradient is g / (sqrt(v_hat) + 1e-8), so the
    first OGD step moves each parameter by ~lr * sign(g) (v_hat = g^2 after one step);
    the output stays the target's greedy output and the second moment round-trips."""
    inner = hydra_drafter(target)
    lr = 1e-3
    # chunk mode with one epoch and a batch larger than the chunk: exactly one step
    config = OnlineConfig(learner="ogd", lr=lr, precondition="rms", mode="chunk", epochs=1, batch_size=256)
    adapter = OnlineAdapter(inner, config)
    drafter = OnlineDrafter(inner, adapter)
    stream = prompts(2)
    before = params_of(inner)
    res = serve(target, drafter, stream[:1], max_new_tokens=12)[0]
    assert res.new_tokens == plain_greedy(target.model, stream[0], 12)
    assert adapter.num_steps == 0 and adapter.rms is None
    adapter.end_chunk()
    assert adapter.num_steps == 1 and adapter.rms_steps == 1
    moved = torch.cat([(a - b).abs().flatten() for a, b in zip(inner.parameters(), before)])
    nonzero = moved[moved > 0]
    assert nonzero.numel() > moved.numel() // 2
    assert float(nonzero.max()) <= lr * (1 + 1e-3)          # |g| / (|g| + 1e-8) <= 1
    assert abs(float(nonzero.median()) - lr) < 1e-3 * lr    # and ~1 for all but tiny g
    # lossless with further updates, and the preconditioner state round-trips
    results = serve(target, drafter, stream[1:], max_new_tokens=12)
    assert results[0].new_tokens == plain_greedy(target.model, stream[1], 12)
    save_checkpoint(tmp_path / "state.pt", adapter.state_dict())
    other_inner = hydra_drafter(target, seed=5)
    other = OnlineAdapter(other_inner, adapter.config)
    other.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    assert other.rms_steps == adapter.rms_steps
    for a, b in zip(adapter.rms, other.rms):
        assert torch.equal(a, b)
    ra = serve(target, OnlineDrafter(inner, adapter), stream[:1], max_new_tokens=12)
    rb = serve(target, OnlineDrafter(other_inner, other), stream[:1], max_new_tokens=12)
    assert ra[0].trace.column("accepted_tokens").tolist() == rb[0].trace.column("accepted_tokens").tolist()
    adapter.end_chunk()
    other.end_chunk()                                       # a step that uses the restored v
    assert adapter.rms_steps == other.rms_steps == 2
    for a, b in zip(inner.parameters(), other_inner.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_rms_preconditioner_bad_input():
    with pytest.raises(ValueError, match="precondition"):
        OnlineConfig(precondition="adam")
    with pytest.raises(ValueError, match="rms_decay"):
        OnlineConfig(precondition="rms", rms_decay=1.0)
