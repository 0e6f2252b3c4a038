"""`specloop.realmodels.streams.scale` (the online-at-scale grid) and its results: the
job plan, equal records from the serial and the process-pool backends on a tiny
recording, resume, the aggregation and the targets' verdicts, the CLI's refusals."""
from __future__ import annotations

import math

import pytest

from specloop.realmodels.streams.scale import (GridSettings, ScaleJob, baseline_job, paper_chunk, plan_jobs,
                                               run_grid)
from specloop.realmodels.streams.scale_results import protocol_summary, scale_targets, t_grid, write_results


def test_plan_jobs_seeds_learning_rates_and_paper_chunks():
    jobs = plan_jobs({"off-domain": None, "paper": "drafts"}, ["hydra", "opt-hydra", "eagle3", "ogd-eagle3"],
                     seeds=3, lr_grid={"ogd-eagle3": [1e-4, 1e-3]})
    names = {(j.protocol, j.name) for j in jobs}
    assert ("off-domain", "hydra-s0") in names and ("off-domain", "hydra-s1") not in names   # frozen: one seed
    assert {("paper", f"opt-hydra-s{s}") for s in range(3)} <= names
    assert {("paper", "ogd-eagle3-lr0.0001-s0"), ("paper", "ogd-eagle3-lr0.001-s0")} <= names
    assert len(jobs) == 2 * (1 + 3 + 1 + 3 + 2)
    assert {j.chunk for j in jobs if j.method.endswith("hydra")} == {80} == {paper_chunk("opt-hydra")}
    assert {j.chunk for j in jobs if "eagle3" in j.method} == {40}
    assert {j.drafts for j in jobs if j.protocol == "paper"} == {"drafts"}
    with pytest.raises(ValueError, match="seeds"):
        plan_jobs({"p": None}, ["hydra"], seeds=0)
    mixed = plan_jobs({"p": None}, ["hydra", "opt-hydra", "ens-eagle3"], seeds=3, method_seeds={"ens-eagle3": 1})
    assert sorted(j.name for j in mixed) == ["ens-eagle3-s0", "hydra-s0", "opt-hydra-s0", "opt-hydra-s1",
                                             "opt-hydra-s2"]
    with pytest.raises(ValueError, match="seeds"):
        plan_jobs({"p": None}, ["opt-hydra"], method_seeds={"opt-hydra": 0})
    later = plan_jobs({"p": None}, ["hydra", "opt-hydra"], seeds=2, first_seed=1)   # seeds added to a seed-0 run
    assert sorted(j.name for j in later) == ["hydra-s0", "opt-hydra-s1", "opt-hydra-s2"]
    with pytest.raises(ValueError, match="first_seed"):
        plan_jobs({"p": None}, ["opt-hydra"], first_seed=-1)
    with pytest.raises(ValueError, match="learning rates"):
        plan_jobs({"p": None}, ["ogd-hydra"], lr_grid={"ogd-hydra": [0.0]})
    with pytest.raises(ValueError, match="unknown method"):
        plan_jobs({"p": None}, ["hydrant"])
    # a grid for a method --method does not list: its learning-rate jobs alone (they used to be dropped)
    alone = plan_jobs({"p": None}, ["eagle3", "ens-eagle3"], lr_grid={"ogd-eagle3": [1e-3, 2e-3]})
    assert sorted(j.name for j in alone) == ["eagle3-s0", "ens-eagle3-s0", "ogd-eagle3-lr0.001-s0",
                                             "ogd-eagle3-lr0.002-s0"]
    with pytest.raises(ValueError, match="frozen draft"):
        plan_jobs({"p": None}, ["hydra"], lr_grid={"hydra": [1e-3]})


def test_serial_and_process_backends_give_the_same_records_and_resume(tmp_path):
    from tests.realmodels.scale_util import record_tiny
    from specloop.record import Trace
    record_tiny(tmp_path / "rec")
    jobs = [baseline_job(4)] + plan_jobs({"p": None}, ["suffix"], chunk=4)
    runs = {}
    for backend in ("serial", "process"):
        settings = GridSettings(recording=str(tmp_path / "rec"), out=str(tmp_path / backend), every=1,
                                num_draft_tokens=3, target_loader="tests.realmodels.scale_util:tiny_target")
        results = run_grid(jobs, settings, backend=backend, workers=2)
        assert not any(isinstance(v, Exception) for v in results.values()), results
        runs[backend] = {j.name: [(r.stream_index, r.num_draft_tokens, r.accepted_tokens, r.tokens_per_round)
                                  for r in Trace.load(results[j]["folder"] + "/rounds.jsonl")] for j in jobs}
    assert runs["serial"] == runs["process"]
    suffix = runs["serial"]["suffix-s0"]
    assert any(accepted > 0 for _, _, accepted, _ in suffix)
    again = run_grid(jobs, settings, backend="serial")                     # finished jobs: summaries only
    assert again[jobs[1]]["prompts_done"] == 8 and not again[jobs[1]]["stopped_early"]
    import dataclasses
    import time
    late = dataclasses.replace(settings, out=str(tmp_path / "late"), deadline=time.time() - 1)
    stopped = run_grid(jobs, late, backend="serial")                       # out of time before any prompt
    assert all(v["stopped_early"] and v["prompts_done"] == 0 for v in stopped.values())
    with pytest.raises(ValueError, match="backend"):
        run_grid(jobs, settings, backend="slurm")


