"""The quick report's verdict table: every measured comparison shows its
effect, interval and n, and the summary line counts the three outcomes. The parts'
outputs are constructed here (small, made-up samples on both sides of the claims);
the figures' own verdict functions turn them into claims, as `specloop reproduce`
does, and `write_report` writes the table."""
from __future__ import annotations

import re

import pytest

from specloop.report.parts import PartResult
from specloop.report.writer import VERDICT_COLUMNS, write_report

MEASURED = {"online_beats_frozen_stream", "online_tau_gain_20pct", "tree_ngram_vs_hf_prompt_lookup_float32",
            "tree_ngram_vs_hf_prompt_lookup_bfloat16", "ltd_beats_best_static_sim", "ltd_cotraining_helps_sim",
            "ltd_beats_best_static_real", "ltd_cotraining_helps_real", "ltd_fine_tuning_helps_transfer",
            "feedback_beats_fixed_draft", "ensemble_vs_ogd_nonstationary"}


def _stream_claims() -> list[dict]:
    from specloop.figures.online_stream import _claims, _rows_from_stream_json
    from specloop.stats import paired_gain
    frozen = [{"index": i, "rounds": 10, "tokens": t} for i, t in enumerate((14, 15, 13, 16, 14, 15))]
    online = [{"index": i, "rounds": 10, "tokens": t} for i, t in enumerate((15, 15, 13, 16, 15, 15))]
    data = {"methods": {"hydra": {"mean_accepted_length": 1.43, "per_chunk": [1.4, 1.45, 1.44]},
                        "opt-hydra": {"mean_accepted_length": 1.45, "per_chunk": [1.42, 1.46, 1.47],
                                      "vs_frozen": {"frozen": "hydra", **paired_gain(frozen, online)}}}}
    return _claims(_rows_from_stream_json(data), data)


def _speedup_claims() -> list[dict]:
    from specloop.figures.speedup_table import _claims
    rows = []
    for dtype, tree_rates in (("float32", [[40.0, 38.0], [41.0, 37.0]]), ("bfloat16", [[30.0, 31.0], [29.0, 30.5]])):
        for method, rates in (("hf-greedy", [[20.0, 19.0], [20.5, 19.5]]), ("hf-prompt-lookup-10", [[25.0, 26.0], [25.5, 25.0]]),
                              ("specloop-ngram-tree", tree_rates)):
            tps = sum(map(sum, rates)) / 4
            rows.append({"method": method, "dtype": dtype, "prompts": 2, "tokens_per_s": tps, "speedup": tps / 20.0,
                         "speedup_vs_prompt_lookup": tps / 25.0, "identical_to_greedy": None,
                         "tokens_per_s_per_prompt": rates})
    return _claims(rows)


def _ltd_row(config: str, tokens_per_s: list[float] | None = None, seconds: list[float] | None = None) -> dict:
    row = {"config": config, "mean_accepted_length": 2.0, "tokens_per_s": 30.0, "speedup_vs_best_static": 1.0,
           "mean_depth": 3.0, "mean_verify_size": 12.0}
    if tokens_per_s:
        row["tokens_per_s_per_episode"] = tokens_per_s
    if seconds:
        row.update(pair_seconds=seconds, paired_speedup=1.0, paired_speedup_se=0.01)
    return row


def _ltd_sim_claims() -> list[dict]:
    from specloop.figures.ltd import _claims
    result = {"best_static": {"depth": 3, "verify_size": 12}, "rows": [
        _ltd_row("static D=3 V=12 (grid best)", [30.0, 31.0, 29.0, 30.5]),
        _ltd_row("LTD (co-trained)", [33.0, 33.5, 31.5, 33.0]),
        _ltd_row("independent (not co-trained)", [32.0, 34.0, 31.0, 33.5])]}
    return _claims(result)


def _ltd_real_claims() -> list[dict]:
    from specloop.figures.ltd_real import FINE_TUNED, SIM_POLICY, _claims, _table
    labels = {"static D=3 V=12 (grid best)": 1.0, "LTD (co-trained)": 0.9, "independent (not co-trained)": 0.903,
              SIM_POLICY: 1.0, f"LTD fine-tuned on the real decoder ({FINE_TUNED})": 0.97}
    prompt = (1.0, 1.3, 0.8, 1.1, 1.0, 1.3, 0.8, 1.1)       # 4 prompts x 2 passes; +-0.5 % noise per row
    real = {"rows": [_ltd_row(label, seconds=[f * p * (1 + 0.005 * ((i + k) % 3 - 1)) for i, p in enumerate(prompt)])
                     for k, (label, f) in enumerate(labels.items())]}
    replay = {"rows": [_ltd_row(label) for label in labels]}
    return _claims(_table(replay, real), real)


