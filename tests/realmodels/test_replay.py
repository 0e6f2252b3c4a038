"""`specloop.realmodels.streams.replay`: a recorded stream replayed equals the real decoder round
for round (tiny random Llama target recorded here, float32): frozen drafts (n-gram,
Hydra chain and tree), an online Hydra (per-round micro-updates), EOS inside a block;
and the replay's refusals."""
from __future__ import annotations

import math

import pytest
import torch

from specloop.data.streams import StreamItem
from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.streams.replay import ReplayDecoder, load_verify_cost
from specloop.realmodels.sampling import SamplingConfig
from specloop.realmodels.recording import RecordSettings, open_recording
from specloop.realmodels.streams.record import record_stream
from specloop.strategies.base import TreePlan
from specloop.theory.speedup import VerifyCostTable

from .decoder_util import as_loaded, one_thread, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, EOS, NEW = 24, 23, 28
COST = VerifyCostTable([1, 8], [0.01, 0.02])


@pytest.fixture(scope="module")
def target():
    # large weights: a peaked, repetitive target the drafts can follow (some rounds accept)
    return as_loaded(tiny_llama(vocab=VOCAB, layers=3, hidden=16, max_positions=128, init_range=0.9, seed=5))


def _items(count: int) -> list[StreamItem]:
    gen = torch.Generator().manual_seed(3)
    return [StreamItem(i, "a" if i < count // 2 else "b", f"p{i}", "",
                       tuple(torch.randint(0, EOS, (2 + (5 * i) % 9,), generator=gen).tolist()))
            for i in range(count)]


@pytest.fixture(scope="module")
def recording(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rec")
    items = _items(6)
    settings = RecordSettings(target="tiny", dtype="float32", datasets=("a", "b"), split="heldout", order="shift",
                              prompts=len(items), max_new_tokens=NEW, max_prompt_tokens=None, chat_template=False,
                              top_m=VOCAB, layers=(-1,), batch_size=3, shard_size=4)
    record_stream(target, items, folder, settings, check_prompts=0)
    return open_recording(folder), items


def _hydra(target, seed: int = 0):
    from specloop.realmodels.heads.head_drafting import HydraDrafter
    from specloop.realmodels.heads.hydra import build_hydra
    torch.manual_seed(seed)
    return HydraDrafter(build_hydra(target.model, torch.arange(VOCAB), num_heads=3))


def _ngram():
    from specloop.realmodels.drafters.ngram import NGramDrafter
    return NGramDrafter()


def _key(record) -> tuple:
    return (record.stream_index, record.round_index, record.num_draft_tokens, record.tree_depth,
            record.accepted_tokens, record.tokens_per_round, record.acceptance_probs)


def _run(decoder, items) -> tuple[list, list]:
    rows, outputs = [], []
    for item in items:
        result = decoder.generate(list(item.ids), NEW, stream_index=item.index)
        rows += [_key(r) for r in result.trace]
        outputs.append(list(result.new_tokens))
    return rows, outputs


@pytest.mark.parametrize("make, plan", [(_ngram, (4,)), (_hydra, (3,)), (_hydra, (3, TreePlan(branching=(2, 2, 1))))],
                         ids=["ngram-chain", "hydra-chain", "hydra-tree"])
def test_frozen_replay_equals_decoder_round_for_round(target, recording, make, plan):
    rec, items = recording
    make_args = (target,) if make is _hydra else ()
    real = SpeculativeDecoder(target, make(*make_args), policy=FixedDraftPolicy(*plan), eos_token_id=EOS)
    replay = ReplayDecoder(rec, target, make(*make_args), policy=FixedDraftPolicy(*plan), verify_cost=COST)
    real_rows, real_out = _run(real, items)
    replay_rows, replay_out = _run(replay, items)
    assert replay_out == real_out
    assert replay_rows == real_rows
    assert any(r[4] > 0 for r in real_rows)                 # some drafts were accepted


def _online_runs(target, rec, items, check_outputs: bool = False) -> list:
    """Opt-Hydra (per-round updates) served by the decoder, then replayed: per engine
    (round keys, losses, final parameters)."""
    from specloop.realmodels.online import OnlineAdapter, OnlineConfig, OnlineDrafter
    runs = []
    for kind in ("real", "replay"):
        inner = _hydra(target, seed=1)
        adapter = OnlineAdapter(inner, OnlineConfig(learner="optimistic", mode="round", lr=0.05, top_m=8, seed=0))
        drafter = OnlineDrafter(inner, adapter)
        decoder = (SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3), eos_token_id=EOS) if kind == "real"
                   else ReplayDecoder(rec, target, drafter, policy=FixedDraftPolicy(3), verify_cost=COST))
        rows, losses = [], []
        for item in items:
            result = decoder.generate(list(item.ids), NEW, stream_index=item.index)
            rows += [_key(r) for r in result.trace]
            losses += [r.loss for r in result.trace]
            if check_outputs:
                recorded = rec.prompt(item.index)
                # updates never change the target's output: both engines commit the recorded greedy tokens
                assert list(result.new_tokens) == recorded["tokens"][recorded["prompt_length"]:].tolist()
        adapter.close()
        runs.append((rows, losses, [p.detach().clone() for p in inner.parameters()]))
    return runs


