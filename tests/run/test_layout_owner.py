"""Only recsys/run/ knows the names of a run's files: no other module of the package has a
string constant naming one (docstrings may still mention them). The manifest's own file name is
defined where its format is (recsys/io/manifest.py) and taken from there by the run layout."""

import ast
from pathlib import Path

import recsys
from recsys.run import layout

PACKAGE = Path(recsys.__file__).parent
FILE_NAMES = (layout.CONFIG, layout.CHECKPOINT, layout.BEST, layout.METRICS, layout.TEST_METRICS, layout.MANIFEST)
FOLDER_NAMES = (layout.DATASET, layout.INDEX, layout.EXPORT, layout.TENSORBOARD)
MANIFEST_FORMAT = PACKAGE / "io" / "manifest.py"


def _code_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant that is not a docstring."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def _path_joins(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of every ``something / "name"`` with a string on the right."""
    return [
        (node.lineno, node.right.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and isinstance(node.right, ast.Constant)
        and isinstance(node.right.value, str)
    ]


def test_no_module_outside_run_names_a_run_file():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "run") in path.parents:
            continue
        tree = ast.parse(path.read_text(), str(path))
        names = [n for n in FILE_NAMES if not (path == MANIFEST_FORMAT and n == layout.MANIFEST)]
        for line, text in _code_strings(tree):
            offenders += [f"{path}:{line}: {name!r}" for name in names if name in text]
        offenders += [f"{path}:{line}: / {name!r}" for line, name in _path_joins(tree) if name in FOLDER_NAMES]
    assert not offenders, "run file names outside recsys/run/:\n" + "\n".join(offenders)


def test_the_check_finds_a_file_name():
    tree = ast.parse('"""Mentions config.json in a docstring."""\np = run / "dataset"\nq = "x/best.pt"\n')
    assert sorted(text for _, text in _code_strings(tree)) == ["dataset", "x/best.pt"]
    assert _path_joins(tree) == [(2, "dataset")]