def _regret_claims() -> list[dict]:
    from specloop.figures.regret import _claims
    rows = []
    for scenario in ("stationary", "piecewise"):
        for learner, speedups, regrets in (("fixed", [1.50, 1.52, 1.49], [60.0, 61.0, 59.0]),
                                           ("ogd", [1.60, 1.63, 1.58], [30.0, 32.0, 29.0]),
                                           ("ensemble", [1.61, 1.62, 1.60], [25.0, 33.0, 27.0])):
            rows.append({"scenario": scenario, "learner": learner, "exponent": 0.5, "predicted_exponent": 0.6,
                         "regret_at_max_T": sum(regrets) / 3, "speedup": sum(speedups) / 3,
                         "speedup_lower_bound": 1.0, "seeds": 3, "speedup_by_seed": speedups,
                         "regret_at_max_T_by_seed": regrets})
    return _claims(rows)


def _results() -> list[PartResult]:
    theory = PartResult("theory", "ok", data={"claims": [
        {"claim": "lemma1", "statement": "exact", "holds": True, "cases": 30, "violations": 0, "worst_ratio": 0.9}]})
    figures = {"online_stream": _stream_claims(), "speedup_table": _speedup_claims(), "ltd": _ltd_sim_claims(),
               "ltd_real": _ltd_real_claims(), "regret": _regret_claims()}
    return [theory] + [PartResult(name, "ok", figure={"title": name, "claims": claims})
                       for name, claims in figures.items()]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _verdict_table(report: str) -> tuple[str, list[dict]]:
    lines = report.splitlines()
    start = lines.index("| " + " | ".join(VERDICT_COLUMNS) + " |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(VERDICT_COLUMNS, _cells(line))))
    summary = next(l for l in lines[:start] if re.match(r"\d+ hold, ", l))
    return summary, rows


def test_every_measured_verdict_shows_effect_interval_and_n(tmp_path):
    path = write_report(tmp_path, _results(), {"cpu_count": 2}, {"quick": True}, 1.0)
    summary, rows = _verdict_table(path.read_text(encoding="utf-8"))
    by_claim = {r["claim"]: r for r in rows}
    assert MEASURED <= set(by_claim)
    for name in MEASURED:
        row = by_claim[name]
        assert re.fullmatch(r"-?\d+\.\d+", row["effect"]), row
        lo, hi = (float(x) for x in re.fullmatch(r"\[(-?[\d.]+), (-?[\d.]+)\]", row["interval"]).groups())
        assert lo <= float(row["effect"]) <= hi, row
        assert int(row["n"]) >= 2, row
        assert "95 % interval" in row["statistic"] and "claim: effect" in row["statistic"]
    exact = by_claim["lemma1"]
    assert exact["effect"] == "—" and exact["n"] == "—" and exact["verdict"] == "holds"
    counts = {v: sum(r["verdict"].strip("*") == v for r in rows) for v in ("holds", "does not hold", "undecided")}
    assert summary.startswith(f"{counts['holds']} hold, {counts['does not hold']} do not hold, "
                              f"{counts['undecided']} undecided")
    assert all(counts.values())              # the constructed samples reach all three outcomes


@pytest.mark.parametrize("claim, verdict", [
    ("online_beats_frozen_stream", "undecided"),               # +2.3 %, 2 of 6 prompts better
    ("online_tau_gain_20pct", "**does not hold**"),
    ("tree_ngram_vs_hf_prompt_lookup_float32", "holds"),      # ~1.55x on every pair
    ("tree_ngram_vs_hf_prompt_lookup_bfloat16", "**does not hold**"),
    ("ltd_beats_best_static_sim", "holds"),
    ("ltd_cotraining_helps_sim", "undecided"),
    ("ltd_beats_best_static_real", "holds"),
    ("ltd_cotraining_helps_real", "undecided"),                 # 1.003x +- 1 %
    ("ltd_fine_tuning_helps_transfer", "holds"),                # 1.031x +- 1 %
    ("feedback_beats_fixed_draft", "holds"),
    ("ensemble_vs_ogd_nonstationary", "undecided"),            # -2 [-9.5, 5.5] over 3 seeds
])
def test_constructed_samples_get_the_rule_verdicts(tmp_path, claim, verdict):
    path = write_report(tmp_path, _results(), {}, {}, 1.0)
    _, rows = _verdict_table(path.read_text(encoding="utf-8"))
    assert {r["claim"]: r["verdict"] for r in rows}[claim] == verdict


WALL_CLOCK = {"tree_ngram_vs_hf_prompt_lookup_float32", "tree_ngram_vs_hf_prompt_lookup_bfloat16",
              "ltd_beats_best_static_real", "ltd_cotraining_helps_real", "ltd_fine_tuning_helps_transfer"}


def _loaded(results: list[PartResult], names: set[str], mean: float) -> list[PartResult]:
    from specloop.report.machine import load_summary
    for res in results:
        res.load = load_summary([mean, mean + 0.4], mean, mean + 0.4, 2) if res.name in names else {}
    return results


def test_wall_clock_verdicts_of_a_part_under_load_are_marked_and_counted(tmp_path):
    results = _loaded(_results(), {"speedup_table", "ltd_real", "ltd", "regret"}, mean=3.0)
    path = write_report(tmp_path, results, {}, {}, 1.0)
    text = path.read_text(encoding="utf-8")
    summary, rows = _verdict_table(text)
    by_claim = {r["claim"]: r for r in rows}
    for name, row in by_claim.items():
        marked = row["verdict"].endswith("(under load)")
        assert marked == (name in WALL_CLOCK), row            # sim / tau / regret claims are not timings
        assert ("measured under load: mean 1-minute load 3.2" in row["evidence"]) == marked
    # the marked verdicts keep the rule's outcome (only the mark is added)
    assert by_claim["tree_ngram_vs_hf_prompt_lookup_float32"]["verdict"] == "holds (under load)"
    assert by_claim["tree_ngram_vs_hf_prompt_lookup_bfloat16"]["verdict"] == "**does not hold** (under load)"
    assert "5 wall-clock verdicts (3 / 1 / 1) were measured under load" in summary
    assert "3.2 / 3.4 **under load**" in text                   # the Parts table's load cell


def test_a_quiet_part_marks_nothing(tmp_path):
    results = _loaded(_results(), {"speedup_table", "ltd_real"}, mean=1.9)   # its own two threads
    summary, rows = _verdict_table(write_report(tmp_path, results, {}, {}, 1.0).read_text(encoding="utf-8"))
    assert not any("under load" in r["verdict"] for r in rows) and "under load" not in summary


def test_load_monitor_samples_the_part_and_applies_the_rule(monkeypatch):
    import time
    from specloop.report import machine
    loads = iter([1.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(machine, "cores", lambda: 2)
    with machine.LoadMonitor(interval_s=0.05) as monitor:
        time.sleep(0.12)
    summary = monitor.summary
    assert summary["start"] == 1.0 and summary["samples"] >= 3 and summary["max"] == summary["end"]
    assert summary["under_load"] is (summary["mean"] > machine.UNDER_LOAD_FACTOR * 2)
    assert machine.load_summary([2.4, 2.6], 2.4, 2.6, 2)["under_load"] is False      # 2.5 = 1.25 x 2
    assert machine.load_summary([2.6, 2.6], 2.6, 2.6, 2)["under_load"] is True
    assert machine.load_summary([], None, None, 2) == {"start": None, "end": None, "mean": None, "max": None,
                                                       "samples": 0, "cores": 2, "under_load": False}
    with pytest.raises(ValueError, match="interval_s"):
        machine.LoadMonitor(interval_s=0)


def test_run_part_stores_the_load_of_its_computation(tmp_path):
    from specloop.report.parts import Part, load_done, run_part
    part = Part("probe", "probe", lambda part_dir, quick: (None, {"x": 1}))
    result = run_part(part, tmp_path)
    assert result.status == "ok" and result.load["samples"] >= 1 and "under_load" in result.load
    assert load_done(tmp_path / "probe", False).load == result.load          # kept in result.json