def _summary(taus_per_prompt: list[float], tps: float = 10.0, chunk: int = 2) -> dict:
    prompts = [{"index": i, "rounds": 10, "tokens": round(10 * t)} for i, t in enumerate(taus_per_prompt)]
    tokens = sum(p["tokens"] for p in prompts)
    chunks = [{"mean_accepted_length": sum(p["tokens"] for p in prompts[c:c + chunk]) / (10 * len(prompts[c:c + chunk]))}
              for c in range(0, len(prompts), chunk)]
    return {"mean_accepted_length": tokens / (10 * len(prompts)), "tokens_per_s": tps,
            "tokens_per_s_with_training": tps * 0.9, "update_seconds": 1.0, "chunks": chunks, "prompts": prompts}


def test_protocol_summary_and_targets_are_computed_from_the_records(tmp_path):
    domains = ["a"] * 4 + ["b"] * 4
    frozen = [1.5, 1.6, 1.4, 1.5, 1.2, 1.3, 1.2, 1.1]
    results = {ScaleJob("p", "hydra"): _summary(frozen, 12.0),
               ScaleJob("p", "osd-hydra", seed=0): _summary([t * 1.05 for t in frozen], 12.0),
               ScaleJob("p", "opt-hydra", seed=0): _summary([t * 1.3 for t in frozen], 14.0),
               ScaleJob("p", "opt-hydra", seed=1): _summary([t * 1.2 for t in frozen], 14.0),
               ScaleJob("p", "ogd-hydra", lr=1e-3): _summary([t * 1.1 for t in frozen]),
               ScaleJob("p", "ens-hydra", seed=0): _summary([t * 1.02 for t in frozen]),
               ScaleJob("p", "eagle3"): ValueError("no trained eagle3 draft")}
    summary = protocol_summary(results, _summary([1.0] * 8, 8.0), domains, "p")
    opt = summary["methods"]["opt-hydra"]
    assert opt["seeds"] == pytest.approx([1.3 * 1.35, 1.2 * 1.35], rel=0.02)
    by_seed = opt["per_prompt_by_seed"]                                  # kept per seed, column-wise
    assert set(by_seed) == {"0", "1"} and by_seed["1"]["index"] == list(range(8))
    assert by_seed["1"]["tokens"] == [round(10 * t * 1.2) for t in frozen] and by_seed["0"]["rounds"] == [10] * 8
    assert opt["speedup"] == pytest.approx(14 / 8) and opt["speedup_with_training"] == pytest.approx(14 * 0.9 / 8)
    assert opt["vs_frozen"]["frozen"] == "hydra" and opt["vs_frozen"]["gain"] == pytest.approx(0.25, abs=0.01)
    assert opt["vs_frozen"]["gain_ci"][0] > 0.2 and set(opt["vs_frozen"]["per_domain"]) == {"a", "b"}
    assert opt["tau_vs_T"].keys() == {str(t) for t in t_grid(8)} == {"2", "4", "6", "8"}
    assert summary["lr_grid"] == {"ogd-hydra": {"0.001": pytest.approx(1.35 * 1.1, rel=0.02)}}
    assert "eagle3-s0" in summary["failed"]
    targets = summary["targets"]
    assert targets["opt-hydra_gain_20pct"]["holds"] is True
    assert targets["ens-eagle3_gain_20pct"] is None                      # did not run
    assert targets["ordering_hydra"]["holds"] is True
    assert [st["higher"] for st in targets["ordering_hydra"]["steps"]] == ["osd-hydra", "opt-hydra"]
    assert all(st["gain_ci"][0] > 0 for st in targets["ordering_hydra"]["steps"])
    ens_vs_lr = targets["ensemble_vs_best_lr_hydra"]                   # 1.02 against 1.1: -7 %
    assert ens_vs_lr["holds"] is False and ens_vs_lr["best_lr"] == "ogd-hydra@0.001"
    assert ens_vs_lr["gap"] == pytest.approx(1.02 / 1.1 - 1, abs=0.01) and ens_vs_lr["gap_ci"][1] < -0.02
    no_lr = targets["no_lr_beats_online_hydra"]                         # Opt-Hydra (x1.25) above OGD (x1.1)
    assert no_lr["online"] == "opt-hydra" and no_lr["holds"] is True
    assert no_lr["per_lr"]["ogd-hydra@0.001"]["opt-hydra"]["gain_ci"][0] > 0.1
    assert no_lr["per_lr"]["ogd-hydra@0.001"]["ens-hydra"]["gain_ci"][1] < 0
    # a rate above both online learners (x1.5): the claim fails
    strong = protocol_summary({**results, ScaleJob("p", "ogd-hydra", lr=1e-3): _summary([t * 1.5 for t in frozen])},
                              _summary([1.0] * 8, 8.0), domains, "p")["targets"]["no_lr_beats_online_hydra"]
    assert strong["online"] == "opt-hydra" and strong["holds"] is False
    assert strong["per_lr"]["ogd-hydra@0.001"]["opt-hydra"]["gain_ci"][1] < 0
    # an ensemble level with the best rate is within 2 % of it
    level = protocol_summary({**results, ScaleJob("p", "ens-hydra", seed=0): _summary([t * 1.1 for t in frozen])},
                             _summary([1.0] * 8, 8.0), domains, "p")["targets"]["ensemble_vs_best_lr_hydra"]
    assert level["holds"] is True and abs(level["gap"]) < 0.01
    assert targets["opt-hydra_speedup_with_training_1.1x"]["ratio"] == pytest.approx(14 * 0.9 / 12)
    folder = write_results({"p": summary}, tmp_path / "out")
    assert {p.name for p in folder.iterdir()} >= {"summary.json", "summary-p.json", "per_chunk-p.png",
                                                   "tau_vs_T-p.png", "lr-p.png"}
    # OSD above frozen on the mean only (+4 % on half the prompts, -2 % on the rest):
    # the ordering holds on means but its first step's interval covers 0
    noisy = {ScaleJob("p", "hydra"): _summary(frozen, 12.0),
             ScaleJob("p", "osd-hydra", seed=0): _summary([t * (1.04 if i % 2 else 0.98)
                                                           for i, t in enumerate(frozen)], 12.0),
             ScaleJob("p", "opt-hydra", seed=0): _summary([t * 1.3 for t in frozen], 14.0)}
    order = protocol_summary(noisy, _summary([1.0] * 8, 8.0), domains, "p")["targets"]["ordering_hydra"]
    assert order["holds_on_means"] is True and order["holds"] is False
    assert order["steps"][0]["gain_ci"][0] < 0 < order["steps"][0]["gain_ci"][1] and order["steps"][1]["holds"]
    weaker = scale_targets({"hydra": {"mean_accepted_length": 1.0, "speedup": 1.0},
                            "opt-hydra": {"mean_accepted_length": 1.1, "speedup_with_training": 1.0,
                                          "vs_frozen": {"frozen": "hydra", "gain": 0.1, "gain_ci": [0.05, 0.15]}}},
                           {})
    assert weaker["opt-hydra_gain_20pct"]["holds"] is False and not math.isnan(weaker["opt-hydra_gain_20pct"]["gain"])


