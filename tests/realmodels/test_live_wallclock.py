"""The live wall-clock measurement of online updates: every row serves the same prompts,
outputs equal the frozen row's, and each summary carries its ratio to the frozen row
(with an interval), its update-cost fractions and its publications."""
from __future__ import annotations

import pytest

from specloop.realmodels.streams.live_wallclock import (WallclockRow, cost_model_check, default_rows,
                                                        run_live_wallclock)
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
        else:
            # a serial row has no backlog: its chunk-end wait is the call's own microseconds
            assert sum(p["wait_s"] for p in summary["per_prompt"]) < 0.01 * sum(p["wall_s"] for p in summary["per_prompt"])
        # round mode: one learner step per round with a sample, all done by the chunk end
        assert 0 < summary["steps"] <= summary["rounds"]
        assert all(p["update_s"] >= 0 and p["wait_s"] >= 0 for p in summary["per_prompt"])
    check = cost_model_check(result, chunk=2)
    assert set(check) == {r.name for r in rows[1:]}
    assert {c["placement"] for c in check.values()} == {"serial", "background, queued"}
    assert all(c["predicted"] > 0 and c["measured"] > 0 for c in check.values())
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


def _row(method, background, tau, prompts):
    keys = ("index", "rounds", "wall_s", "online_s", "wait_s", "update_s", "steps")
    return {"method": method, "background": background, "tau": tau,
            "per_prompt": [dict(zip(keys, p), tokens=10) for p in prompts]}


def test_the_cost_model_check_by_hand():
    # frozen: 2 prompts, 10 rounds each, 1 s a round
    frozen = _row(None, False, 1.0, [(0, 10, 10.0, 0, 0, 0, 0), (1, 10, 10.0, 0, 0, 0, 0)])
    # serial: 8 rounds a prompt (tau gain 25 %), decoding 1 s a round, 0.1 s/round sampling, 0.4 s steps
    serial = _row("m", False, 1.25, [(i, 8, 12.0, 4.0, 0, 3.2, 8) for i in (0, 1)])
    # background, chunk 1: the decoder takes 9.6 s (sigma 1.2), the worker 12 s in chunk 0 (2.4 s wait)
    # and 6 s in chunk 1 (keeps up)
    queued = _row("m", True, 1.25, [(0, 8, 12.0, 2.4, 2.4, 12.0, 8), (1, 8, 9.6, 0.0, 0.0, 6.0, 8)])
    out = cost_model_check({"rows": {"frozen": frozen, "serial": serial, "bg": queued}}, chunk=1)
    s, b = out["serial"], out["bg"]
    assert s["measured"] == pytest.approx(20 / 24) and s["gain"] == pytest.approx(0.25)
    # (1 + g) (v + d) / (v + d + c + u): 1.25 * 1 / (1 + 0.1 + 0.4)
    assert s["predicted"] == pytest.approx(1.25 / 1.5) and s["decode_seconds_per_round"] == pytest.approx(1.0)
    assert b["slowdown"] == pytest.approx(1.2) and b["measured"] == pytest.approx(20 / 21.6)
    assert b["predicted"] == pytest.approx(20 / (12.0 + 9.6))    # per chunk: max(9.6, 12) + max(9.6, 6)
    with pytest.raises(ValueError, match="wait_s"):
        cost_model_check({"rows": {"frozen": frozen, "x": {**serial, "per_prompt": [{"rounds": 1}]}}}, chunk=1)
    with pytest.raises(ValueError, match="exactly one frozen row, not 2"):
        cost_model_check({"rows": {"a": frozen, "b": frozen, "serial": serial}}, chunk=1)
    with pytest.raises(ValueError, match="chunk >= 1"):
        cost_model_check({"rows": {"frozen": frozen, "serial": serial}}, chunk=0)
