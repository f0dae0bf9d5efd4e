"""Item feature files: every supported format becomes one :class:`RawFeatures` table, checked.

``data.item_features`` names the file; its format follows from its name (under any compression,
``.gz``, ``.bz2``, ``.xz``, as the click files):

- ``.csv`` / ``.tsv``: a header row naming ``data.feature_item_col`` and the attribute columns;
  every column but the item and the vector column (``data.feature_vector_col``) is an attribute.
  A cell holds one value, several separated by ``|`` (:data:`VALUE_SEPARATOR`), or none (empty).
  The vector column holds its numbers separated by ``|`` too.
- ``.parquet`` / ``.pq``: the same columns; an attribute column holds values (text, integers, ...)
  or lists of values, the vector column lists (or fixed-size lists) of numbers (needs ``pyarrow``).
- ``.json``: one object mapping item -> its values (``{"4": [1, 2, 3]}``, amazon-beauty's
  ``item_attributes.json``: one field, named :data:`JSON_FIELD`), or item -> an object of fields
  (``{"4": {"brand": "x", "tags": ["a", "b"], "emb": [0.1, 0.2]}}``).
- ``.jsonl`` / ``.ndjson``: one object a line, ``data.feature_item_col`` naming its item
  (``{"item": "4", "brand": "x", "tags": ["a", "b"]}``).
- ``u.item``: MovieLens 100K's item file; its genres (multi-label flags, named by ``u.genre``
  beside it) are the field ``genre``.

Values are text, trimmed of surrounding blanks (an empty one is no value); numbers read as their
text under the id rule (:mod:`recsys.data.ids`: ``3.0`` is ``3``), as are item ids.

Malformed input raises :class:`DataError` naming ``file:line`` (Parquet: ``file: row N``) and the
column or field, in one line: a missing item column, an empty item, an item listed twice (each
item takes one row: a second row of an item is an error, not merged), a vector whose length
differs from the first vector's, a vector value that is missing, NaN or infinite, a JSON value
that is neither a value nor a list of values, and the click readers' own problems of delimited
text (too many fields, a quote left open, text that is not UTF-8). ``data.skip_bad_rows`` drops
such rows (a repeated item: its later rows) instead, with one :class:`DataWarning` for the file,
as the click readers do; a quote never closed and JSON that does not parse as a whole stop even
then.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.errors import DataError
from recsys.data.formats.movielens import movielens_genres
from recsys.data.ids import canonical_ids
from recsys.data.linescan import LINE_BREAK, Layout, first_record, scan_file
from recsys.data.rows import SKIP_HINT, Skipped, as_str, flagged, invalid_by_role
from recsys.data.sources import data_suffix, decoding, open_data
from recsys.data.tables import read_table
from recsys.extras import install_hint

__all__ = ["JSON_FIELD", "VALUE_SEPARATOR", "RawFeatures", "read_feature_file"]

VALUE_SEPARATOR = "|"  # between the values of one CSV/TSV cell (a value cannot hold it)
JSON_FIELD = "attributes"  # the field of a JSON object mapping each item to its values
MOVIELENS_FIELD = "genre"
_ReadTable = Callable[[Path, DataConfig, Skipped], "_Table"]
_BLANKS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


@dataclass
class RawFeatures:
    """A feature file as read and checked, before its items get ids: one row per item, in file order.

    ``items [n]`` str: the raw item ids (under the id rule); ``fields``: name -> ``(rows [nnz]
    int64, values [nnz] str)``, the row of each value (COO: a row holds any number of values, in
    file order, repeats included); ``vectors [n, D]`` float32 (zeros where ``has_vector [n]`` is
    false) or ``None`` without a vector column.
    """

    path: Path
    items: np.ndarray
    fields: dict[str, tuple[np.ndarray, np.ndarray]]
    vectors: np.ndarray | None = None
    has_vector: np.ndarray | None = None


def read_feature_file(cfg: DataConfig) -> RawFeatures:
    """Read ``cfg.item_features`` (see the module docstring for formats and errors)."""
    path = Path(cfg.item_features)
    if not path.is_file():
        raise DataError(f"data.item_features: {path} is not a file")
    read = _read_movielens if path.name == "u.item" else _BY_SUFFIX.get(data_suffix(path))
    if read is None:
        names = ", ".join([*_BY_SUFFIX, "u.item"])
        raise DataError(f"{path}: not a feature file recsys reads (by its name: {names}; or .gz, .bz2, .xz of them)")
    skipped = Skipped()
    with decoding(path):
        table = read(path, cfg, skipped)
    raw = table.checked(path, cfg, skipped)
    skipped.warn(path, 1)
    return raw


@dataclass
class _Table:
    """A feature file's rows as read, before the checks every format shares (:meth:`checked`)."""

    items: np.ndarray  # [n] str: raw item text, "" where missing
    fields: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (rows [nnz], values [nnz] str), blanks dropped
    lengths: np.ndarray | None  # [n] int64: values of each row's vector, -1 where it has none
    flat: np.ndarray | None  # [lengths[lengths > 0].sum()] float64: the vectors' values, row after row
    locate: Callable[[], np.ndarray]  # -> [n] int64: the line (or row) of each row, for messages
    unit: str = "line"  # "line" or "row" (Parquet)
    noun: str = "column"  # "column" or "field" (JSON)
    item_label: str = ""  # where the item id is, for messages; "": the noun and data.feature_item_col
    problems: dict[int, str] = field(default_factory=dict)  # row -> why it is malformed, found while reading
    _where: np.ndarray | None = field(default=None, repr=False)

    def where(self) -> np.ndarray:
        """``[n]`` int64: the line (or row) of each row, found on first use."""
        if self._where is None:
            self._where = self.locate()
        return self._where

    def checked(self, path: Path, cfg: DataConfig, skipped: Skipped) -> RawFeatures:
        """The rows that pass the shared checks (empty item, vectors, repeated items): the first
        problem raised naming its line and column, or with ``cfg.skip_bad_rows`` the rows dropped
        and counted in ``skipped``."""
        n = len(self.items)
        problems = dict(self.problems)
        item_col = self.item_label or f"{self.noun} {cfg.feature_item_col!r}"
        for row in np.flatnonzero(np.char.str_len(np.char.strip(self.items)) == 0).tolist():
            problems.setdefault(row, f"empty item ({item_col})")
        problems |= {row: why for row, why in self._vector_problems(cfg).items() if row not in problems}
        items = canonical_ids(self.items)
        good = np.ones(n, dtype=bool)
        good[list(problems)] = False
        ids = pd.Series(items[good], index=np.flatnonzero(good))
        repeated = ids.duplicated(keep="first")
        if repeated.any():
            first = pd.Series(ids.index[~repeated], index=ids[~repeated].to_numpy())  # item -> its first row
            for row, item in ids[repeated].items():
                problems[row] = (
                    f"item {item!r} again ({item_col}; its first row is {self.unit} {self.where()[first[item]]}): "
                    "an item takes one row"
                )
        if problems:
            where = self.where()
            if not cfg.skip_bad_rows:
                row = min(problems)
                at = f"{path}:{where[row]}" if self.unit == "line" else f"{path}: {self.unit} {where[row]}"
                raise DataError(f"{at}: {problems[row]}{SKIP_HINT}")
            rows = sorted(problems)
            skipped.add(path, [(int(where[r]), int(where[r])) for r in rows], unit=self.unit)
        keep = np.ones(n, dtype=bool)
        keep[list(problems)] = False
        renumber = np.cumsum(keep) - 1  # old row -> new row, where kept
        fields = {
            name: (renumber[rows[keep[rows]]], values[keep[rows]]) for name, (rows, values) in self.fields.items()
        }
        vectors = has_vector = None
        if self.lengths is not None and self.flat is not None:
            has = self.lengths > 0
            if not (has & keep).any():
                raise DataError(
                    f"{path}: no vectors in {self.noun} {cfg.feature_vector_col!r} (data.feature_vector_col)"
                )
            dim = int(self.lengths[has][0])
            value_row = np.repeat(np.arange(n), np.maximum(self.lengths, 0))
            has_vector = (has & keep)[keep]
            vectors = np.zeros((int(keep.sum()), dim), dtype=np.float32)
            vectors[has_vector] = self.flat[keep[value_row]].reshape(-1, dim)
        return RawFeatures(path, items[keep], fields, vectors, has_vector)

    def _vector_problems(self, cfg: DataConfig) -> dict[int, str]:
        """Row -> what is wrong with its vector: empty, another length than the first one's, or
        a value that is not a finite number."""
        if self.lengths is None or self.flat is None:
            return {}
        col = f"{self.noun} {cfg.feature_vector_col!r}"
        problems = dict.fromkeys(np.flatnonzero(self.lengths == 0).tolist(), f"{col}: an empty vector")
        has = np.flatnonzero(self.lengths > 0)
        if len(has):
            dim = int(self.lengths[has[0]])
            for row in has[self.lengths[has] != dim].tolist():
                problems[row] = (
                    f"{col}: a vector of {self.lengths[row]} values; the first one "
                    f"({self.unit} {self.where()[has[0]]}) has {dim}"
                )
        value_row = np.repeat(np.arange(len(self.lengths)), np.maximum(self.lengths, 0))
        starts = np.cumsum(np.maximum(self.lengths, 0)) - np.maximum(self.lengths, 0)
        for at in np.flatnonzero(~np.isfinite(self.flat)).tolist():
            row = int(value_row[at])
            problems.setdefault(row, f"{col}: value {at - starts[row] + 1} is {self.flat[at]} (not a finite number)")
        return problems


