"""Shared plumbing for the figure modules: the result type, the "inputs missing"
exception, and the save helpers (CSV / NPZ data, PNG + SVG images).

Every figure module exposes ``main(out_dir, quick=False) -> FigureResult`` and
follows the same three steps: compute -> save data -> plot. A figure whose inputs
do not exist yet (a part of specloop that has not landed, a package that is not
installed, no results file to read) raises `FigureUnavailable` with the reason;
`specloop figures all` reports it and goes on.
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["FigureResult", "FigureUnavailable", "write_csv", "read_csv", "save_figure",
           "ensure_dir", "new_figure", "to_jsonable", "write_json", "fmt", "iter_rows",
           "require", "scale", "sizes", "SCALE_ENV"]


class FigureUnavailable(RuntimeError):
    """A figure's inputs are not available (yet): the message says which and why.

    Not an error of the figure itself: `specloop figures all` and `specloop
    reproduce` report it and continue, and exit non-zero only on real errors.
    """


@dataclass
class FigureResult:
    """What a figure produced.

    Attributes:
        name: the figure's registry name (e.g. ``"theory_vs_sim"``).
        title: one-line human title.
        data_paths: files holding the plotted numbers (.csv / .npz / .json).
        image_paths: the rendered images (.png and .svg).
        numbers: headline numbers for the report (JSON-serialisable scalars).
        table: rows (dicts with the same keys) for the report's table; may be empty.
        claims: verdicts computed from the data, each a dict with keys ``claim``
            (id), ``statement`` (what the paper states), ``holds`` (bool or None
            when it cannot be decided) and ``evidence`` (the numbers, as text).
        notes: caveats the report prints under the figure (inputs used, gaps).
    """

    name: str
    title: str
    data_paths: list[Path] = field(default_factory=list)
    image_paths: list[Path] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    table: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-serialisable form (paths as strings, NaN as null)."""
        return to_jsonable({
            "name": self.name, "title": self.title,
            "data_paths": [str(p) for p in self.data_paths],
            "image_paths": [str(p) for p in self.image_paths],
            "numbers": self.numbers, "table": self.table,
            "claims": self.claims, "notes": self.notes,
        })

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FigureResult":
        """Inverse of `to_dict`."""
        return cls(name=data["name"], title=data["title"],
                   data_paths=[Path(p) for p in data.get("data_paths", [])],
                   image_paths=[Path(p) for p in data.get("image_paths", [])],
                   numbers=dict(data.get("numbers", {})),
                   table=list(data.get("table", [])),
                   claims=list(data.get("claims", [])),
                   notes=list(data.get("notes", [])))


def to_jsonable(value: Any) -> Any:
    """Recursively convert NumPy scalars/arrays, Paths and non-finite floats
    (to None) so that ``json.dumps`` accepts the value and never writes NaN."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value


def ensure_dir(out_dir: str | os.PathLike) -> Path:
    """Create ``out_dir`` (and parents) and return it as a Path."""
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]],
              columns: Sequence[str] | None = None) -> Path:
    """Write rows (dicts) as CSV with a header; floats at full precision.

    Raises:
        ValueError: no rows and no columns given (nothing to describe the file).
    """
    path = Path(path)
    if columns is None:
        if not rows:
            raise ValueError(f"write_csv({path}): no rows and no columns")
        columns = list(rows[0].keys())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return path


def read_csv(path: str | os.PathLike) -> list[dict[str, str]]:
    """Read a CSV written by `write_csv` (values as strings)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.8):
    """A matplotlib (Agg backend) figure with a grid of axes; returns (fig, axes)
    where ``axes`` is always a flat NumPy array of Axes."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False)
    return fig, np.asarray(axes).ravel()


def save_figure(fig, out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """Save a matplotlib figure as ``stem.png`` (110 dpi) and ``stem.svg`` and close it.

    Returns:
        the two paths, PNG first.
    """
    import matplotlib.pyplot as plt
    out = ensure_dir(out_dir)
    fig.tight_layout()
    png, svg = out / f"{stem}.png", out / f"{stem}.svg"
    fig.savefig(png, dpi=110)
    fig.savefig(svg)
    plt.close(fig)
    return [png, svg]


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write JSON atomically (temporary file then rename), NaN as null."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(data), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def fmt(value: Any, digits: int = 3) -> str:
    """Format a number for a report table (None/NaN as an em dash)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            return "—"
        return f"{float(value):.{digits}g}" if abs(float(value)) >= 1e4 or (
            value != 0 and abs(float(value)) < 1e-3) else f"{float(value):.{digits}f}"
    return str(value)


def iter_rows(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> Iterable[list[str]]:
    """Rows as lists of formatted cells, in ``columns`` order."""
    for row in rows:
        yield [fmt(row.get(c)) for c in columns]


def require(module: str, *names: str, why: str = ""):
    """Import ``module`` and return it, or raise `FigureUnavailable` naming what is
    missing (the module, or any of ``names`` it does not define yet).

    Used for inputs that other parts of specloop provide, so a figure whose part
    has not landed reports a clear reason instead of an ImportError.
    """
    import importlib
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise FigureUnavailable(f"{module} is not available ({exc}){': ' + why if why else ''}") from exc
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        raise FigureUnavailable(
            f"{module} does not provide {', '.join(missing)} yet{': ' + why if why else ''}")
    return mod


SCALE_ENV = "SPECLOOP_SCALE"


def scale(quick: bool) -> str:
    """The size preset a figure runs at: ``"full"``, ``"quick"`` (``quick=True``), or
    ``"tiny"`` when the environment variable ``SPECLOOP_SCALE=tiny`` is set (seconds
    per figure; used by the tests and `specloop reproduce --tiny`).

    Raises:
        ValueError: SPECLOOP_SCALE set to anything but ``tiny`` or empty.
    """
    env = os.environ.get(SCALE_ENV, "").strip().lower()
    if env not in ("", "tiny"):
        raise ValueError(f"{SCALE_ENV} must be 'tiny' or unset, got {env!r}")
    if env == "tiny":
        return "tiny"
    return "quick" if quick else "full"


def sizes(table: Mapping[str, Mapping[str, Any]], quick: bool) -> dict[str, Any]:
    """Pick a figure's size preset (``table`` maps full / quick / tiny to settings)."""
    return dict(table[scale(quick)])