def test_online_replay_equals_decoder_round_for_round(target, recording):
    rec, items = recording
    traces = _online_runs(target, rec, items, check_outputs=True)
    (real_rows, real_loss, real_params), (rows, loss, params) = traces
    assert rows == real_rows
    # losses and parameters agree up to the recording's float16 rounding of features and
    # p_target (relative 2^-11 per value, compounding over the updates): close, not equal
    finite = [(a, b) for a, b in zip(real_loss, loss) if not math.isnan(a)]
    assert len(finite) > 20 and all(a == pytest.approx(b, rel=2e-2) for a, b in finite)
    start = [p.detach() for p in _hydra(target, 1).parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(real_params, start))
    apart = max(float((a - b).abs().max()) for a, b in zip(real_params, params))
    assert moved > 0 and apart < 0.05 * moved


def test_replay_prices_verification_from_the_table(target, recording):
    rec, items = recording
    replay = ReplayDecoder(rec, target, _ngram(), policy=FixedDraftPolicy(4), verify_cost=COST)
    result = replay.generate(list(items[0].ids), NEW, stream_index=0)
    for record in result.trace:
        priced = float(COST(record.num_draft_tokens + 1))
        assert priced <= record.verify_time < priced + 0.05


def test_replay_refuses_bad_input(target, recording):
    rec, items = recording
    replay = ReplayDecoder(rec, target, _ngram(), verify_cost=COST)
    with pytest.raises(ValueError, match="not the recorded one"):
        replay.generate(list(items[1].ids), 4, stream_index=0)
    with pytest.raises(IndexError, match="not in the recording"):
        replay.generate(list(items[0].ids), 4, stream_index=99)
    stopped = [i for i in items if rec.prompt(i.index)["stop_reason"] == "length"]
    with pytest.raises(ValueError, match="exceeds the"):
        replay.generate(list(stopped[0].ids), NEW + 1, stream_index=stopped[0].index)
    with pytest.raises(ValueError, match="greedy"):
        ReplayDecoder(rec, target, _ngram(), sampling=SamplingConfig(temperature=0.7))
    other = as_loaded(tiny_llama(vocab=VOCAB + 1, layers=3, hidden=16))
    with pytest.raises(ValueError, match="not the recorded one"):
        ReplayDecoder(rec, other, _ngram(), verify_cost=COST)
    with pytest.raises(ValueError, match="no bfloat16 table|no .* table"):
        load_verify_cost(_table(rec), "bfloat16")


def _table(rec):
    import json
    path = rec.folder / "cost.json"
    path.write_text(json.dumps({"tables": {"float32": {"num_tokens": [1, 2], "seconds": [0.1, 0.2]}}}))
    return path


def _config(**online):
    from specloop.realmodels.streams.runner import StreamConfig
    return StreamConfig(chunk=2, max_new_tokens=NEW, num_draft_tokens=3,
                        online={"mode": "round", "lr": 0.05, "top_m": 8, **online}, seed=0)


def test_check_replay_matches_and_stream_runner_replays_resumably(target, recording, tmp_path):
    from specloop.realmodels.streams.replay_check import check_replay
    from specloop.realmodels.streams.runner import StreamRunner
    from specloop.record import Trace
    rec, items = recording
    result = check_replay(rec, target, ["hydra", "opt-hydra"], _config(), prompts=4, verify_cost=COST,
                          make_drafter=lambda spec: _hydra(target, seed=2), out=tmp_path / "check")
    assert result["passed"] is True and result["divergent_prompts"] == []
    for row in result["methods"].values():
        assert row["rounds"] > 0 and row["matching_rounds"] == row["rounds"]
        assert row["tau_replay"] == row["tau_real"]
    # a killed replay resumes to the uninterrupted records (online method: state restored)
    ids = [list(i.ids) for i in items]
    runs = {}
    for name, stop in (("whole", None), ("part", 3)):
        runner = StreamRunner(target, ids, tmp_path / name, _config(), lambda spec: _hydra(target, seed=2),
                              replay=rec, verify_cost=COST)
        runner.run_method("opt-hydra", stop_after=stop)
        if stop is not None:
            StreamRunner(target, ids, tmp_path / name, _config(), lambda spec: _hydra(target, seed=2),
                         replay=rec, verify_cost=COST).run_method("opt-hydra")
        runs[name] = [_key(r) + (r.loss,) for r in Trace.load(tmp_path / name / "opt-hydra" / "rounds.jsonl")]
    assert runs["part"] == runs["whole"]
    with pytest.raises(ValueError, match="other engine"):        # a replay folder is not a decoder folder
        StreamRunner(target, ids, tmp_path / "whole", _config(), lambda spec: _hydra(target, seed=2)
                     ).run_method("opt-hydra")
    with pytest.raises(ValueError, match="background"):
        StreamRunner(target, ids, tmp_path / "bg", _config(background=True), replay=rec, verify_cost=COST)


