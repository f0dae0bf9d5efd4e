"""Preparation out of core: a click log of any size -> a saved :class:`~recsys.data.prepare.Dataset`
folder, in bounded memory.

The same dataset :func:`~recsys.data.prepare.prepare` builds in memory (same filter, ids, order and
categories, so the two are interchangeable; the tests compare them), built by DuckDB with a memory
limit, spilling to disk beside the target:

1. read: :func:`~recsys.data.chunks.read_chunks` appends the log to a DuckDB table, each row with
   its row number (``rn``), so ties keep the file's order;
2. map: raw user and item ids become integer codes;
3. filter: ComiRec's item then user counts (``data.kcore``: until a pass removes nothing), as
   :func:`~recsys.data.prepare.filter_counts`;
4. ids: the kept items and users (a row each, fetched into memory) are numbered by
   :func:`~recsys.data.prepare.popularity_order` and :func:`~recsys.data.prepare.raw_order`;
5. write: clicks sorted by (user, time, row) stream into ``items.npy`` and ``times.npy``.

DuckDB was chosen over Polars' streaming engine and PyArrow datasets by ``benchmarks/prepare.py``
(docs/results.md): it sorts, joins and groups out of core under a memory limit.
The folder is published atomically (:func:`recsys.io.files.atomic_folder`): a killed preparation
leaves only a temporary folder that no reader opens and the next preparation removes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.chunks import ClickSource, open_source, read_chunks
from recsys.data.prepare import PAD, UNKNOWN, Dataset, category_ids, popularity_order, raw_order
from recsys.data.readers import DataError
from recsys.io.files import atomic_folder
from recsys.progress import progress_bar

MEMORY_LIMIT = os.environ.get("RECSYS_PREPARE_MEMORY", "1GB")  # DuckDB's buffer pool; it spills beyond
_WRITE_ROWS = 1 << 20  # clicks per batch fetched from the sorted result


def prepare_on_disk(cfg: DataConfig, target: str | Path, *, progress: bool = False) -> Dataset:
    """Prepare ``cfg.source`` into the dataset folder ``target`` and open it (memory-mapped).

    Needs DuckDB (``pip install 'recsys[scale]'``). Errors are the in-memory path's: a malformed
    row names its file and line; no clicks left after filtering names the settings.
    """
    duckdb = _duckdb()
    src = open_source(cfg)
    target = Path(target)
    with atomic_folder(target) as out:
        con = duckdb.connect(str(out / "engine.duckdb"))
        try:
            con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
            con.execute(f"SET temp_directory = '{out / 'spill'}'")
            con.execute("SET preserve_insertion_order = false")
            con.execute("SET enable_progress_bar = false")
            with_time = _read(con, src, progress)
            _build(con, cfg, src, out, with_time=with_time, progress=progress)
        finally:
            con.close()
        for scratch in (out / "engine.duckdb", out / "engine.duckdb.wal"):
            scratch.unlink(missing_ok=True)
        shutil.rmtree(out / "spill", ignore_errors=True)
    return Dataset.load(target)


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as err:
        raise DataError(
            "preparing a log out of core needs duckdb (pip install 'recsys[scale]'), or set data.prepare=memory"
        ) from err
    return duckdb


def _read(con: Any, src: ClickSource, progress: bool) -> bool:
    """Stage 1: the log into table ``raw(rn, user, item[, time][, category])``; whether it has times."""
    columns: list[str] | None = None
    rows = 0
    with progress_bar(src.size, f"data: reading {src.cfg.source}", enabled=progress, unit="B") as bar:
        bar.unit_scale = True
        for chunk in read_chunks(src, advance=bar.update):
            chunk.insert(0, "rn", np.arange(rows, rows + len(chunk), dtype=np.int64))
            if columns is None:
                columns = list(chunk.columns)
                types = {"rn": "BIGINT", "user": "VARCHAR", "item": "VARCHAR", "time": "DOUBLE", "category": "VARCHAR"}
                con.execute("CREATE TABLE raw (" + ", ".join(f'"{c}" {types[c]}' for c in columns) + ")")
            con.register("chunk", chunk[columns])
            con.execute("INSERT INTO raw SELECT * FROM chunk")
            con.unregister("chunk")
            rows += len(chunk)
    assert columns is not None  # read_chunks raises on a log without clicks
    return "time" in columns


def _build(con: Any, cfg: DataConfig, src: ClickSource, out: Path, *, with_time: bool, progress: bool) -> None:
    """Stages 2-5: codes, filter, ids, sorted clicks, categories -> the dataset files in ``out``.
    ``with_time``: the clicks have a time column (to sort by; kept unless it is only a position)."""
    has_category = "category" in _columns(con, "raw")
    with progress_bar(4, "data: mapping ids", enabled=progress, unit="stage") as bar:
        for role in ("user", "item"):
            con.execute(
                f"CREATE TABLE {role}_codes AS SELECT raw, CAST(row_number() OVER () - 1 AS INTEGER) AS code "
                f'FROM (SELECT DISTINCT "{role}" AS raw FROM raw)'
            )
        time = ", r.time" if with_time else ""
        con.execute(
            f"CREATE TABLE clicks AS SELECT r.rn, u.code AS u, i.code AS i{time} FROM raw r "
            'JOIN user_codes u ON r."user" = u.raw JOIN item_codes i ON r.item = i.raw'
        )
        bar.update()
        if has_category:  # an item's category: its first labelled row's, before filtering
            con.execute(
                "CREATE TABLE item_category AS SELECT item AS raw, arg_min(category, rn) AS category "
                "FROM raw WHERE category IS NOT NULL GROUP BY item"
            )
        con.execute("DROP TABLE raw")
        bar.set_description("data: filtering")
        kept = _filter(con, cfg)
        bar.update()
        if kept == 0:
            raise DataError(
                f"{cfg.source}: no clicks left after filtering (data.min_item_count={cfg.min_item_count}, "
                f"data.min_user_count={cfg.min_user_count}, data.kcore={cfg.kcore})"
            )
        bar.set_description("data: numbering items and users")
        item_raw, item_counts = _number(con, "i", "item", by_popularity=True)
        user_raw, user_counts = _number(con, "u", "user", by_popularity=False)
        bar.update()
        bar.set_description("data: categories")
        item_category, category_raw = _item_categories(con, item_raw, item_counts, has_category)
        bar.update()
    indptr = np.zeros(len(user_raw) + 1, dtype=np.int64)
    np.cumsum(user_counts, out=indptr[1:])
    _write_clicks(
        con, out, kept, with_time=with_time and not src.time_is_position, sort_time=with_time, progress=progress
    )
    for name, value in (
        ("item_raw", item_raw),
        ("user_raw", user_raw),
        ("indptr", indptr),
        ("item_category", item_category),
        ("category_raw", category_raw),
        ("item_counts", item_counts),
    ):
        np.save(out / f"{name}.npy", value, allow_pickle=False)
    Dataset.mapped(out, source=str(cfg.source)).write_meta(out)


def _columns(con: Any, table: str) -> list[str]:
    return [row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()]


def _filter(con: Any, cfg: DataConfig) -> int:
    """Stage 3: table ``kept`` holds the clicks that survive the filter; returns their number."""
    con.execute("ALTER TABLE clicks RENAME TO kept")
    rows = con.execute("SELECT count(*) FROM kept").fetchone()[0]
    while True:
        before = rows
        for key, least in (("i", cfg.min_item_count), ("u", cfg.min_user_count)):
            con.execute(
                f"CREATE TABLE next AS SELECT * FROM kept WHERE {key} IN "
                f"(SELECT {key} FROM kept GROUP BY {key} HAVING count(*) >= {int(least)})"
            )
            con.execute("DROP TABLE kept")
            con.execute("ALTER TABLE next RENAME TO kept")
        rows = con.execute("SELECT count(*) FROM kept").fetchone()[0]
        if not cfg.kcore or rows == before:
            return rows


def _number(con: Any, key: str, role: str, *, by_popularity: bool) -> tuple[np.ndarray, np.ndarray]:
    """Stage 4 for users or items: ``(raw ids [n], clicks [n])`` in internal id order, and table
    ``{role}_ids(code, id)``. Items are numbered from 1 by falling clicks, users from 0 by raw id."""
    table = con.execute(
        f"SELECT c.raw, k.code, k.clicks FROM (SELECT {key} AS code, count(*) AS clicks FROM kept GROUP BY {key}) k "
        f"JOIN {role}_codes c ON c.code = k.code"
    ).fetchnumpy()
    raw = np.asarray(table["raw"], dtype=str)
    clicks = np.asarray(table["clicks"], dtype=np.int64)
    order = popularity_order(raw, clicks) if by_popularity else raw_order(raw)
    first = 1 if by_popularity else 0
    ids = pd.DataFrame({"code": np.asarray(table["code"])[order], "id": np.arange(first, first + len(order))})
    con.register("ids", ids)
    con.execute(f"CREATE TABLE {role}_ids AS SELECT * FROM ids")
    con.unregister("ids")
    if by_popularity:
        return np.concatenate([[PAD], raw[order]]), np.concatenate([[0], clicks[order]]).astype(np.int64)
    return raw[order], clicks[order]


def _item_categories(
    con: Any, item_raw: np.ndarray, item_counts: np.ndarray, has_category: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``item_category [num_items]`` and ``category_raw [num_categories]`` (see :func:`category_ids`)."""
    if not has_category:
        return np.zeros(len(item_raw), dtype=np.int64), np.array([UNKNOWN])
    table = con.execute("SELECT raw, category FROM item_category").fetchnumpy()
    first = pd.Series(np.asarray(table["category"], dtype=object), index=np.asarray(table["raw"], dtype=str))
    names = first.reindex(item_raw[1:])  # [num_items - 1], NaN = unknown
    codes, uniques = pd.factorize(names)
    return category_ids(codes.astype(np.int64), np.asarray(uniques, dtype=str), item_counts)


