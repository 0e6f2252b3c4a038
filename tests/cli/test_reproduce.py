"""`specloop reproduce`: parts write DIR/<part>/ with a done-marker; re-running into
the same DIR reuses finished parts; --force and a changed configuration recompute;
unavailable parts are retried; the report embeds figures and verdicts."""
from __future__ import annotations

import argparse
import json

import pytest

import specloop.report.parts as parts_mod
from specloop.cli import reproduce_cmd
from specloop.figures import FigureResult, FigureUnavailable
from specloop.figures._base import new_figure, save_figure, write_csv
from specloop.report.parts import DONE_MARKER, Part, run_part


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specloop")
    reproduce_cmd.register(parser.add_subparsers(dest="command"))
    return parser


class Counter:
    def __init__(self):
        self.calls: dict[str, int] = {}

    def figure_part(self, name: str, holds: bool = True):
        def run(part_dir, quick):
            self.calls[name] = self.calls.get(name, 0) + 1
            data = write_csv(part_dir / "d.csv", [{"k": 1, "tokens": 2.0}])
            fig, axes = new_figure()
            axes[0].plot([1, 2], [1, 2])
            result = FigureResult(name, f"title {name}", [data], save_figure(fig, part_dir, name),
                                  numbers={"calls": self.calls[name]},
                                  table=[{"k": 1, "tokens": 2.0}],
                                  claims=[{"claim": f"{name}_claim", "statement": "s",
                                           "holds": holds, "evidence": "e"}])
            return result.to_dict(), {}
        return run

    def unavailable_part(self, name: str):
        def run(part_dir, quick):
            self.calls[name] = self.calls.get(name, 0) + 1
            raise FigureUnavailable("the LTD inputs have not landed")
        return run


@pytest.fixture
def counter(monkeypatch):
    c = Counter()
    monkeypatch.setattr(parts_mod, "PARTS", [
        Part("alpha_fig", "a figure", c.figure_part("alpha_fig")),
        Part("beta_fig", "a failing claim", c.figure_part("beta_fig", holds=False)),
        Part("later", "not landed", c.unavailable_part("later")),
        Part("real_one", "real model", c.figure_part("real_one"), real=True),
    ])
    return c


def _run(tmp_path, *extra) -> tuple[int, dict]:
    args = _parser().parse_args(["reproduce", "--out", str(tmp_path), "--json", *extra])
    return args.func(args), args


def test_rerun_reuses_finished_parts(counter, tmp_path, capsys):
    code, _ = _run(tmp_path, "--quick")
    assert code == 0
    first = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in first["parts"]] == ["ok", "ok", "unavailable", "ok"]
    assert (tmp_path / "alpha_fig" / DONE_MARKER).exists()
    assert not (tmp_path / "later" / DONE_MARKER).exists()
    report = (tmp_path / "report.md").read_text()
    assert "![alpha_fig](alpha_fig/alpha_fig.png)" in report
    assert "**does not hold**" in report and "beta_fig_claim" in report
    assert "the LTD inputs have not landed" in report and "git_commit" in report

    code, _ = _run(tmp_path, "--quick")
    second = json.loads(capsys.readouterr().out)
    assert code == 0
    assert counter.calls == {"alpha_fig": 1, "beta_fig": 1, "later": 2, "real_one": 1}
    assert [p["reused"] for p in second["parts"]] == [True, True, False, True]


def test_force_and_config_change_recompute(counter, tmp_path, capsys):
    _run(tmp_path, "--quick")
    _run(tmp_path)            # full config != quick config: recompute
    assert counter.calls["alpha_fig"] == 2
    _run(tmp_path, "--force")
    assert counter.calls["alpha_fig"] == 3
    capsys.readouterr()


def test_skip_real_and_part_selection(counter, tmp_path, capsys):
    code, _ = _run(tmp_path, "--skip-real", "--parts", "alpha_fig,real_one")
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(p["name"], p["status"]) for p in out["parts"]] == [("alpha_fig", "ok"),
                                                                ("real_one", "skipped")]
    assert "real_one" not in counter.calls
    with pytest.raises(ValueError, match="unknown part"):
        _run(tmp_path, "--parts", "nope")


def test_error_part_exits_one_and_keeps_going(monkeypatch, tmp_path, capsys):
    def boom(part_dir, quick):
        raise RuntimeError("broken part")
    c = Counter()
    monkeypatch.setattr(parts_mod, "PARTS", [Part("bad", "b", boom),
                                             Part("good", "g", c.figure_part("good"))])
    code, _ = _run(tmp_path)
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [p["status"] for p in out["parts"]] == ["error", "ok"]
    result = json.loads((tmp_path / "bad" / "result.json").read_text())
    assert "RuntimeError" in result["data"]["traceback"]
    assert not (tmp_path / "bad" / DONE_MARKER).exists()


def test_interrupted_part_has_no_marker(tmp_path):
    """A part killed mid-way leaves no done-marker, so the next run redoes it."""
    def killed(part_dir, quick):
        (part_dir / "partial.csv").write_text("x\n")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_part(Part("p", "p", killed), tmp_path)
    assert not (tmp_path / "p" / DONE_MARKER).exists()


def test_report_helpers():
    from specloop.report.machine import machine_info
    from specloop.report.parts import PartResult
    from specloop.report.writer import collect_claims, markdown_table
    table = markdown_table([{"a": 1.23456, "b": "x|y", "c": None}])
    assert table.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1.235 | x\\|y | — |"]
    assert markdown_table([]) == ""
    results = [
        PartResult("theory", "ok", data={"claims": [{"claim": "c1", "holds": False, "cases": 3,
                                                      "violations": 1, "worst_ratio": 2.0}]}),
        PartResult("fig", "ok", figure={"claims": [{"claim": "c2", "statement": "s",
                                                    "holds": None, "evidence": "e"}]}),
        PartResult("gone", "unavailable", "not landed",
                   figure={"claims": [{"claim": "never", "holds": True}]}),
    ]
    rows = collect_claims(results)
    assert [(r["claim"], r["verdict"]) for r in rows] == [("c1", "**does not hold**"),
                                                          ("c2", "undecided")]
    info = machine_info()
    assert {"platform", "cpu_count", "git_commit", "versions"} <= set(info)
    assert {"torch", "transformers", "numba"} <= set(info["versions"])
