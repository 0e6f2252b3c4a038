"""`specloop.figures.online_substream`: the grid replay over a tiny recording (frozen and
online Hydra heads built here, the tiny target), the claim row and its verdict from the
paired interval, the per-chunk rows, the part's registration, and the missing answer set."""
from __future__ import annotations

import dataclasses
import math

import pytest

from specloop.figures import FIGURES, FigureUnavailable
from specloop.figures import online_substream as sub

LOADER = "tests.realmodels.scale_util:tiny_target"


@pytest.fixture(autouse=True)
def one_thread():
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _drafts(folder):
    """A Hydra head for the tiny target, saved as ``folder/hydra`` (what ``drafts`` reads)."""
    import torch

    from specloop.realmodels.heads.common import save_draft
    from specloop.realmodels.heads.hydra import build_hydra
    from tests.realmodels.scale_util import VOCAB, tiny_target
    torch.manual_seed(2)
    heads = build_hydra(tiny_target().model, torch.arange(VOCAB), num_heads=3)
    save_draft(heads.state_dict(), {"architecture": dataclasses.asdict(heads.config)}, "tiny", "hydra",
               folder=folder / "hydra")
    return folder


def test_run_substream_replays_both_methods_and_the_claim_row_has_its_numbers(tmp_path):
    from tests.realmodels.scale_util import record_tiny
    record_tiny(tmp_path / "rec")
    online = {**sub.ONLINE_CONFIG, "lr": 0.05, "top_m": 8}         # the tiny recording keeps top-8
    summary = sub.run_substream(tmp_path / "rec", tmp_path / "grid", chunk=4, k=3, drafts=str(_drafts(tmp_path / "d")),
                                online=online, target_loader=LOADER, backend="serial")
    assert not summary["failed"] and summary["stopped_early"] == []
    assert summary["prompts"] == 8 and summary["chunk"] == 4 and summary["stream"] == ["a"] * 4 + ["b"] * 4
    assert set(summary["methods"]) == {sub.FROZEN, sub.ONLINE}
    vs = summary["methods"][sub.ONLINE]["vs_frozen"]
    assert vs["frozen"] == sub.FROZEN and vs["n"] == 8
    claim = sub.substream_claim(summary)
    assert claim["claim"] == sub.CLAIM and claim["measured"] and claim["n"] == 8
    assert claim["effect"] == pytest.approx(1 + vs["gain"])
    assert claim["interval"] == pytest.approx([1 + vs["gain_ci"][0], 1 + vs["gain_ci"][1]])
    assert claim["verdict"] in ("holds", "does not hold", "undecided")
    rows = sub.chunk_rows(summary)
    assert [(r["method"], r["chunk"], r["datasets"]) for r in rows if r["method"] == sub.ONLINE] == \
        [(sub.ONLINE, 0, "a"), (sub.ONLINE, 1, "b")]
    assert {r["online"] for r in rows if r["method"] == sub.FROZEN} == {False}
    table = {r["method"]: r for r in sub._table(summary)}
    assert set(table["Opt-Hydra"]) >= {"mean_accepted_length", "speedup", "speedup_with_training", "tau_a",
                                       "tau_b", "gain_vs_frozen", "gain_ci_low", "gain_ci_high", "n"}
    sub._clean(tmp_path / "rec", tmp_path / "grid")
    assert not (tmp_path / "rec").exists() and not list((tmp_path / "grid").rglob("*.pt"))
    assert list((tmp_path / "grid").rglob("rounds.jsonl"))