def _write_clicks(con: Any, out: Path, n: int, *, with_time: bool, sort_time: bool, progress: bool) -> None:
    """Stage 5: ``items.npy`` (and ``times.npy``) ``[n]``, sorted by user, then time, then row."""
    by_time = "k.time, " if sort_time else ""
    select = "i.id AS item" + (", k.time" if with_time else "")
    result = con.sql(
        f"SELECT {select} FROM kept k JOIN user_ids u ON k.u = u.code JOIN item_ids i ON k.i = i.code "
        f"ORDER BY u.id, {by_time}k.rn"
    )
    with (
        _NpyWriter(out / "items.npy", np.int64, n) as items,
        _NpyWriter(out / "times.npy", np.float64, n if with_time else 0) as times,
        progress_bar(n, "data: writing clicks", enabled=progress, unit="click") as bar,
    ):
        reader = result.to_arrow_reader(_WRITE_ROWS)
        for batch in reader:
            items.write(batch.column(0).to_numpy())
            if with_time:
                times.write(batch.column(1).to_numpy())
            bar.update(batch.num_rows)
    if not with_time:
        (out / "times.npy").unlink()


class _NpyWriter:
    """Writes a 1-D ``.npy`` file of ``n`` values in pieces (the header first), so a column larger
    than memory streams to disk; closing checks that ``n`` values came."""

    def __init__(self, path: Path, dtype: type, n: int) -> None:
        self.path, self.dtype, self.n, self.written = path, np.dtype(dtype), n, 0
        self.file = open(path, "wb")  # noqa: SIM115 - closed in __exit__
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (n,)}
        )

    def write(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.written += len(values)

    def __enter__(self) -> _NpyWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        if exc[0] is None and self.written != self.n:
            raise RuntimeError(f"{self.path}: wrote {self.written} of {self.n} values")


__all__ = ["MEMORY_LIMIT", "prepare_on_disk"]
