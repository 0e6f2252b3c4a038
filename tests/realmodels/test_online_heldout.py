"""`specloop.realmodels.streams.online_heldout` and ``StreamRunner(snapshot_chunks=True)``: per-chunk
snapshots (once per chunk, only with the flag, records unchanged, resume-safe), the
held-out losses against a plain per-position loop, the before / after snapshots of each
row, and the in-domain offline reference (tiny random Llama target recorded here)."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from specloop.data.streams import StreamItem
from specloop.realmodels.streams.online_heldout import (apply_snapshot, evaluate_draft, heldout_set, load_snapshot,
                                                        offline_rows, online_heldout)
from specloop.realmodels.streams.runner import StreamConfig, StreamRunner, chunk_snapshot_path
from specloop.realmodels.recording import RecordSettings, open_recording
from specloop.realmodels.streams.record import record_stream
from specloop.record import Trace
from specloop.theory.speedup import VerifyCostTable

from .decoder_util import as_loaded, one_thread, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, EOS, NEW = 24, 23, 20
COST = VerifyCostTable([1, 8], [0.01, 0.02])
_TIMED = ("draft_time", "update_time", "verify_time")   # wall clock (the replay prices verify from it too)


@pytest.fixture(scope="module")
def target():
    return as_loaded(tiny_llama(vocab=VOCAB, layers=3, hidden=16, max_positions=128, init_range=0.9, seed=5))


@pytest.fixture(scope="module")
def recording(target, tmp_path_factory):
    """Six prompts, two distinct ones repeated: chunks of 2 repeat each other's tokens."""
    gen = torch.Generator().manual_seed(7)
    pair = [tuple(torch.randint(0, EOS, (3 + 2 * j,), generator=gen).tolist()) for j in range(2)]
    items = [StreamItem(i, "a" if i < 4 else "b", f"p{i}", "", pair[i % 2]) for i in range(6)]
    folder = tmp_path_factory.mktemp("rec")
    settings = RecordSettings(target="tiny", dtype="float32", datasets=("a", "b"), split="heldout", order="shift",
                              prompts=len(items), max_new_tokens=NEW, max_prompt_tokens=None, chat_template=False,
                              top_m=8, layers=(-1,), batch_size=3, shard_size=4)
    record_stream(target.model, items, folder, settings, check_prompts=0)
    return open_recording(folder), items


def _hydra(target, seed: int = 2):
    from specloop.realmodels.heads.head_drafting import HydraDrafter
    from specloop.realmodels.heads.hydra import build_hydra
    torch.manual_seed(seed)
    return HydraDrafter(build_hydra(target.model, torch.arange(VOCAB), num_heads=3))


def _runner(target, rec, items, out, chunk: int, snapshot: bool, mode: str = "round"):
    config = StreamConfig(chunk=chunk, max_new_tokens=NEW, num_draft_tokens=3,
                          online={"mode": mode, "lr": 0.05, "top_m": 8}, seed=0)
    return StreamRunner(target, [list(i.ids) for i in items], out, config, lambda spec: _hydra(target),
                        replay=rec, verify_cost=COST, snapshot_chunks=snapshot)


def _records(path) -> list[str]:
    """Each record without its timings, as JSON text (NaN losses compare equal)."""
    return [json.dumps({k: v for k, v in dataclasses.asdict(r).items() if k not in _TIMED}) for r in Trace.load(path)]


