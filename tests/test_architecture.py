"""The import graph of recsys/: every import goes down the layers, and no modules import each other
in a circle. And no function outside the kernels is longer than a screen (:data:`MAX_FUNCTION_LINES`).

The layers, lowest first (a package or top-level module of recsys is a *unit*; a unit imports only
itself and units of lower layers; units of one layer are independent of each other):

- ``io``, ``config``, ``progress``, ``extras``, ``text``: the ground floor, importing nothing else of recsys;
- ``device``, ``data``, ``kernels``, ``retrieval``;
- ``nn`` (layers on the kernels), then ``items`` (the item table), then ``models``;
- ``evaluate`` and ``run`` (a run directory builds its experiment from data and models);
- ``train`` (writes runs, validates with evaluate), then ``tune``, ``serve``, ``plots``;
- ``api``, then ``cli`` and the package's own ``__init__``, then ``__main__``.

Every import counts, also those inside functions and under ``TYPE_CHECKING``: an import deferred
into a function still runs upward, and deferring one only hides a circle.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import recsys

PACKAGE = Path(recsys.__file__).parent
LAYERS = (
    {"io", "config", "progress", "extras", "text"},
    {"device", "data", "kernels", "retrieval"},
    {"nn"},
    {"items"},
    {"models"},
    {"evaluate", "run"},
    {"train"},
    {"tune", "serve", "plots"},
    {"api"},
    {"cli", "recsys"},  # "recsys": the package itself (its names come from api)
    {"__main__"},
)
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """``recsys/kernels/attention/op.py`` -> ``recsys.kernels.attention.op`` (a package's
    ``__init__.py`` is the package)."""
    parts = (root.name, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The recsys modules ``module`` imports: ``from a.b import c`` is ``a.b.c`` where that is a
    module of ``known``, else ``a.b``; relative imports are resolved against ``module``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(package + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {name for name in found if name == "recsys" or name.startswith("recsys.")}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` over every ``.py`` file under ``root``."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    return {
        name: imported_modules(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", known) - {name}
        for name, path in files.items()
    }


def unit(module: str) -> str:
    """The unit of a module: ``recsys.kernels.attention.op`` -> ``kernels``; ``recsys`` -> ``recsys``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a unit from a unit of its own layer or a higher one (or not in :data:`LAYERS`)."""
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit(module), unit(target)
            if a != b and (a not in RANK or b not in RANK or RANK[b] >= RANK[a]):
                bad.append(f"{module} imports {target} ({a} -> {b})")
    return bad


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as the modules along it, or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return err.args[1]
    return None


GRAPH = import_graph()


def test_every_unit_has_a_layer():
    assert {unit(m) for m in GRAPH} <= set(RANK), sorted({unit(m) for m in GRAPH} - set(RANK))


def test_imports_go_down_the_layers():
    assert not (bad := upward_imports(GRAPH)), "imports against the layers:\n" + "\n".join(bad)


def test_no_circle_of_imports():
    assert (cycle := find_cycle(GRAPH)) is None, "circle of imports: " + " -> ".join(cycle)


@pytest.fixture
def tiny_package(tmp_path) -> Path:
    """A package ``recsys`` whose data imports run (upward) and whose kernels' op and triton
    modules import each other (the second one inside a function)."""
    root = tmp_path / "recsys"
    files = {
        "__init__.py": "",
        "data/__init__.py": "from recsys.run import layout\n",
        "run/__init__.py": "",
        "run/layout.py": "from recsys.config import Config\n",
        "config.py": "",
        "kernels/__init__.py": "from .attention import op\n",
        "kernels/attention/__init__.py": "",
        "kernels/attention/op.py": "from recsys.kernels.attention import triton\n",
        "kernels/attention/triton.py": "def f():\n    from . import op\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checks_find_an_upward_import_and_a_circle(tiny_package):
    graph = import_graph(tiny_package)
    assert graph["recsys.data"] == {"recsys.run.layout"}
    assert graph["recsys.kernels"] == {"recsys.kernels.attention.op"}
    assert upward_imports(graph) == ["recsys.data imports recsys.run.layout (data -> run)"]
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"recsys.kernels.attention.op", "recsys.kernels.attention.triton"}


MAX_FUNCTION_LINES = 60  # from ``def`` to the function's last line, docstring included


def qualified_functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function (methods and nested functions too) under ``node``, by its qualified name
    (``Class.method``, ``outer.inner``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not isinstance(child, ast.ClassDef):
                yield prefix + child.name, child
            yield from qualified_functions(child, f"{prefix}{child.name}.")
        else:
            yield from qualified_functions(child, prefix)


def long_functions(root: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"recsys/path.py::qualified.name": lines}`` of every function under ``root`` longer than
    ``limit`` lines, counted from its ``def`` line to its last (decorators not counted); the
    kernels (``kernels/``) are left out: a kernel and its twins are long by nature."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "kernels":
            continue
        for name, node in qualified_functions(ast.parse(path.read_text(), str(path))):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found[f"{root.name}/{relative.as_posix()}::{name}"] = lines
    return found


LONG = long_functions()


def test_no_function_outside_the_kernels_is_longer_than_a_screen():
    assert not LONG, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): " + ", ".join(
        f"{name} ({lines})" for name, lines in sorted(LONG.items())
    )


def test_the_length_check_counts_methods_and_nested_functions_and_skips_the_kernels(tmp_path):
    root = tmp_path / "recsys"
    body = "".join(f"    x{i} = {i}\n" for i in range(60))  # a def line and 60 more: 61 lines
    files = {
        "short.py": "def f():\n" + body[: -len("    x59 = 59\n")],
        "long.py": "@decorated\ndef f():\n" + body + "class C:\n    def m(self):\n" + body.replace("    ", "        "),
        "nested.py": "def outer():\n    def inner():\n" + body.replace("    ", "        "),
        "kernels/op.py": "def f():\n" + body,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert long_functions(root) == {
        "recsys/long.py::f": 61,
        "recsys/long.py::C.m": 61,
        "recsys/nested.py::outer": 62,
        "recsys/nested.py::outer.inner": 61,
    }