def _read_delimited(path: Path, sep: str, cfg: DataConfig, skipped: Skipped) -> _Table:
    """A CSV or TSV feature file, cut into fields by the click readers' parser and line scan
    (malformed lines raise, or are dropped into ``skipped``, as theirs are)."""
    lineno, names = first_record(path, sep)
    header = [name.strip() for name in names]
    for name, setting in ((cfg.feature_item_col, "feature_item_col"), (cfg.feature_vector_col, "feature_vector_col")):
        if name and name not in header:
            raise DataError(f"{path}:{lineno}: no column {name!r} (data.{setting}); the header has {header}")
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise DataError(f"{path}:{lineno}: the header names column {twice[0]!r} more than once")
    roles = {"item" if name == cfg.feature_item_col else repr(name): i for i, name in enumerate(header)}
    layout = Layout(sep=sep, header=True, ncols=len(header), fields=roles, required=("item",))
    df = read_table(path, layout, cfg.skip_bad_rows, skipped).reset_index(drop=True)
    vector = repr(cfg.feature_vector_col)
    fields = {
        name: _split_cells(df[repr(name)])
        for name in header
        if name not in (cfg.feature_item_col, cfg.feature_vector_col)
    }
    lengths = flat = None
    if cfg.feature_vector_col:
        rows, text = _split_cells(df[vector])
        lengths = np.bincount(rows, minlength=len(df)).astype(np.int64)
        lengths[lengths == 0] = -1  # an empty cell: no vector
        flat = pd.to_numeric(pd.Series(text, dtype="str"), errors="coerce").to_numpy(np.float64)
    return _Table(df["item"].to_numpy(dtype=str), fields, lengths, flat, lambda: _lines(path, layout))