def test_snapshots_once_per_chunk_only_with_the_flag_and_resume_safe(target, recording, tmp_path):
    rec, items = recording
    for name, snapshot, stop in (("off", False, None), ("on", True, None), ("resumed", True, 3)):
        _runner(target, rec, items, tmp_path / name, 4, snapshot).run_method("opt-hydra", stop_after=stop)
        if stop is not None:
            _runner(target, rec, items, tmp_path / name, 4, snapshot).run_method("opt-hydra")
        _runner(target, rec, items, tmp_path / name, 4, snapshot).run_method("hydra")
    records = {n: _records(tmp_path / n / "opt-hydra" / "rounds.jsonl") for n in ("off", "on", "resumed")}
    assert records["on"] == records["off"] == records["resumed"] and records["on"]
    assert (tmp_path / "on/opt-hydra/chunks.json").read_text().count("chunk") == 2
    # 6 prompts in chunks of 4: a full chunk and the stream's last, partial one
    assert sorted(p.name for p in (tmp_path / "on" / "opt-hydra").glob("chunk-*")) == ["chunk-000.pt", "chunk-001.pt"]
    assert not list((tmp_path / "off").rglob("chunk-*.pt")) and not list((tmp_path / "on" / "hydra").glob("chunk-*"))
    state = torch.load(tmp_path / "on/opt-hydra/state.pt", weights_only=False)
    first, last = load_snapshot(tmp_path / "on/opt-hydra", 0), load_snapshot(tmp_path / "on/opt-hydra", 1)
    assert (first["chunk"], first["prompts_done"], first["recorded_indices"]) == (0, 4, [0, 1, 2, 3])
    assert (last["prompts_done"], last["recorded_indices"]) == (6, [4, 5])
    assert all(torch.equal(a, b) for a, b in zip(last["params"], state["adapter"]["params"]))
    assert not all(torch.equal(a, b) for a, b in zip(first["params"], last["params"]))
    for c in (0, 1):                                 # the resumed run wrote the same files
        again = load_snapshot(tmp_path / "resumed/opt-hydra", c)
        assert all(torch.equal(a, b) for a, b in zip(again["params"], load_snapshot(tmp_path / "on/opt-hydra", c)["params"]))
    assert chunk_snapshot_path(tmp_path, 7).name == "chunk-007.pt"
    with pytest.raises(FileNotFoundError, match="--snapshot-chunks"):
        load_snapshot(tmp_path / "off/opt-hydra", 0)


def _plain(drafter, rec, index: int, depth: int, top_m: int) -> tuple[float, float, float, int]:
    """(ce_greedy, ce_topm, top1, anchors) of one prompt by a loop over anchors, head by head."""
    p = rec.prompt(index)
    x, length = [int(t) for t in p["tokens"]], p["prompt_length"]
    ce, soft, hits, n = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for t in range(max(0, length - 2), len(x) - 1 - depth):
            state = torch.tensor(p["hidden"][-1][t], dtype=torch.float32)[None]
            for j in range(depth):
                state, logits = drafter.expand(state, torch.tensor([x[t + 1 + j]]), j)
            logp = torch.log_softmax(logits[0].float(), -1)            # draft vocabulary = target ids here
            ce -= float(logp[x[t + depth + 1]])
            ids, probs = p["topm_ids"][t + depth, :top_m], p["topm_probs"][t + depth, :top_m].astype("float64")
            soft -= sum(pr / probs.sum() * float(logp[i]) for i, pr in zip(ids, probs))
            hits += int(int(logp.argmax()) == x[t + depth + 1])
            n += 1
    return ce, soft, hits, n


def test_heldout_losses_equal_a_plain_loop(target, recording):
    rec, _ = recording
    drafter = _hydra(target)
    got = evaluate_draft(drafter, heldout_set(rec, [1, 2], 3, top_m=5))
    for depth in (1, 2, 3):
        parts = [_plain(drafter, rec, i, depth, 5) for i in (1, 2)]
        n = sum(q[3] for q in parts)
        row = got[str(depth)]
        assert row["positions"] == n > 0 and row["greedy_in_vocab"] == 1.0
        assert row["ce_greedy"] == pytest.approx(sum(q[0] for q in parts) / n, rel=1e-5)
        assert row["ce_topm"] == pytest.approx(sum(q[1] for q in parts) / n, rel=1e-4)
        assert row["top1"] == pytest.approx(sum(q[2] for q in parts) / n)
    assert got["1"]["positions"] == got["3"]["positions"] + 4       # two anchors fewer per prompt per depth


def _memorise(drafter, rec, indices, steps: int = 150) -> list[torch.Tensor]:
    """Parameters after fitting the greedy tokens of ``indices`` (teacher-forced, every depth)."""
    held = heldout_set(rec, indices, drafter.max_depth)
    params = drafter.parameters()
    opt = torch.optim.Adam(params, lr=0.03)
    with torch.enable_grad():
        for _ in range(steps):
            loss = sum(torch.nn.functional.cross_entropy(drafter.unrolled_logits(part["h"], part["tokens"])[-1],
                                                         part["greedy"]) for part in held.depths.values())
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.detach().clone() for p in params]


