"""No import circles in the project: the modules of zoo, zoo.train, zoo.deploy and zoo.cli
(the repository folders zoo/, train/, deploy/, cli/) form an acyclic graph, counting every
import of a project module — at the top, inside a function, or for type checking only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"zoo": "zoo", "zoo.train": "train", "zoo.deploy": "deploy", "zoo.cli": "cli"}


def project_modules(root: Path) -> dict[str, Path]:
    """Module name → file, with the package-dir mapping of pyproject.toml."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in (root / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(root / folder).with_suffix("").parts]
            name = ".".join([package, *(p for p in parts if p != "__init__")])
            found[name] = path
    return found


def imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports (``from pkg import mod`` counts ``pkg.mod``;
    ``pkg`` itself only when a name that is not a module is taken from it)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            out |= {s for s in subs if s in modules}
            if any(s not in modules for s in subs):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_project_has_no_import_circle() -> None:
    modules = project_modules(ROOT)
    assert {"zoo.train.trainer", "zoo.deploy.serve.app", "zoo.cli.app"} <= set(modules)
    graph = {name: imported(path, modules) - {name} for name, path in modules.items()}
    assert cycles(graph) == []


def test_the_check_sees_a_circle_through_a_type_only_import(tmp_path: Path) -> None:
    for folder in PACKAGES.values():
        (tmp_path / folder).mkdir()
    (tmp_path / "train" / "a.py").write_text("from zoo.train.b import B\n")
    (tmp_path / "train" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from zoo.train import a\n"
    )
    (tmp_path / "zoo" / "c.py").write_text("def f():\n    import zoo.train.a\n")
    modules = project_modules(tmp_path)
    graph = {name: imported(path, modules) for name, path in modules.items()}
    assert cycles(graph) == [["zoo.train.a", "zoo.train.b"]]
    assert graph["zoo.c"] == {"zoo.train.a"}


@pytest.mark.parametrize("line", ["from zoo.train import durable", "import zoo.train.durable"])
def test_a_submodule_import_is_not_an_import_of_the_package(tmp_path: Path, line: str) -> None:
    for folder in PACKAGES.values():
        (tmp_path / folder).mkdir()
    (tmp_path / "train" / "__init__.py").write_text("from zoo.train.x import run\n")
    (tmp_path / "train" / "x.py").write_text(line + "\ndef run(): ...\n")
    (tmp_path / "train" / "durable.py").write_text("")
    modules = project_modules(tmp_path)
    graph = {name: imported(path, modules) - {name} for name, path in modules.items()}
    assert cycles(graph) == [] and graph["zoo.train.x"] == {"zoo.train.durable"}


def test_layers_point_one_way() -> None:
    """The trainer never imports the deploy side, and the core (``zoo/``) imports neither:
    what both need (preprocessing, TTA views) lives in the core."""
    modules = project_modules(ROOT)
    graph = {name: imported(path, modules) - {name} for name, path in modules.items()}
    lower = {"zoo.train": ("zoo.deploy", "zoo.cli")}  # and the core: every other layer
    layers = ("zoo.train", "zoo.deploy", "zoo.cli")
    upward = set()
    for a, deps in graph.items():
        if a == "zoo.__main__":  # the console entry point runs the CLI
            continue
        above = lower.get(a[:9]) if a.startswith("zoo.train") else None
        if above is None and not a.startswith(layers):
            above = layers
        upward |= {(a, b) for b in deps if above and b.startswith(above)}
    assert upward == set()