def _summary(gain: float, ci: tuple[float, float], n: int = 40) -> dict:
    vs = {"frozen": sub.FROZEN, "n": n, "gain": gain, "gain_ci": list(ci), "better": 30, "worse": 8,
          "wilcoxon_p": 0.001, "per_domain": {"sharegpt-code": {"gain": gain, "n": n // 2}}}
    return {"methods": {sub.FROZEN: {"mean_accepted_length": 2.0},
                        sub.ONLINE: {"mean_accepted_length": 2.0 * (1 + gain), "vs_frozen": vs}}, "failed": {}}


@pytest.mark.parametrize("gain, ci, verdict", [(0.08, (0.03, 0.13), "holds"),
                                               (-0.06, (-0.10, -0.02), "does not hold"),
                                               (0.02, (-0.01, 0.05), "undecided")])
def test_the_verdict_follows_the_interval(gain, ci, verdict):
    claim = sub.substream_claim(_summary(gain, ci))
    assert claim["verdict"] == verdict and claim["n"] == 40
    assert claim["effect"] == pytest.approx(1 + gain)
    assert claim["interval"] == pytest.approx([1 + ci[0], 1 + ci[1]])
    assert "30 prompts better, 8 worse" in claim["evidence"] and "sharegpt-code" in claim["evidence"]


def test_no_paired_comparison_is_undecided_and_the_report_reads_the_row():
    from specloop.report.parts import PartResult
    from specloop.report.writer import collect_claims
    missing = sub.substream_claim({"methods": {sub.FROZEN: {}}, "failed": {"opt-hydra-s0": "boom"}})
    assert missing["verdict"] == "undecided" and missing["n"] == 0 and "boom" in missing["evidence"]
    one = sub.substream_claim(_summary(0.1, (math.nan, math.nan), n=1))
    assert one["verdict"] == "undecided"
    held = sub.substream_claim(_summary(0.08, (0.03, 0.13)))
    rows = collect_claims([PartResult(sub.NAME, "ok", figure={"claims": [held]})])
    assert len(rows) == 1 and rows[0]["verdict"] == "holds" and rows[0]["n"] == 40
    assert rows[0]["effect"] == pytest.approx(1.08)


def test_a_missing_answer_set_is_unavailable(tmp_path):
    with pytest.raises(FigureUnavailable, match="sharegpt-heldout-1200"):
        sub.answer_set_dir(tmp_path)
    assert (sub.answer_set_dir() / "manifest.json").is_file()      # the repository's committed copy


def test_main_reports_a_missing_answer_set_as_unavailable(tmp_path, monkeypatch):
    def absent(root=None):
        raise FigureUnavailable("the held-out answer set sharegpt-heldout-1200 is not at /nowhere")
    monkeypatch.setattr(sub, "answer_set_dir", absent)
    with pytest.raises(FigureUnavailable, match="not at"):
        sub.main(tmp_path, quick=True)


def test_the_part_is_registered_after_online_stream():
    from specloop.report.parts import PARTS
    names = [p.name for p in PARTS]
    assert names[names.index("online_stream") + 1] == sub.NAME
    assert next(p for p in PARTS if p.name == sub.NAME).real
    assert FIGURES[sub.NAME][0] == "specloop.figures.online_substream"


def _committed(root, folder, gain, ci, n):
    import json
    path = root / folder
    path.mkdir(parents=True)
    vs = {"frozen": "hydra", "n": n, "gain": gain, "gain_ci": ci, "better": 1, "worse": 0, "wilcoxon_p": 0.1}
    (path / "summary.json").write_text(json.dumps({sub.PROTOCOL: {"methods": {sub.ONLINE: {"vs_frozen": vs}}}}))


def test_the_largest_committed_replay_gives_the_second_claim(tmp_path):
    assert sub.committed_claim(tmp_path) is None
    _committed(tmp_path, sub.COMMITTED[1], 0.036, [0.014, 0.059], 300)
    claim = sub.committed_claim(tmp_path)
    assert claim["claim"] == sub.COMMITTED_CLAIM and claim["verdict"] == "holds" and claim["n"] == 300
    assert sub.COMMITTED[1] in claim["statement"]
    _committed(tmp_path, sub.COMMITTED[0], 0.01, [-0.01, 0.03], 1200)     # the whole stream wins, undecided
    live = {"interval": [0.987, 1.075]}
    claim = sub.committed_claim(tmp_path, live)
    assert claim["n"] == 1200 and claim["verdict"] == "undecided" and "consistent" in claim["evidence"]
    assert "NOT consistent" in sub.committed_claim(tmp_path, {"interval": [1.05, 1.2]})["evidence"]
