"""The item table's seam: only recsys.items reads the table's parameters, and nothing outside it
names a form; everything else goes through ItemTable (lookups, weight, all, the step protocol)."""

import ast
from pathlib import Path

import recsys

PACKAGE = Path(recsys.__file__).parent
ITEMS = PACKAGE / "items"


def _reads_the_parameters(node: ast.AST) -> bool:
    """``x.table.weight`` or ``x.embedding.table``: the table's ``nn.Embedding`` or its parameter."""
    return isinstance(node, ast.Attribute) and (
        (node.attr == "weight" and isinstance(node.value, ast.Attribute) and node.value.attr == "table")
        or (node.attr == "table" and isinstance(node.value, ast.Attribute) and node.value.attr == "embedding")
    )


def _offenders(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if ITEMS in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _reads_the_parameters(node):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("recsys.items."):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} imports {node.module}")
    return found


def test_nothing_outside_recsys_items_reads_the_tables_parameters_or_names_a_form():
    assert _offenders(PACKAGE) == []


def test_the_check_finds_a_read_of_the_parameters(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "evaluator.py").write_text("def f(model):\n    return model.embedding.table.weight\n")
    (package / "trainer.py").write_text("from recsys.items.row_sparse import RowSparseTable\n")
    assert _offenders(package) == [
        "pkg/evaluator.py:2",
        "pkg/evaluator.py:2",
        "pkg/trainer.py:1 imports recsys.items.row_sparse",
    ]
