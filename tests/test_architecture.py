"""The architecture's rules, read from the sources: no import cycle between the packages of
`gpu_arbiter` (the import rule is the architecture), and no class in the engine or the control
plane so large that a reader cannot find one question's answer in it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpu_arbiter"
MAX_CLASS_LINES = 600


def _imported(tree: ast.AST, module: tuple[str, ...]) -> set[str]:
    """The names a module imports (`module`: its path parts under `gpu_arbiter`, without .py),
    anywhere in it (a function-level import is an edge too), relative imports resolved; for
    `from X import n`, both X and X.n (n may be a module)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["gpu_arbiter", *module[: len(module) - node.level]]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def package_graph(src: Path) -> dict[str, set[str]]:
    """Which top-level packages (or top-level modules) of `src` import which others."""
    graph: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts == ("__init__",):
            continue
        own = parts[0]
        edges = graph.setdefault(own, set())
        for name in _imported(ast.parse(path.read_text()), parts):
            dotted = name.split(".")
            if dotted[0] == "gpu_arbiter" and len(dotted) > 1 and dotted[1] != own:
                edges.add(dotted[1])
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one package (Tarjan's algorithm), each as a
    sorted list: a group is a set of packages that import each other through some path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_packages():
    graph = package_graph(SRC)
    assert {"domain", "engine", "control", "web", "cli"} <= set(graph)  # the walk saw the tree
    assert cycles(graph) == []
    assert "control" in graph["web"] and "web" in graph["server"]  # the dashboard sits above


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        ({"a/x.py": "from gpu_arbiter.b import y", "b/y.py": "import gpu_arbiter.a.x"}, ["a", "b"]),
        ({"a/x.py": "from ..b import y", "b/y.py": "from gpu_arbiter.c import z"}, []),
        (
            {
                "a/x.py": "from ..b.y import f",
                "b/y.py": "def f():\n    from gpu_arbiter.c import z",
                "c/__init__.py": "from .. import a",
            },
            ["a", "b", "c"],
        ),
        ({"a/__init__.py": "from . import x", "a/x.py": "from .y import f"}, []),
    ],
)
def test_the_check_finds_a_cycle(tmp_path, files, cycle):
    """The check itself: an edge through a relative or a function-level import counts."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    assert cycles(package_graph(tmp_path)) == ([cycle] if cycle else [])


def oversized_classes(root: Path, limit: int) -> list[str]:
    """Classes under `root` of more than `limit` lines (decorators to the last line), as
    "path:Class (lines)"."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.name} ({lines})")
    return found


@pytest.mark.parametrize("package", ["engine", "control"])
def test_no_class_of_the_engine_or_the_control_plane_is_over_600_lines(package):
    assert oversized_classes(SRC / package, MAX_CLASS_LINES) == []


def test_the_size_check_counts_a_class_from_its_decorator_to_its_end(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    (tmp_path / "m.py").write_text(f"@decorated\nclass Big:\n{body}\n\nclass Small:\n    y = 1\n")
    assert oversized_classes(tmp_path, 6) == [f"{tmp_path.name}/m.py:Big (7)"]
    assert oversized_classes(tmp_path, 7) == []
