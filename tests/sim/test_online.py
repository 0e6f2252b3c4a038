"""The online experiment engine (`specloop.sim.online`) and its commands."""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from specloop.sim.online import (BANDIT_ARMS, LEARNERS, ONLINE_SCENARIOS, POLICIES, OnlineSetup,
                                 SweepConfig, build_problem, fit_exponent, sim_learner,
                                 make_policy, predicted_exponent, regret_sweep, run_online,
                                 solve_comparator)
from specloop.strategies.policies import HeuristicK


@pytest.fixture(scope="module")
def problems():
    return {s: build_problem(OnlineSetup(s, 120, seed=1)) for s in ONLINE_SCENARIOS}


def test_solve_comparator_matches_the_ball_projection():
    """min 1/2 ||w - c||^2 over ||w|| <= R has the solution R c / ||c|| when ||c|| > R."""
    c = [np.array([3.0, -4.0]), np.array([[1.0]])]
    def fg(ws):
        diff = [w - ci for w, ci in zip(ws, c)]
        return 0.5 * sum(float((d * d).sum()) for d in diff), diff
    loss, w = solve_comparator(fg, [np.zeros(2), np.zeros((1, 1))], radius=2.0)
    norm = math.sqrt(26.0)
    np.testing.assert_allclose(w[0], np.array([3.0, -4.0]) * 2 / norm, atol=1e-6)
    np.testing.assert_allclose(w[1], [[2 / norm]], atol=1e-6)
    assert loss == pytest.approx(0.5 * (norm - 2) ** 2, rel=1e-6)


@pytest.mark.parametrize("scenario", ONLINE_SCENARIOS)
@pytest.mark.parametrize("learner", LEARNERS)
def test_run_invariants(problems, scenario, learner):
    result = run_online(problems[scenario], learner)
    T = result.rounds
    assert T == 120 and len(result.trace) == T
    # comparator (b) (exact match) is at least as good as (a) (best in the ball)
    assert np.all(result.comparator_loss >= problems[scenario].entropies - 1e-9)
    assert result.dynamic_regret_exact >= result.dynamic_regret - 1e-9
    np.testing.assert_allclose(result.kl, result.loss - problems[scenario].entropies, atol=1e-12)
    assert np.all(result.kl >= -1e-12)
    # windows add up to the totals
    windows = result.windows(25)
    assert sum(w["dynamic_regret"] for w in windows) == pytest.approx(result.dynamic_regret)
    assert sum(w["dynamic_regret_exact"] for w in windows) == pytest.approx(result.dynamic_regret_exact)
    # Theorem 1 holds for the expected speedup (Assumption 1 is exact here)
    lower, upper = result.theorem1_bounds()
    assert lower <= result.speedup <= upper + 1e-12
    # the sampled speedup is the Trace's tokens/s over plain decoding's (1 token per target
    # forward of A = setup.target_time seconds: record times are seconds)
    assert result.trace.tokens_per_second() * result.setup.target_time == pytest.approx(result.speedup_sampled)
    assert result.trace.mean_accepted_length() == pytest.approx(result.tokens_per_round.mean())
    summary = result.summary()
    json.dumps(summary)
    assert summary["learner"] == learner and summary["scenario"] == scenario


def test_sampled_tokens_agree_with_expectation(problems):
    """Mean sampled n_t vs mean E[n_t]: z-test with the sampled rounds' variance."""
    result = run_online(build_problem(OnlineSetup("stationary", 600, seed=3)), "ogd")
    diff = result.tokens_per_round - result.expected_tokens
    z = diff.mean() / (diff.std(ddof=1) / math.sqrt(diff.size))
    assert abs(z) < 4.0


def test_hint_error_is_the_optimistic_learners_own(problems):
    problem = problems["smooth"]
    learner = sim_learner("optimistic", problem.setup.rounds, problem.setup.radius,
                           problem.gradient_bound)
    result = run_online(problem, "optimistic", learner=learner)
    assert result.hint_error == pytest.approx(learner.hint_error, rel=1e-9)


def test_learning_beats_the_frozen_draft(problems):
    for scenario in ("stationary", "piecewise"):
        frozen = run_online(problems[scenario], "fixed")
        for learner in ("ogd", "ensemble", "optimistic"):
            assert run_online(problems[scenario], learner).dynamic_regret < 0.5 * frozen.dynamic_regret


def test_path_length_reflects_the_scenario(problems):
    assert problems["stationary"].path_length == pytest.approx(0.0, abs=1e-6)
    assert problems["piecewise"].path_length > 0.1
    assert problems["fast"].path_length > problems["smooth"].path_length


def test_policy_drives_k(problems):
    result = run_online(problems["stationary"], "ogd", policy=HeuristicK(initial_k=2, k_max=12))
    assert len(np.unique(result.num_draft_tokens)) > 1
    assert math.isnan(result.theorem1_bounds()[0])


