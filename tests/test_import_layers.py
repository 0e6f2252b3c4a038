"""The package's import layers: no import circles, nothing outside `specloop.cli`
imports `specloop.cli` (the ``python -m specloop`` entry point aside), and `sim` and
`realmodels` never import each other. Every import counts, including those inside
functions (there were four circles once, among them the ltd commands and the two
drafter registries).

No circle between units either: a module below a sub-package (``specloop.A.B.x``)
counts as its sub-package ``specloop.A.B``, a root module (``specloop.A.x``) as
itself, as ``shared/tools/import_graph.py`` folds them (the drafters -> heads ->
training -> drafters kind of circle, which no two modules form). `theory` imports
nothing of the package but itself, `strategies` and `sim` no models, `specloop.ltd`
sits above `sim` and `realmodels` (neither imports it), and importing
`specloop.strategies` or `specloop.sim` loads neither torch, gymnasium nor
stable-baselines3."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specloop"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, mods: dict) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, mods: dict) -> set[str]:
    deps = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_pkg else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            dep = _resolve(name, mods)
            if dep and dep != module:
                deps.add(dep)
    # a package re-exporting its children (or a child importing its package) is no circle
    return {d for d in deps if not d.startswith(module + ".") and not module.startswith(d + ".")}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_only_the_cli_imports_the_cli():
    graph = _graph()
    outside = sorted(m for m, deps in graph.items()
                     if not m.startswith("specloop.cli") and m != "specloop.__main__"
                     and any(d == "specloop.cli" or d.startswith("specloop.cli.") for d in deps))
    assert outside == []


def test_sim_and_realmodels_never_import_each_other():
    graph = _graph()
    bad = sorted((m, d) for m, deps in graph.items() for d in deps
                 for a, b in (("specloop.sim", "specloop.realmodels"), ("specloop.realmodels", "specloop.sim"))
                 if (m == a or m.startswith(a + ".")) and (d == b or d.startswith(b + ".")))
    assert bad == []


def _unit(module: str, mods: dict) -> str:
    """``specloop.A.B`` for a module below sub-package B of A (or B's ``__init__``),
    else the module itself."""
    parts = module.split(".")
    if len(parts) > 3 or (len(parts) == 3 and mods[module].name == "__init__.py"):
        return ".".join(parts[:3])
    return module


def _unit_graph() -> dict[str, set[str]]:
    mods = _modules()
    out: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        u = _unit(m, mods)
        out.setdefault(u, set()).update(_unit(d, mods) for d in deps if _unit(d, mods) != u)
    return out


def test_no_circles_between_units():
    assert _cycles(_unit_graph()) == []


def _inside(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


def test_layers_import_only_downwards():
    """theory is pure; strategies and sim see no models; nothing below ltd imports it."""
    graph = _graph()
    forbidden = {
        "specloop.theory": ("specloop.sim", "specloop.strategies", "specloop.realmodels", "specloop.ltd",
                            "specloop.figures", "specloop.report", "specloop.data", "specloop.integrations"),
        "specloop.strategies": ("specloop.sim", "specloop.realmodels", "specloop.ltd", "specloop.figures",
                                "specloop.report", "specloop.integrations"),
        "specloop.sim": ("specloop.realmodels", "specloop.ltd", "specloop.figures", "specloop.report",
                         "specloop.integrations"),
        "specloop.realmodels": ("specloop.sim", "specloop.ltd", "specloop.figures", "specloop.report"),
        "specloop.stats": ("specloop.sim", "specloop.realmodels", "specloop.ltd", "specloop.figures",
                           "specloop.report"),
    }
    bad = sorted((m, d) for m, deps in graph.items() for d in deps for layer, above in forbidden.items()
                 if _inside(m, layer) and any(_inside(d, a) for a in above))
    assert bad == []


def test_the_unit_fold():
    mods = {"specloop.realmodels.heads": Path("specloop/realmodels/heads/__init__.py"),
            "specloop.realmodels.heads.eagle": Path("specloop/realmodels/heads/eagle.py"),
            "specloop.realmodels.decoder": Path("specloop/realmodels/decoder.py"),
            "specloop.stats": Path("specloop/stats.py")}
    assert [_unit(m, mods) for m in mods] == ["specloop.realmodels.heads", "specloop.realmodels.heads",
                                             "specloop.realmodels.decoder", "specloop.stats"]


@pytest.mark.parametrize("package", ["specloop.strategies", "specloop.sim"])
def test_strategies_and_sim_load_no_torch_or_rl(package):
    heavy = ("torch", "gymnasium", "stable_baselines3")
    code = f"import sys, {package}; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    root = str(PACKAGE.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.stdout.strip() == "", f"import {package} loaded {out.stdout.strip()}"


def test_the_scan_sees_a_circle():
    """The checker itself: two modules importing each other inside functions form a circle."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b"]]


def test_every_package_docstring_lists_its_modules():
    """A newcomer reads a package's docstring for its map: each module and sub-package
    of a specloop package is named there."""
    import ast
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        pkg = init.parent
        names = [p.stem for p in pkg.glob("*.py") if p.stem != "__init__"]
        names += [p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        missing += [f"{pkg.relative_to(PACKAGE.parent)}/{n}" for n in names if f"`{n}`" not in doc]
    assert missing == [], f"not named in their package's docstring: {missing}"