def _split_cells(cells: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Cells ``[n]`` (text) -> ``(rows [nnz] int64, values [nnz] str)`` of the values
    :data:`VALUE_SEPARATOR` separates in them, trimmed; empty values dropped."""
    values = cells.str.split(VALUE_SEPARATOR, regex=False).explode().str.strip()
    keep = (values.notna() & (values != "")).to_numpy(bool)
    return values.index.to_numpy(np.int64)[keep], values.to_numpy(dtype=str)[keep]


def _lines(path: Path, layout: Layout) -> np.ndarray:
    """``[n]`` the line of each row :func:`~recsys.data.readers._read_table` returned: the line scan
    again (only when a message needs a line), its malformed records dropped as the read dropped them."""
    scan = scan_file(path, layout, skip=True)
    good = ~flagged(invalid_by_role(scan.text, layout.required), len(scan.text))
    return np.asarray(scan.starts, dtype=np.int64)[good]


def _read_parquet(path: Path, cfg: DataConfig) -> _Table:
    """A Parquet feature file: attribute columns of values or lists of values, the vector column
    of lists of numbers."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as err:
        raise DataError(f"{path}: reading Parquet needs pyarrow ({install_hint('parquet')})") from err
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable Parquet file ({err})") from err
    names = table.column_names
    for name, setting in ((cfg.feature_item_col, "feature_item_col"), (cfg.feature_vector_col, "feature_vector_col")):
        if name and name not in names:
            raise DataError(f"{path}: no column {name!r} (data.{setting}); the columns are {names}")
    n = table.num_rows
    items = as_str(table.column(cfg.feature_item_col).to_pandas()).fillna("").to_numpy(dtype=str)
    fields = {}
    for name in names:
        if name in (cfg.feature_item_col, cfg.feature_vector_col):
            continue
        column = table.column(name).combine_chunks()
        rows: Any = np.arange(n)
        if _is_list(pa, column.type):
            rows, column = pc.list_parent_indices(column).to_numpy(), pc.list_flatten(column)
        if pa.types.is_nested(column.type):
            raise DataError(
                f"{path}: column {name!r} holds {table.schema.field(name).type}, not values or lists of values"
            )
        text = as_str(column.to_pandas()).str.strip()
        keep = (text.notna() & (text != "")).to_numpy(bool)
        fields[name] = (np.asarray(rows, dtype=np.int64)[keep], text.to_numpy(dtype=str)[keep])
    lengths = flat = None
    if cfg.feature_vector_col:
        column = table.column(cfg.feature_vector_col).combine_chunks()
        kind = column.type
        if not (_is_list(pa, kind) and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type))):
            raise DataError(
                f"{path}: column {cfg.feature_vector_col!r} (data.feature_vector_col) holds {kind}, "
                "not lists of numbers"
            )
        lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy().astype(np.int64)
        flat = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.float64)
    return _Table(items, fields, lengths, flat, lambda: np.arange(1, n + 1), unit="row")