@pytest.mark.parametrize("flags, message", [(["--lr-grid", "ogd-hydra"], "expected METHOD=LR"),
                                             (["--lr-grid", "ogd-hydra=fast"], "must be numbers"),
                                             (["--every", "0"], "every must be"),
                                             (["--protocol", "=x"], "has no name"),
                                             (["--budget-minutes", "0"], "budget-minutes must be > 0")])
def test_cli_refuses_bad_grids_with_exit_2(tmp_path, capsys, flags, message):
    from specloop.cli import main
    from tests.realmodels.scale_util import record_tiny
    record_tiny(tmp_path / "rec", count=4)
    assert main(["stream", "scale", str(tmp_path / "rec"), "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.slow
def test_ray_backend_gives_the_serial_records(tmp_path):
    pytest.importorskip("ray", reason='the optional extra specloop[distributed] is not installed')
    import ray
    from tests.realmodels.scale_util import record_tiny
    from specloop.record import Trace
    record_tiny(tmp_path / "rec", count=4)
    jobs = [baseline_job(2)] + plan_jobs({"p": None}, ["suffix"], chunk=2)
    rows = {}
    for backend in ("serial", "ray"):
        settings = GridSettings(recording=str(tmp_path / "rec"), out=str(tmp_path / backend), num_draft_tokens=3,
                                target_loader="tests.realmodels.scale_util:tiny_target")
        if backend == "ray":
            import os
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
        try:
            results = run_grid(jobs, settings, backend=backend)
        finally:
            if backend == "ray":
                ray.shutdown()
        rows[backend] = [[(r.num_draft_tokens, r.accepted_tokens) for r in Trace.load(results[j]["folder"] + "/rounds.jsonl")]
                         for j in jobs]
    assert rows["ray"] == rows["serial"]