def test_sub_stream_replays_the_recordings_own_prompts(target, recording, tmp_path):
    from specloop.realmodels.streams.runner import StreamRunner
    from specloop.realmodels.recording import recorded_items
    from specloop.record import Trace
    rec, items = recording
    sub = recorded_items(rec, every=2)
    assert [i.index for i in sub] == [0, 2, 4] and [i.ids for i in sub] == [items[j].ids for j in (0, 2, 4)]
    runner = StreamRunner(target, [list(i.ids) for i in sub], tmp_path, _config(), lambda spec: _ngram(),
                          replay=rec, verify_cost=COST, replay_indices=[i.index for i in sub])
    runner.run_method("hydra")
    got = Trace.load(tmp_path / "hydra" / "rounds.jsonl")
    replay = ReplayDecoder(rec, target, _ngram(), policy=FixedDraftPolicy(3), verify_cost=COST)
    for position, item in enumerate(sub):
        expected = replay.generate(list(item.ids), NEW, stream_index=item.index).trace
        assert [_key(r)[2:] for r in got if r.stream_index == position] == [_key(r)[2:] for r in expected]
    with pytest.raises(ValueError, match="every must be"):
        recorded_items(rec, every=0)
    with pytest.raises(ValueError, match="replay_indices has"):
        StreamRunner(target, [list(i.ids) for i in sub], tmp_path, _config(), replay=rec, replay_indices=[0])


def test_online_replay_on_float32_features_follows_the_decoder_closely(target, tmp_path):
    """With float32 features and top-m probabilities the online learner's training
    signal is the decoder's up to float32 rounding: losses agree to 1e-4, not 2e-2."""
    items = _items(4)
    settings = RecordSettings(target="tiny", dtype="float32", datasets=("a", "b"), split="heldout", order="shift",
                              prompts=len(items), max_new_tokens=NEW, max_prompt_tokens=None, chat_template=False,
                              top_m=VOCAB, layers=(-1,), batch_size=2, shard_size=4, feature_dtype="float32")
    record_stream(target, items, tmp_path, settings, check_prompts=0)
    rec = open_recording(tmp_path)
    runs = [run[:2] for run in _online_runs(target, rec, items)]
    (rows_a, loss_a), (rows_b, loss_b) = runs
    assert rows_a == rows_b
    pairs = [(a, b) for a, b in zip(loss_a, loss_b) if not math.isnan(a)]
    assert len(pairs) > 10 and all(a == pytest.approx(b, rel=1e-4, abs=1e-6) for a, b in pairs)


def test_sparse_targets_depend_only_on_the_top_m_list():
    """What a recording keeps (top-m ids and probabilities) gives the online objective
    the decoder's targets exactly: logits rebuilt from the top-m list (as the replay
    does) and the full logits give the same rows and probabilities."""
    from specloop.realmodels.online.samples import sparse_targets
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 200, generator=gen) * 3
    t2d = torch.full((200,), -1, dtype=torch.long)
    t2d[::3] = torch.arange(len(t2d[::3]))                      # a reduced vocabulary of every third token
    top = torch.softmax(logits, -1).topk(16, dim=-1)
    rebuilt = torch.full_like(logits, -1e30).scatter_(1, top.indices, top.values.log())
    rows_a, probs_a = sparse_targets(logits, t2d, 16)
    rows_b, probs_b = sparse_targets(rebuilt, t2d, 16)
    assert torch.equal(rows_a, rows_b)
    assert torch.allclose(probs_a, probs_b, atol=1e-6)
    assert (rows_a == -1).any() and torch.allclose(probs_a.sum(-1), torch.ones(5))