def test_rows_use_the_snapshots_before_and_after_each_chunk(target, recording, tmp_path):
    rec, items = recording
    _runner(target, rec, items, tmp_path, 2, True, mode="chunk").run_method("opt-hydra")
    _runner(target, rec, items, tmp_path, 2, False).run_method("hydra")
    folder = tmp_path / "opt-hydra"
    frozen = [p.detach().clone() for p in _hydra(target).parameters()]
    # snapshot 0 memorises chunk 0's tokens (repeated by chunks 1 and 2); snapshot 1 is the frozen draft again
    learned = _memorise(_hydra(target), rec, [0, 1])
    for c, params in ((0, learned), (1, frozen)):
        snap = load_snapshot(folder, c)
        torch.save({**snap, "params": params}, chunk_snapshot_path(folder, c))
    drafter = _hydra(target)
    table = online_heldout(rec, tmp_path, "opt-hydra", drafter, frozen="hydra", top_m=8)
    assert all(torch.equal(a, b) for a, b in zip(drafter.parameters(), frozen))      # restored
    first, second = table["chunks"]
    assert (first["heldout_chunk"], first["heldout_prompts"], second["heldout_prompts"]) == (1, [2, 3], [4, 5])
    assert first["before"] == first["frozen"] and second["after"] == second["frozen"]
    for depth in ("1", "2", "3"):
        assert first["after"][depth]["ce_greedy"] < 0.5 * first["frozen"][depth]["ce_greedy"]
        assert first["after"][depth]["top1"] > first["frozen"][depth]["top1"]
    for depth, row in second["before"].items():      # chunk 2 repeats chunk 1's prompts (features to rounding)
        assert row == pytest.approx(first["after"][depth], rel=1e-4)
    # tau and positions seen from the records
    summary = [c["mean_accepted_length"] for c in json.loads((folder / "chunks.json").read_text())]
    assert [first["tau"], second["tau"]] == pytest.approx(summary[:2])
    trace = Trace.load(folder / "rounds.jsonl")
    seen = sum(min(r.tokens_per_round, 3) for r in trace if r.stream_index < 4 and math.isfinite(r.loss))
    assert second["positions_seen"] == seen > first["positions_seen"] > 0
    assert first["tau_frozen"] is not None and set(table["per_domain"]) == {"a", "b"}
    assert table["per_domain"]["a"]["last_chunk"] == 1
    with pytest.raises(ValueError, match="frozen method"):
        online_heldout(rec, tmp_path, "hydra", drafter)
    with pytest.raises(ValueError, match="do not match"):
        apply_snapshot(drafter, frozen[:-1])


def test_offline_reference_trains_on_the_served_prompts(target, recording, tmp_path):
    rec, items = recording
    _runner(target, rec, items[:4], tmp_path, 2, True, mode="chunk").run_method("opt-hydra")   # domain a only
    drafter = _hydra(target)
    before = [p.detach().clone() for p in drafter.parameters()]
    table = online_heldout(rec, tmp_path, "opt-hydra", drafter)
    # the last served chunk is measured on the recording's next prompts
    assert [(c["heldout_prompts"], c["heldout_served"]) for c in table["chunks"]] == [([2, 3], True), ([4, 5], False)]
    rows = offline_rows(table, rec, target.model, drafter, epochs=40, batch_size=16, lr=3e-2, max_seconds=30)
    assert [r["domain"] for r in rows] == ["a"]
    row = rows[0]
    assert (row["through_chunk"], row["heldout_chunk"], row["train_prompts"]) == (1, 2, 4)
    assert row["train_positions"] > 0 and row["steps"] > 1
    assert row["offline"]["1"]["ce_greedy"] < row["frozen"]["1"]["ce_greedy"]
    assert all(torch.equal(a, b) for a, b in zip(drafter.parameters(), before))
    with pytest.raises(ValueError, match="positive"):
        offline_rows(table, rec, target.model, drafter, epochs=0)


def test_cli_flag_reaches_stream_and_scale(recording):
    from specloop.cli import build_parser
    from specloop.cli.stream_cmd import _stream_run
    from specloop.cli.stream_scale_cmd import _grid
    rec, _ = recording
    for extra, want in (([], False), (["--snapshot-chunks"], True)):
        assert _stream_run(build_parser().parse_args(["stream", "--max-new-tokens", "8", *extra])).snapshot_chunks is want
        _, settings, _ = _grid(build_parser().parse_args(["stream", "scale", str(rec.folder), "--method", "opt-hydra",
                                                          *extra]))
        assert settings.snapshot_chunks is want
