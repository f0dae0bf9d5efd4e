"""The reader registry (recsys.data.formats): every decision about a format is its reader's, and a
format of one's own is detected, read in memory and prepared out of core as the built-in ones are."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import recsys
from recsys.config import ConfigError, DataConfig, load_config
from recsys.data import chunks
from recsys.data.errors import DataError
from recsys.data.formats import BUILT_IN, Reader, all_readers, reader_names, register_reader, unregister_reader
from recsys.data.prepare import prepare
from recsys.data.readers import detect_format, read_interactions
from recsys.run.settings import check

PACKAGE = Path(recsys.__file__).parent
GUIDE = PACKAGE.parent / "docs" / "data.md"


def _names(node: ast.AST | None) -> set[str]:
    """The strings an expression spells out: itself, or the items of a tuple, list or set literal."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def format_decisions(root: Path, formats: set[str]) -> list[str]:
    """Where code outside ``data/formats/`` decides by a format's name: in the data package any
    comparison with one (``fmt == "comirec"``) or table keyed by one (``{"csv": ","}``), elsewhere a
    comparison of a ``.format`` (``cfg.data.format in ("csv", "tsv")``). Other packages may name
    their own formats (the output file of ``recsys recommend`` is CSV or Parquet)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if root / "data" / "formats" in path.parents:
            continue
        in_data = root / "data" in path.parents
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                of_format = any(isinstance(op, ast.Attribute) and op.attr == "format" for op in operands)
                decides = (in_data or of_format) and bool(set().union(*map(_names, operands)) & formats)
            else:
                keys = node.keys if isinstance(node, ast.Dict) else []
                decides = in_data and bool(set().union(*map(_names, keys)) & formats)
            if decides:
                found.append(f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}")
    return found


def test_no_format_is_decided_by_its_name_outside_its_reader():
    assert not (found := format_decisions(PACKAGE, set(reader_names()))), "decided by a format's name:\n" + "\n".join(
        found
    )


def test_the_guard_finds_decisions_by_a_formats_name(tmp_path):
    root = tmp_path / "recsys"
    files = {
        "data/readers.py": 'def f(fmt):\n    return fmt == "comirec"\n',
        "data/chunks.py": 'SEPARATORS = {"csv": ",", "tsv": "\\t"}\n',
        "data/formats/comirec.py": 'def f(fmt):\n    return fmt in ("comirec", "csv")\n',
        "run/settings.py": 'def f(cfg):\n    return cfg.data.format in ("csv", "tsv")\n',
        "serve/batch.py": 'def f(fmt):\n    return fmt == "parquet"\n',  # an output file's format: not a reader's
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert format_decisions(root, {"comirec", "csv", "tsv", "parquet"}) == [
        "recsys/data/chunks.py:1",
        "recsys/data/readers.py:2",
        "recsys/run/settings.py:2",
    ]


def test_the_built_in_formats_are_registered_and_asked_in_order():
    assert reader_names() == ["comirec", "csv", "movielens", "parquet", "sequences", "tsv"]
    assert [reader.name for reader in all_readers()] == [reader.name for reader in BUILT_IN]


def test_data_format_takes_the_registered_names_and_refuses_others_naming_them(pipes):
    cfg = load_config(None, ["data.format=jsonl"])  # the schema lists no formats: the registry does
    with pytest.raises(ConfigError) as err:
        check(cfg)
    assert str(err.value) == "data.format: unknown format 'jsonl'; known: " + ", ".join(
        ["auto", "comirec", "csv", "movielens", "parquet", "pipes", "sequences", "tsv"]
    )
    with pytest.raises(ConfigError, match="data.format: unknown format 'jsonl'"):
        read_interactions(DataConfig(source="missing.jsonl", format="jsonl"))  # before the missing file
    check(load_config(None, ["data.format=pipes"]))


def test_a_reader_needs_a_name_of_its_own(pipes):
    with pytest.raises(ValueError, match="'pipes' registered twice"):
        register_reader(Pipes())
    with pytest.raises(ValueError, match="other than 'auto'"):
        register_reader(type("Auto", (Reader,), {"name": "auto"})())


class Pipes(Reader):
    """A toy format: a first line ``#pipes``, then ``user|item`` lines in click order (no times);
    the categories in the ``item,category`` file beside it named as the data with ``.cats``."""

    name = "pipes"

    def knows_line(self, line: str) -> bool:
        return line.strip() == "#pipes"

    def time_is_position(self, cfg: DataConfig) -> bool:
        return True

    def category_file(self, files: list[Path]) -> Path | None:
        path = files[0].with_suffix(".cats")
        return path if path.is_file() else None

    def read(self, path, cfg, skipped) -> pd.DataFrame:
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines()[1:], start=2):
            user, bar, item = line.partition("|")
            if not (bar and user.strip() and item.strip()):
                raise DataError(f"{path}:{lineno}: expected 'user|item', found {line!r}")
            rows.append((user, item))
        return pd.DataFrame(rows, columns=["user", "item"], dtype="str")


@pytest.fixture
def pipes():
    register_reader(Pipes())
    yield
    unregister_reader("pipes")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_registered_format_is_detected_and_read_in_memory(tmp_path, pipes):
    path = _write(tmp_path / "log" / "clicks.txt", "#pipes\nu1|a\nu2|b\nu1|c\n")
    _write(tmp_path / "log" / "clicks.cats", "a,x\nc,y\n")
    assert detect_format(path) == ("pipes", [path])  # asked before "sequences", which takes any first line
    assert detect_format(path.parent) == ("pipes", [path])  # a folder of one data file (.cats is not one)
    df = read_interactions(DataConfig(source=str(path.parent)))
    assert df["user"].tolist() == ["u1", "u2", "u1"] and df["item"].tolist() == ["a", "b", "c"]
    assert df["time"].tolist() == [0.0, 0.0, 1.0] and df.attrs["time_is_position"] is True
    assert df["category"].tolist()[::2] == ["x", "y"] and pd.isna(df["category"].iloc[1])
    named = read_interactions(DataConfig(source=str(path), format="pipes"))
    pd.testing.assert_frame_equal(named, df)
    bad = _write(tmp_path / "bad.txt", "#pipes\nu1|a\nu2\n")
    with pytest.raises(DataError, match=r"bad\.txt:3: expected 'user\|item'"):
        read_interactions(DataConfig(source=str(bad)))
    unregister_reader("pipes")
    assert detect_format(path)[0] == "sequences"  # a reader is asked only while registered


def test_a_registered_format_is_prepared_out_of_core_as_in_memory(tmp_path, pipes):
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from recsys.data.ondisk import prepare_on_disk
    from tests.data.test_data_ondisk import assert_same

    rng = np.random.default_rng(0)
    lines = [f"u{rng.integers(12)}|i{rng.integers(9)}" for _ in range(200)]
    path = _write(tmp_path / "clicks.txt", "#pipes\n" + "\n".join(lines) + "\n")
    _write(tmp_path / "clicks.cats", "".join(f"i{i},c{i % 3}\n" for i in range(0, 9, 2)))
    cfg = DataConfig(source=str(path), min_item_count=2, min_user_count=2)
    disk = prepare_on_disk(cfg, tmp_path / "ds")  # the default out-of-core form: the file as one chunk
    assert_same(prepare(read_interactions(cfg), cfg), disk)
    assert disk.times is None and len(disk.category_raw) > 1


@pytest.fixture
def jsonl():
    """docs/data.md, "Your own reader": its snippet, run as written (it registers "jsonl")."""
    snippet = GUIDE.read_text().split("### Your own reader", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    exec(compile(snippet, "docs/data.md", "exec"), {})
    yield
    unregister_reader("jsonl")


def _clicks(tmp_path: Path) -> tuple[Path, Path]:
    """The same clicks as JSON lines and as CSV: text ids with leading zeros and spaces, integer items."""
    clicks = pd.DataFrame(
        {
            "user": ["007", "7", "a b", "007", "7", "a b", "007"] * 3,
            "item": [3, 1, 2, 1, 3, 3, 2] * 3,
            "timestamp": list(range(1_700_000_000, 1_700_000_021)),
        }
    )
    clicks.to_json(tmp_path / "clicks.jsonl", orient="records", lines=True)
    clicks.to_csv(tmp_path / "clicks.csv", index=False)
    return tmp_path / "clicks.jsonl", tmp_path / "clicks.csv"


def test_the_data_guides_own_reader_is_detected_and_reads_as_csv(tmp_path, jsonl):
    as_json, as_csv = _clicks(tmp_path)
    assert detect_format(as_json) == ("jsonl", [as_json])
    check(load_config(None, ["data.format=jsonl"]))
    df, expected = read_interactions(DataConfig(source=str(as_json))), read_interactions(DataConfig(source=str(as_csv)))
    pd.testing.assert_frame_equal(df, expected)
    assert df.attrs["time_is_position"] is False
    bad = tmp_path / "bad" / "clicks.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"user": "u", "item": 1, "timestamp": 1}\n{"user": "", "item": 2, "timestamp": 2}\n')
    with pytest.raises(DataError, match=r"bad/clicks\.jsonl: row 2: empty user"):
        read_interactions(DataConfig(source=str(bad.parent)))  # a folder of one .jsonl file


def test_the_data_guides_own_reader_streams_out_of_core(tmp_path, jsonl, monkeypatch):
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from recsys.data.ondisk import prepare_on_disk
    from tests.data.test_data_ondisk import assert_same

    monkeypatch.setattr(chunks, "CHUNK_ROWS", 4)  # many chunks
    as_json, as_csv = _clicks(tmp_path)
    settings = {"min_item_count": 1, "min_user_count": 1}
    disk = prepare_on_disk(DataConfig(source=str(as_json), **settings), tmp_path / "ds")
    csv = DataConfig(source=str(as_csv), **settings)
    assert_same(prepare(read_interactions(csv), csv), disk)
    assert disk.times is not None
