"""`specloop figures`: unavailable figures are reported and do not fail the command;
real errors do (exit 1); names are validated."""
from __future__ import annotations

import argparse
import json
import sys
import types

import pytest

import specloop.figures as figures
from specloop.cli import figures_cmd
from specloop.figures import FigureResult, FigureUnavailable
from specloop.figures._base import new_figure, save_figure, write_csv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specloop")
    figures_cmd.register(parser.add_subparsers(dest="command"))
    return parser


def _fake_module(name: str, behaviour: str) -> str:
    def main(out_dir, quick=False):
        if behaviour == "unavailable":
            raise FigureUnavailable("inputs of figure 99 have not landed")
        if behaviour == "error":
            raise RuntimeError("boom")
        data = write_csv(out_dir / "d.csv", [{"x": 1, "y": 2}])
        fig, axes = new_figure()
        axes[0].plot([0, 1], [0, 1])
        return FigureResult(name, "fake", [data], save_figure(fig, out_dir, name), {"x": 1},
                            claims=[{"claim": "fake_claim", "holds": True, "evidence": "e"}], notes=["a note"])
    module = types.ModuleType(f"fake_fig_{name}")
    module.main = main
    sys.modules[module.__name__] = module
    return module.__name__


@pytest.fixture
def fake_registry(monkeypatch):
    registry = {b: (_fake_module(b, b), b) for b in ("ok", "unavailable", "error")}
    monkeypatch.setattr(figures, "FIGURES", registry)
    return registry


def test_all_reports_unavailable_and_continues(fake_registry, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(figures, "FIGURES", {k: fake_registry[k] for k in ("unavailable", "ok")})
    args = _parser().parse_args(["figures", "all", "--quick", "--out", str(tmp_path), "--json"])
    assert args.func(args) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["unavailable"]["status"] == "unavailable"
    assert "figure 99" in rows["unavailable"]["reason"]
    assert rows["ok"]["status"] == "ok"
    assert any(p.endswith(".png") for p in rows["ok"]["images"])
    assert (tmp_path / "ok" / "ok.svg").exists()
    # --json carries the verdicts and notes, not only the numbers
    assert rows["ok"]["claims"][0]["claim"] == "fake_claim" and rows["ok"]["notes"] == ["a note"]
    assert rows["unavailable"]["claims"] == []


def test_real_error_exits_nonzero(fake_registry, tmp_path, capsys):
    args = _parser().parse_args(["figures", "all", "--out", str(tmp_path), "--json"])
    assert args.func(args) == 1
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["error"]["status"] == "error" and "boom" in rows["error"]["reason"]
    assert rows["ok"]["status"] == "ok"   # figures after/before the error still ran


def test_named_figures_and_table_output(fake_registry, tmp_path, capsys):
    args = _parser().parse_args(["figures", "ok", "--out", str(tmp_path)])
    assert args.func(args) == 0
    assert "ok" in capsys.readouterr().out


def test_unknown_name_is_a_value_error(fake_registry, tmp_path):
    args = _parser().parse_args(["figures", "nope", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown figure"):
        args.func(args)
