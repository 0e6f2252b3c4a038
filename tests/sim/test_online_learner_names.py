"""The online simulator takes the learner registry's names and aliases: an alias runs
the same learner as its name, and "fixed" stays the simulator's no-learner row."""
from __future__ import annotations

import numpy as np
import pytest

from specloop.sim.online import LEARNERS, OnlineSetup, build_problem, sim_learner, run_online
from specloop.strategies.registry import LEARNER_ALIASES, LEARNER_NAMES


def test_the_simulator_uses_the_registry_names():
    assert LEARNERS == ("fixed",) + LEARNER_NAMES
    assert sim_learner("fixed", 10, 1.0, 1.0) is None
    with pytest.raises(ValueError, match="unknown learner 'adam'.*optimistic-ensemble"):
        sim_learner("adam", 10, 1.0, 1.0)


@pytest.mark.parametrize("alias", sorted(LEARNER_ALIASES))
def test_an_alias_runs_the_same_learner(alias):
    problem = build_problem(OnlineSetup("piecewise", 60, seed=2))
    a, b = run_online(problem, alias), run_online(problem, LEARNER_ALIASES[alias])
    np.testing.assert_array_equal(a.loss, b.loss)
    np.testing.assert_array_equal(a.tokens_per_round, b.tokens_per_round)


def test_cli_accepts_aliases_and_reports_the_registered_name(capsys):
    import json

    from tests.sim.test_online import main
    assert main(["simulate", "online", "--learner", "opt", "--rounds", "30", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["learner"] == "optimistic"
    assert main(["simulate", "regret-sweep", "--rounds", "20,40", "--seeds", "1", "--scenarios", "smooth",
                 "--learners", "ens,fixed", "--processes", "1", "--json"]) == 0
    assert [r["learner"] for r in json.loads(capsys.readouterr().out)] == ["ensemble", "fixed"]
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "online", "--learner", "adam"])
    assert exc.value.code == 2