def _oracle(sequence: list[int]):
    """A drafter proposing the next k tokens of a known sequence (the recorded
    continuation, then the target's own greedy tokens after EOS): drafts that run
    past EOS and are accepted there."""
    from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal

    class Oracle(BaseDrafter):
        name = "oracle"

        def propose(self, request):
            start, k = int(request.ids.numel()), int(request.plan.num_draft_tokens)
            return DraftProposal.chain(sequence[start:start + k] or [0])

    return Oracle()


def test_drafts_accepted_past_eos_replay_as_the_decoder(target, recording):
    """Regression: a draft accepted past the recording's final EOS made the replay's
    feedback index a -1 target row (it crashed at SmolLM2 prompt 7 with EAGLE-3)."""
    from .decoder_util import plain_greedy
    rec, items = recording
    ended = [i for i in items if rec.prompt(i.index)["stop_reason"] == "eos"]
    assert ended, "the fixture needs a prompt whose recording ends at EOS"
    for item in ended:
        recorded = rec.prompt(item.index)["tokens"].tolist()
        sequence = recorded + plain_greedy(target.model, recorded, 6)           # the target's tokens after EOS
        rows = {}
        for kind in ("real", "replay"):
            decoder = (SpeculativeDecoder(target, _oracle(sequence), policy=FixedDraftPolicy(5), eos_token_id=EOS)
                       if kind == "real" else
                       ReplayDecoder(rec, target, _oracle(sequence), policy=FixedDraftPolicy(5), verify_cost=COST))
            result = decoder.generate(list(item.ids), NEW, stream_index=item.index)
            rows[kind] = ([_key(r)[2:6] for r in result.trace], list(result.new_tokens))
        assert rows["replay"] == rows["real"]
        assert rows["real"][1][-1] == EOS


class _VocabTokenizer:
    """What an answer set reads from a tokenizer (vocabulary, template, EOS)."""
    chat_template, eos_token_id = None, EOS

    def get_vocab(self):
        return {f"t{i}": i for i in range(VOCAB)}


def test_a_recording_rebuilt_from_an_answer_set_replays_round_for_round(target, tmp_path):
    """The rebuild's features come from a full-sequence forward, not the recorder's steps:
    the replay of the rebuilt recording still matches the real decoder round for round."""
    import dataclasses

    from specloop.realmodels.answers.answer_set import AnswerSettings
    from specloop.realmodels.answers.rebuild import rebuild_recording
    from specloop.realmodels.answers.run import generate_answer_set
    from specloop.realmodels.streams.replay_check import check_replay
    loaded = dataclasses.replace(target, tokenizer=_VocabTokenizer())
    items = _items(6)
    settings = AnswerSettings(target="tiny", dtype="float32", datasets=("a", "b"), split="heldout", order="shift",
                              prompts=6, max_new_tokens=NEW, max_prompt_tokens=None, chat_template=False,
                              batch_size=3, piece_size=4, torch_threads=1)
    generate_answer_set(loaded, items, tmp_path / "answers", settings)
    rebuild_recording(loaded, tmp_path / "answers", tmp_path / "rec", top_m=VOCAB, batch_size=3, shard_size=4)
    result = check_replay(open_recording(tmp_path / "rec"), target, ["hydra", "opt-hydra"], _config(), prompts=6,
                          verify_cost=COST, make_drafter=lambda spec: _hydra(target, seed=2), out=tmp_path / "check")
    assert result["passed"] is True and result["divergent_prompts"] == []
    for row in result["methods"].values():
        assert row["rounds"] > 0 and row["matching_rounds"] == row["rounds"]


def test_both_decoders_are_target_sides_and_sessions_use_no_private_member(target, recording):
    """The session's needs from the target side are a typed protocol (`TargetSide`;
    `LiveTargetSide` adds the forward) that both decoders implement, and neither session
    reads a private member of its decoder."""
    import ast
    import inspect
    from specloop.realmodels import session as session_module
    from specloop.realmodels.session import LiveTargetSide, TargetSide
    from specloop.realmodels.streams import replay as replay_module
    live = SpeculativeDecoder(target, _ngram(), policy=FixedDraftPolicy(3))
    replay = ReplayDecoder(recording[0], target, _ngram(), policy=FixedDraftPolicy(3), verify_cost=COST)
    assert isinstance(live, LiveTargetSide) and isinstance(replay, TargetSide)
    assert not isinstance(replay, LiveTargetSide)             # a replay never runs the target's forward
    for module in (session_module, replay_module):
        private = [f"{module.__name__}:{node.lineno} .{node.attr}"
                   for node in ast.walk(ast.parse(inspect.getsource(module)))
                   if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                   and isinstance(node.value, (ast.Attribute, ast.Name))
                   and (getattr(node.value, "attr", None) == "decoder" or getattr(node.value, "id", None) == "d")]
        assert private == [], private
