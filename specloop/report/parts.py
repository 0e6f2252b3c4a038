"""The parts of `specloop reproduce` and their resumable runner.

Each part writes into ``DIR/<part>/``: its data, figures and ``result.json`` (a
`PartResult`), and, only when it finished, the done-marker ``DONE.json`` holding the
configuration it ran with. Re-running into the same DIR reuses a part whose marker
matches the requested configuration (``quick`` / ``skip_real`` / scale) and recomputes
it otherwise, or always with ``force``. A part whose inputs are missing (a specloop
part not landed, a package not installed) ends ``unavailable`` without a marker, so the
next run tries it again; a part that raises ends ``error`` (the command then exits 1).
"""
from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specloop.figures import FigureUnavailable, run_figure
from specloop.figures._base import scale, to_jsonable, write_json
from specloop.report.machine import LoadMonitor

__all__ = ["Part", "PartResult", "PARTS", "run_part", "part_names", "DONE_MARKER"]

DONE_MARKER = "DONE.json"
RESULT_FILE = "result.json"


@dataclass
class PartResult:
    """Outcome of one part.

    Attributes:
        name: part name (also its folder under DIR).
        status: ``ok`` | ``unavailable`` | ``error`` | ``skipped``.
        reason: why it is not ``ok`` ('' when ok).
        seconds: wall-clock seconds of the computation (of the run that made it).
        reused: True when read back from an earlier run's done-marker.
        figure: the `FigureResult.to_dict()` of a figure part (None otherwise).
        data: extra JSON data of a non-figure part (e.g. the theory check rows).
        load: the 1-minute load averages over the computation
            (`specloop.report.machine.LoadMonitor.summary`; {} for a skipped part).
    """

    name: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    reused: bool = False
    figure: dict | None = None
    data: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return to_jsonable(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> "PartResult":
        return cls(**{k: data[k] for k in ("name", "status", "reason", "seconds", "reused",
                                            "figure", "data", "load") if k in data})


@dataclass(frozen=True)
class Part:
    """One step of the reproduction.

    Attributes:
        name: folder name and id.
        title: human title for progress bars and the report.
        run: ``run(part_dir, quick) -> (figure_dict | None, data_dict)``; raises
            `FigureUnavailable` when its inputs are missing.
        real: True if it runs real models (skipped by ``--skip-real``).
    """

    name: str
    title: str
    run: Callable[[Path, bool], tuple[dict | None, dict]]
    real: bool = False


def _theory_check(part_dir: Path, quick: bool) -> tuple[None, dict]:
    from specloop.figures._base import require
    theory = require("specloop.theory", "run_theory_check",
                     why="the theory check")
    rows = _call_theory_check(theory.run_theory_check, quick)
    write_json(part_dir / "theory_check.json", rows)
    return None, {"claims": [{k: v for k, v in r.items() if k != "details"} for r in rows]}


def _call_theory_check(fn: Callable, quick: bool) -> list[dict]:
    """Run `specloop.theory.run_theory_check` (its default case count: seconds here;
    3 cases per family at the tiny scale) and return its rows as plain dicts."""
    import inspect
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if "seed" in params:
        kwargs["seed"] = 0
    if scale(quick) == "tiny" and "cases_per_family" in params:
        kwargs["cases_per_family"] = 3
    out = []
    for row in fn(**kwargs):
        out.append(to_jsonable(row.to_dict() if hasattr(row, "to_dict") else dict(row)))
    return out


def _figure_part(name: str) -> Callable[[Path, bool], tuple[dict, dict]]:
    def run(part_dir: Path, quick: bool) -> tuple[dict, dict]:
        return run_figure(name, part_dir, quick=quick).to_dict(), {}
    return run


PARTS: list[Part] = [
    Part("theory", "theory check (Lemma 1, Theorem 1, Corollary 4, Acc = 1 - TV)", _theory_check),
    Part("theory_vs_sim", "theory vs simulation: tokens per round and speedup",
         _figure_part("theory_vs_sim")),
    Part("optimal_k", "optimal k: exact vs Corollary 4", _figure_part("optimal_k")),
    Part("regret", "regret sweep: learners x scenarios", _figure_part("regret")),
    Part("speedup_table", "real model: speedup vs HF modes (SmolLM2-135M)",
         _figure_part("speedup_table"), real=True),
    Part("online_stream", "real model: prompt stream, frozen vs online drafts",
         _figure_part("online_stream"), real=True),
    Part("online_substream", "real model: held-out sub-stream replay, frozen Hydra vs Opt-Hydra",
         _figure_part("online_substream"), real=True),
    Part("table1", "Table 1 from the committed replays: online vs frozen drafts", _figure_part("table1")),
    Part("ltd", "LTD: learned depth / size policies", _figure_part("ltd")),
    Part("ltd_real", "real model: LTD against static trees, replay and transfer",
         _figure_part("ltd_real"), real=True),
]


def part_names() -> list[str]:
    return [p.name for p in PARTS]


def _config(quick: bool) -> dict:
    return {"quick": bool(quick), "scale": scale(quick)}


def load_done(part_dir: Path, quick: bool) -> PartResult | None:
    """The finished result in ``part_dir`` if its marker matches this configuration."""
    marker, result = part_dir / DONE_MARKER, part_dir / RESULT_FILE
    if not (marker.exists() and result.exists()):
        return None
    try:
        done = json.loads(marker.read_text(encoding="utf-8"))
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if done.get("config") != _config(quick):
        return None
    out = PartResult.from_dict(data)
    out.reused = True
    return out


def run_part(part: Part, out_dir: str | os.PathLike, quick: bool = False,
             force: bool = False, skip_real: bool = False) -> PartResult:
    """Run (or reuse) one part into ``out_dir/part.name``; never raises for a part's
    own failure: the status says what happened."""
    part_dir = Path(out_dir) / part.name
    if skip_real and part.real:
        return PartResult(part.name, "skipped", "real-model parts skipped by --skip-real")
    if not force:
        done = load_done(part_dir, quick)
        if done is not None:
            return done
    marker = part_dir / DONE_MARKER
    if marker.exists():
        marker.unlink()
    part_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with LoadMonitor() as load:
        try:
            figure, data = part.run(part_dir, quick)
            result = PartResult(part.name, "ok", figure=figure, data=data)
        except FigureUnavailable as exc:
            result = PartResult(part.name, "unavailable", str(exc))
        except Exception as exc:  # a real error in the part: keep the traceback for the report
            result = PartResult(part.name, "error", f"{type(exc).__name__}: {exc}",
                                data={"traceback": traceback.format_exc()})
    result.seconds = round(time.perf_counter() - start, 2)
    result.load = load.summary
    write_json(part_dir / RESULT_FILE, result.to_dict())
    if result.status == "ok":
        write_json(marker, {"config": _config(quick), "seconds": result.seconds,
                            "finished": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())})
    return result
