"""The live wall-clock measurement of online updates: every row serves the same prompts,
outputs equal the frozen row's, and each summary carries its ratio to the frozen row
(with an interval), its update-cost fractions and its publications."""
from __future__ import annotations

import pytest

from specloop.realmodels.streams.live_wallclock import WallclockRow, default_rows, run_live_wallclock
from tests.realmodels.decoder_util import plain_greedy
from tests.realmodels.test_online_util import hydra_drafter, prompts, tiny_loaded


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


def test_rows_serve_the_same_prompts_losslessly_with_their_costs(target):
    stream = prompts(4)
    rows = default_rows("ogd-hydra", cores=1, publish_every=2)
    served = []
    result = run_live_wallclock(target, stream, rows, make_drafter=lambda kind: hydra_drafter(target), chunk=2,
                                max_new_tokens=12, num_draft_tokens=3, online={"lr": 0.05, "mode": "round"},
                                progress=served.append)
    assert result["outputs_equal"] and result["prompts"] == 4 and sum(served) == 4 * len(rows)
    frozen = result["rows"]["frozen"]
    assert frozen["update_cost_fraction"] == 0 and "wallclock_vs_frozen" not in frozen
    for row in rows[1:]:
        summary = result["rows"][row.name]
        assert summary["wallclock_vs_frozen"] > 0 and len(summary["wallclock_vs_frozen_ci"]) == 2
        assert summary["n"] == 4 and 0 < summary["update_cost_fraction"] < 1
        assert 0 < summary["update_cpu_fraction"] <= 1
        assert [p["index"] for p in summary["per_prompt"]] == [0, 1, 2, 3]
        if row.background:
            assert summary["publications"] > 0
    # the frozen row is the target's greedy output (its tokens are what every row matched)
    assert result["rows"]["serial"]["tau"] >= 1


def test_bad_rows():
    with pytest.raises(ValueError, match="exactly one frozen row"):
        run_live_wallclock(None, [[1, 2]], [WallclockRow("a", None, 1), WallclockRow("b", None, 1)],
                           make_drafter=lambda kind: None)
    with pytest.raises(ValueError, match="no updates to run in the background"):
        WallclockRow("x", None, 1, background=True)
    with pytest.raises(ValueError, match=">= 1"):
        WallclockRow("x", "opt-hydra", 0)


def test_a_stopped_run_resumes_after_its_last_chunk(target, tmp_path):
    stream = prompts(4)
    rows = [WallclockRow("frozen", None, 1), WallclockRow("serial", "opt-hydra", 1)]
    kwargs = dict(make_drafter=lambda kind: hydra_drafter(target), chunk=2, max_new_tokens=12, num_draft_tokens=3,
                  online={"lr": 0.05, "mode": "round"})
    full = run_live_wallclock(target, stream, rows, **kwargs)

    class Killed(Exception):
        pass
    calls = []

    def kill_in_second_chunk(n):
        calls.append(n)
        if len(calls) == 3:
            raise Killed
    with pytest.raises(Killed):
        run_live_wallclock(target, stream, rows, state_dir=tmp_path, progress=kill_in_second_chunk, **kwargs)
    resumed = run_live_wallclock(target, stream, rows, state_dir=tmp_path, **kwargs)
    assert resumed["complete"] and resumed["outputs_equal"] and resumed["prompts"] == 4
    for name in ("frozen", "serial"):
        counts = [(p["index"], p["tokens"], p["rounds"]) for p in resumed["rows"][name]["per_prompt"]]
        assert counts == [(p["index"], p["tokens"], p["rounds"]) for p in full["rows"][name]["per_prompt"]]
    with pytest.raises(ValueError, match="other rows, settings or prompts"):
        run_live_wallclock(target, stream[:3], rows, state_dir=tmp_path, **kwargs)
    import time
    early = run_live_wallclock(target, stream, rows, state_dir=tmp_path / "late", deadline=time.time() - 1, **kwargs)
    assert not early["complete"]
