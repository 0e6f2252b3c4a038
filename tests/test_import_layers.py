"""The package's import layers: no import circles, nothing outside `specloop.cli`
imports `specloop.cli` (the ``python -m specloop`` entry point aside), and `sim` and
`realmodels` never import each other. Every import counts, including those inside
functions (issue 17: four circles before, among them the ltd commands and the two
drafter registries)."""
from __future__ import annotations

import ast
from pathlib import Path

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


def test_the_scan_sees_a_circle():
    """The checker itself: two modules importing each other inside functions form a circle."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b"]]