def _is_list(pa: Any, kind: Any) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _read_json(path: Path, cfg: DataConfig, *, lines: bool) -> _Table:
    """A JSON object ``{item: values or {field: values}}``, or JSON lines of objects."""
    with open_data(path) as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path}:{line}: not valid utf-8 text") from None
    if lines:
        return _json_lines(path, text, cfg)
    starts = [0] + [m.end() for m in LINE_BREAK.finditer(text)]  # where each line starts
    entries = _json_object(path, text)
    where = np.array([bisect_right(starts, at) for at, _, _ in entries], dtype=np.int64)
    records = [(key, value if isinstance(value, dict) else {JSON_FIELD: value}) for _, key, value in entries]
    return _records(cfg, where, records, item_label="the key")


def _json_object(path: Path, text: str) -> list[tuple[int, str, Any]]:
    """The top-level ``(offset, key, value)`` entries of a JSON object, in file order, repeated keys
    kept (``json.loads`` would keep the last silently); a syntax error names its line."""
    decoder = json.JSONDecoder()
    entries = []
    try:
        at = _after_blanks(text, 0)
        if not text.startswith("{", at):
            line = text.count("\n", 0, at) + 1
            raise DataError(
                f"{path}:{line}: expected a JSON object {{item: values}} (JSON lines: name the file .jsonl)"
            )
        at = _after_blanks(text, at + 1)
        while not text.startswith("}", at):
            if not text.startswith('"', at):
                raise json.JSONDecodeError("expected an item id in double quotes", text, at)
            key, end = decoder.raw_decode(text, at)
            end = _after_blanks(text, end)
            if not text.startswith(":", end):
                raise json.JSONDecodeError("expected ':'", text, end)
            value, end = decoder.raw_decode(text, _after_blanks(text, end + 1))
            entries.append((at, key, value))
            at = _after_blanks(text, end)
            if text.startswith(",", at):
                at = _after_blanks(text, at + 1)
            elif not text.startswith("}", at):
                raise json.JSONDecodeError("expected ',' or '}'", text, at)
        rest = _after_blanks(text, at + 1)
        if rest < len(text):
            raise json.JSONDecodeError("more after the object", text, rest)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from None
    return entries


def _after_blanks(text: str, at: int) -> int:
    """The offset of the first character at or after ``at`` that is not JSON whitespace."""
    match = _BLANKS.match(text, at)
    return match.end() if match else at


