"""The Table 1 figure: rows and claims read from committed stream-scale summaries
(hand-made ones here, then the repository's own), the plot, and its report part."""
from __future__ import annotations

import json

import pytest

from specloop.figures import table1


def _summary(gain, lo, hi, n, per_domain=None):
    vs = {"frozen": "hydra", "n": n, "gain": gain, "gain_ci": [lo, hi],
          "per_domain": {f"sharegpt-{d}": {"gain": g} for d, g in (per_domain or {}).items()}}
    return {"protocol": "in-domain", "methods": {
        "hydra": {"label": "Hydra", "mean_accepted_length": 1.7, "seeds": [1.7], "tau_vs_T": {"10": 1.7}},
        "opt-hydra": {"label": "Opt-Hydra", "mean_accepted_length": 1.7 * (1 + gain), "seeds": [1.8, 1.8],
                      "speedup": 1.03, "speedup_with_training": 0.6, "update_seconds": 7200.0,
                      "tau_vs_T": {"10": 1.8}, "vs_frozen": vs}}}


def _write(root, folder, summary, variant=""):
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / folder / f"summary-in-domain{variant}.json").write_text(json.dumps(summary))


def test_rows_and_claims_take_the_largest_run(tmp_path):
    _write(tmp_path, "stream_scale_small", _summary(0.30, 0.01, 0.60, 20))
    _write(tmp_path, "stream_scale_big", _summary(0.05, 0.03, 0.07, 400, {"code": 0.08, "writing": 0.04}))
    (tmp_path / "other").mkdir()                                  # not a stream-scale run: ignored
    rows = table1.table_rows(tmp_path)
    assert [r["prompts"] for r in rows] == [20, 400]
    big = rows[1]
    assert big["run"] == "stream_scale_big" and big["seeds"] == 2 and big["update_hours"] == pytest.approx(2.0)
    assert big["gain_code"] == 0.08 and big["gain_chat"] is None and big["frozen"] == "Hydra"
    claims = {c["claim"]: c for c in table1.claims(rows)}
    assert set(claims) == {"table1_in-domain_opt-hydra_beats_frozen", "table1_in-domain_opt-hydra_paper_gain"}
    beats, paper = claims.values()
    assert beats["n"] == 400 and beats["verdict"] == "holds"           # [1.03, 1.07] above 1
    assert paper["verdict"] == "does not hold"                         # ... and below 1.2
    assert beats["evidence"].startswith("results/stream_scale_big: 400 prompts, 2 seed(s); per domain +8.0 % / +4.0 % / -")


def test_the_committed_results_give_the_whole_stream_verdict(tmp_path):
    rows = table1.table_rows(table1.results_root())
    whole = [r for r in rows if r["protocol"] == "in-domain" and r["method"] == "Opt-Hydra" and r["prompts"] == 1200]
    assert whole, "the committed whole-stream in-domain run is missing"
    claims = {c["claim"]: c for c in table1.claims(rows)}
    assert claims["table1_in-domain_opt-hydra_beats_frozen"]["n"] == 1200
    assert claims["table1_in-domain_opt-hydra_beats_frozen"]["verdict"] == "holds"
    result = table1.main(tmp_path)
    assert (tmp_path / "table1.csv").is_file() and (tmp_path / "table1.png").is_file()
    assert len(result.table) == len(rows) and result.numbers["largest_prompts"] == 1200


def test_no_summaries_is_unavailable(tmp_path, monkeypatch):
    from specloop.figures import FigureUnavailable
    monkeypatch.setattr(table1, "results_root", lambda: tmp_path)
    with pytest.raises(FigureUnavailable, match="no committed stream-scale summary"):
        table1.main(tmp_path / "out")


def test_it_is_a_report_part_that_runs_no_model():
    from specloop.report.parts import PARTS
    part = next(p for p in PARTS if p.name == "table1")
    assert not part.real


def test_variants_are_named_and_copied_runs_kept_once(tmp_path):
    _write(tmp_path, "stream_scale_a", _summary(0.05, 0.03, 0.07, 400))
    _write(tmp_path, "stream_scale_b", _summary(0.05, 0.03, 0.07, 400))              # a copy of a
    _write(tmp_path, "stream_scale_a", _summary(0.02, 0.00, 0.04, 400), variant="-update-every-4")
    rows = table1.table_rows(tmp_path)
    assert [(r["run"], r["also_in"]) for r in rows] == [("stream_scale_a", "stream_scale_b"),
                                                         ("stream_scale_a:update-every-4", "")]