def test_fit_and_predicted_exponents():
    t = np.array([100, 200, 400, 800])
    assert fit_exponent(t, 3.0 * t ** 0.5) == pytest.approx(0.5)
    assert math.isnan(fit_exponent(t, [-1, 0, -2, 0]))
    assert predicted_exponent("fixed", 0.0, 0.0) == 1.0
    assert predicted_exponent("ogd", 0.0, 1.0) == pytest.approx(0.5)
    assert predicted_exponent("ogd", 1.0, 1.0) == 1.0
    assert predicted_exponent("optimistic", 0.0, 0.0) == pytest.approx(0.0)
    assert predicted_exponent("ensemble", 0.5, 1.0) == pytest.approx(0.75)
    assert predicted_exponent("optimistic-ensemble", 0.0, 0.4) == pytest.approx(0.2)


def test_regret_sweep_rows():
    config = SweepConfig(scenarios=("stationary", "fast"), learners=("fixed", "ogd"),
                         rounds_list=(30, 60, 120), seeds=(0,))
    rows = regret_sweep(config)
    assert len(rows) == 4
    for row in rows:
        for key in ("scenario", "learner", "exponent", "predicted_exponent", "regret_at_max_T",
                    "speedup", "speedup_lower_bound"):
            assert key in row
        assert row["speedup_lower_bound"] <= row["speedup"] + 1e-12
    fixed = [r for r in rows if r["learner"] == "fixed"]
    assert all(r["exponent"] == pytest.approx(1.0, abs=0.05) for r in fixed)
    ogd_stationary = next(r for r in rows if r["learner"] == "ogd" and r["scenario"] == "stationary")
    assert ogd_stationary["exponent"] < 0.8


def test_bad_inputs():
    with pytest.raises(ValueError, match="scenario"):
        build_problem(OnlineSetup("trained-target", 10))
    with pytest.raises(ValueError, match="rounds"):
        build_problem(OnlineSetup("stationary", 0))
    with pytest.raises(ValueError, match="radius"):
        build_problem(OnlineSetup("stationary", 10, radius=0.0))
    with pytest.raises(ValueError, match="learner"):
        sim_learner("adam", 10, 1.0, 1.0)
    with pytest.raises(ValueError, match="horizons"):
        regret_sweep(SweepConfig(rounds_list=(10,)))


def main(argv):
    """`specloop simulate ...` with only this module's sub-commands registered (the
    full CLI imports every part of the package); same error-to-exit-code mapping as
    `specloop.cli.main`."""
    from specloop.cli import simulate_online_cmd
    parser = argparse.ArgumentParser(prog="specloop")
    simulate = parser.add_subparsers(dest="command").add_parser("simulate")
    simulate_online_cmd.register(simulate.add_subparsers(dest="simulate_command"))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError):
        return 2


def test_commands_are_registered_under_simulate():
    from specloop.cli.simulate_cmd import EXTRA_SIMULATE_MODULES
    assert "specloop.cli.simulate_online_cmd" in EXTRA_SIMULATE_MODULES


def test_cli_online_json(capsys):
    rc = main(["simulate", "online", "--scenario", "piecewise", "--learner", "optimistic-ensemble",
               "--rounds", "60", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert main(["simulate", "online", "--policy", "ucb", "--rounds", "30"]) == 0
    assert "per window" in capsys.readouterr().out
    assert out["summary"]["learner"] == "optimistic-ensemble"
    assert out["summary"]["rounds"] == 60
    assert {"dynamic_regret", "dynamic_regret_exact", "path_length", "hint_error",
            "mean_accepted_length", "speedup"} <= set(out["summary"])
    assert len(out["windows"]) == 10


def test_cli_regret_sweep_json(capsys, tmp_path):
    out_file = tmp_path / "rows.json"
    rc = main(["simulate", "regret-sweep", "--rounds", "20,40", "--seeds", "1", "--scenarios",
               "smooth", "--learners", "ogd,osd", "--processes", "1", "--json",
               "--out", str(out_file)])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == json.loads(out_file.read_text())
    assert [r["learner"] for r in rows] == ["ogd", "osd"]
    assert {"scenario", "learner", "exponent", "predicted_exponent", "regret_at_max_T", "speedup",
            "speedup_lower_bound"} <= set(rows[0])


def test_cli_rejects_bad_names(capsys):
    assert main(["simulate", "regret-sweep", "--learners", "sgd", "--rounds", "20,40"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "online", "--scenario", "nowhere"])
    assert exc.value.code == 2


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_drives_the_engine(problems, name):
    policy = make_policy(name, 4, 0.05, 120, seed=0)
    result = run_online(problems["piecewise"], "ogd", policy=policy)
    ks = result.num_draft_tokens
    assert np.all(ks >= 0) and np.all(ks <= 32)
    # per-round speedup can never beat drafting everything right: (k+1)/(ck+1) per round
    assert result.speedup <= max((k + 1) / (0.05 * k + 1) for k in np.unique(ks)) + 1e-12
    if name in ("ucb", "exp3"):
        assert set(np.unique(ks).astype(int)) <= set(BANDIT_ARMS)
    with pytest.raises(ValueError, match="policy"):
        make_policy("greedy", 4, 0.05, 10)