def _json_lines(path: Path, text: str, cfg: DataConfig) -> _Table:
    """One JSON object a line; a line that does not parse, is not an object or lacks the item
    field is a malformed row."""
    where: list[int] = []
    records: list[tuple[Any, dict[str, Any]]] = []
    problems: dict[int, str] = {}
    for lineno, line in enumerate(LINE_BREAK.split(text), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            value, problem = {}, f"not valid JSON ({err.msg}, column {err.colno})"
        else:
            problem = "" if isinstance(value, dict) else "expected a JSON object {field: value, ...}"
        if not problem and cfg.feature_item_col not in value:
            problem = f"no field {cfg.feature_item_col!r} (data.feature_item_col)"
        elif not problem and not isinstance(value[cfg.feature_item_col], (str, int, float)):
            problem = (
                f"field {cfg.feature_item_col!r}: expected an item id, found {_shown(value[cfg.feature_item_col])}"
            )
        if problem:
            problems[len(records)] = problem
            value = {}
        item = value.pop(cfg.feature_item_col, "")
        where.append(lineno)
        records.append((item, value))
    table = _records(cfg, np.array(where, dtype=np.int64), records)
    table.problems |= problems
    return table


def _records(
    cfg: DataConfig, where: np.ndarray, records: list[tuple[Any, dict[str, Any]]], *, item_label: str = ""
) -> _Table:
    """Items and their fields as parsed JSON values (``where [n]``: the line of each; ``item_label``:
    where the item id is, for messages) -> a table; a value that is neither a value nor a list of
    values, or a vector that is not a list of numbers, makes its row's problem."""
    fields: dict[str, tuple[list[int], list[str]]] = {}
    lengths = np.full(len(records), -1, dtype=np.int64)
    flat: list[float] = []
    problems: dict[int, str] = {}
    for row, (_, values) in enumerate(records):
        for name, value in values.items():
            if name == cfg.feature_vector_col:
                if value is None:
                    continue
                if not isinstance(value, list) or not all(_is_number(v) or v is None for v in value):
                    problems.setdefault(row, f"field {name!r}: expected a list of numbers, found {_shown(value)}")
                    continue
                lengths[row] = len(value)
                flat.extend(np.nan if v is None else float(v) for v in value)
                continue
            listed = value if isinstance(value, list) else [value]
            if not all(isinstance(v, (str, int, float)) or v is None for v in listed):  # bool is an int
                problems.setdefault(row, f"field {name!r}: expected a value or a list of values, found {_shown(value)}")
                continue
            rows, texts = fields.setdefault(name, ([], []))
            for v in listed:
                text = "" if v is None else str(v).strip()
                if text:
                    rows.append(row)
                    texts.append(text)
    items = np.array(["" if item is None else str(item) for item, _ in records], dtype=str)
    return _Table(
        items,
        {name: (np.array(rows, dtype=np.int64), np.array(texts, dtype=str)) for name, (rows, texts) in fields.items()},
        lengths if cfg.feature_vector_col else None,
        np.array(flat, dtype=np.float64) if cfg.feature_vector_col else None,
        lambda: where,
        noun="field",
        item_label=item_label,
        problems=problems,
    )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object, limit: int = 60) -> str:
    """A JSON value as a message shows it: its JSON, cut at ``limit`` characters."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_movielens(path: Path, cfg: DataConfig, skipped: Skipped) -> _Table:
    """MovieLens 100K's ``u.item``: its genres as one multi-valued field."""
    genres = movielens_genres(path)
    records = [(item, {MOVIELENS_FIELD: g}) for item, g in zip(genres["item"], genres["genres"])]
    return _records(cfg, genres["line"].to_numpy(np.int64), records, item_label="field 1")


# a feature file's reader by its name's ending (under any compression)
_BY_SUFFIX: dict[str, _ReadTable] = {
    ".csv": lambda path, cfg, skipped: _read_delimited(path, ",", cfg, skipped),
    ".tsv": lambda path, cfg, skipped: _read_delimited(path, "\t", cfg, skipped),
    ".parquet": lambda path, cfg, skipped: _read_parquet(path, cfg),
    ".pq": lambda path, cfg, skipped: _read_parquet(path, cfg),
    ".json": lambda path, cfg, skipped: _read_json(path, cfg, lines=False),
    ".jsonl": lambda path, cfg, skipped: _read_json(path, cfg, lines=True),
    ".ndjson": lambda path, cfg, skipped: _read_json(path, cfg, lines=True),
}
