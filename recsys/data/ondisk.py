"""Preparation out of core: a click log of any size -> a saved :class:`~recsys.data.prepare.Dataset`
folder, in bounded memory.

The same dataset :func:`~recsys.data.prepare.prepare` builds in memory (same filter, ids, order and
categories, so the two are interchangeable; the tests compare them), built by DuckDB with a memory
limit, spilling to disk beside the target:

1. read: :func:`~recsys.data.chunks.read_chunks` writes the log as compressed Parquet files in the
   spill folder, each row with its row number (``rn``), so ties keep the file's order; DuckDB
   reads them as the view ``raw`` (a DuckDB table of a billion text ids would spill about 36 bytes
   a click, uncompressed, and be read back from that spill by every later pass);
2. filter: ComiRec's item then user counts (``data.kcore``: until a pass removes nothing), as
   :func:`~recsys.data.prepare.filter_counts`, kept as the sets of surviving items and users;
3. ids: the kept items and users (a row each, fetched into memory) are numbered by
   :func:`~recsys.data.ids.popularity_order` and :func:`~recsys.data.ids.raw_order`;
   a kept item's category is that of its first labelled row;
4. write: one pass joins the log with the two id tables (which drops the filtered clicks) and
   writes integer clicks ``(user, item, time, rn)`` as Parquet partitioned into buckets of
   consecutive users; then bucket by bucket, in user order, DuckDB sorts one bucket by (user,
   time, row) and it streams into ``items.npy`` and ``times.npy``. A single sort of the whole
   joined log would hold a billion rows at once (it ran out of memory at 768 MB); a bucket holds
   about :data:`BUCKET_CLICKS` clicks, so each sort is small, whatever the log's size.

DuckDB was chosen over Polars' streaming engine and PyArrow datasets by ``benchmarks/prepare.py``
(docs/results.md): it sorts, joins and groups out of core under a memory limit.
Item features (``data.item_features``, :mod:`recsys.data.features`) are read before the log, so a
bad feature file stops before the long passes, and saved with the ids the items got.
The folder is published atomically (:func:`recsys.io.files.atomic_folder`): a killed preparation
leaves only a temporary folder that no reader opens and the next preparation removes.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.chunks import ClickSource, open_source, read_chunks
from recsys.data.feature_readers import RawFeatures, read_feature_file
from recsys.data.features import FEATURES, align_features
from recsys.data.ids import WHOLE_PATTERN, popularity_order, raw_order
from recsys.data.prepare import PAD, UNKNOWN, Dataset, category_ids
from recsys.data.readers import DataError
from recsys.extras import install_hint
from recsys.io.files import atomic_folder, save_npy
from recsys.progress import progress_bar

MEMORY_MIN = 768 << 20  # bytes of DuckDB's buffer pool for a log of up to 1.5 GB; it spills beyond
MEMORY_MAX = 8 << 30  # bytes of the pool for a log of 16 GB or more
_WRITE_ROWS = 1 << 20  # clicks per batch fetched from the sorted result
BUCKET_CLICKS = 8_000_000  # clicks (about) sorted at a time: ~200 MB of keys, sorted within the memory limit


def prepare_on_disk(cfg: DataConfig, target: str | Path, *, progress: bool = False) -> Dataset:
    """Prepare ``cfg.source`` into the dataset folder ``target`` and open it (memory-mapped).

    Needs DuckDB (``pip install 'multi-interest-recsys[scale]'``). Errors are the in-memory path's: a malformed
    row names its file and line; no clicks left after filtering names the settings.
    """
    duckdb = _duckdb()
    src = open_source(cfg)
    features = read_feature_file(cfg) if cfg.item_features else None  # its errors before the long passes
    target = Path(target)
    with atomic_folder(target) as out:
        con = duckdb.connect()  # in memory up to the limit, then spilled to the temporary directory
        try:
            con.execute(f"SET memory_limit = '{memory_limit(src.size)}'")
            spill = str(out / "spill").replace("'", "''")  # an SQL string
            con.execute(f"SET temp_directory = '{spill}'")
            con.execute("SET preserve_insertion_order = false")
            con.execute("SET enable_progress_bar = true")  # progress is tracked (query_progress), not printed
            con.execute("SET enable_progress_bar_print = false")
            with_time = _read(con, src, out / "spill", progress)
            _build(con, cfg, src, out, features, with_time=with_time, progress=progress)
        finally:
            con.close()
        shutil.rmtree(out / "spill", ignore_errors=True)
    return Dataset.load(target)


def memory_limit(log_bytes: int) -> str:
    """DuckDB's memory limit for a log of ``log_bytes``: ``RECSYS_PREPARE_MEMORY`` when set, else
    half the log's bytes between :data:`MEMORY_MIN` and :data:`MEMORY_MAX`.

    It grows with the log because spilling does not bound everything: on a billion clicks (13 GB
    of Parquet) counting 20M distinct text ids ran out of memory at 768 MB; a 30M-click CSV (0.7 GB)
    keeps 768 MB, a 100M-click one (2.4 GB) gets 1.1 GB."""
    if "RECSYS_PREPARE_MEMORY" in os.environ:
        return os.environ["RECSYS_PREPARE_MEMORY"]
    return f"{min(MEMORY_MAX, max(MEMORY_MIN, log_bytes // 2)) >> 20}MB"


def _duckdb() -> Any:
    try:
        import duckdb
        import pyarrow  # noqa: F401 - the chunks' way into DuckDB
    except ImportError as err:
        raise DataError(
            f"preparing a log out of core needs duckdb and pyarrow ({install_hint('scale')}), "
            "or set data.prepare=memory"
        ) from err
    return duckdb


def _read(con: Any, src: ClickSource, spill: Path, progress: bool) -> bool:
    """Stage 1: the log into the view ``raw(rn, user, item[, time][, category])`` over Parquet
    files in ``spill/raw`` (one a chunk); whether it has times.

    DuckDB writes a chunk in a second thread while the next one is parsed (both release the
    GIL), so reading and writing overlap on two cores."""
    import pyarrow as pa  # the scale extra; chunks go to DuckDB as Arrow tables, its fastest way in

    folder = spill / "raw"
    folder.mkdir(parents=True)
    columns: list[str] | None = None
    rows = 0
    writing: Future | None = None  # the chunk DuckDB is writing

    def write(table: pa.Table, part: Path) -> None:
        con.register("chunk", table)
        con.execute(
            f"COPY (SELECT {', '.join(_canonical(c) for c in table.column_names)} FROM chunk) "
            f"TO {_sql_string(part)} (FORMAT PARQUET, COMPRESSION ZSTD)"
        )
        con.unregister("chunk")

    with (
        ThreadPoolExecutor(1) as writer,
        progress_bar(src.size, f"data: reading {src.cfg.source}", enabled=progress, unit="B") as bar,
    ):
        bar.unit_scale = True
        for i, chunk in enumerate(read_chunks(src, advance=bar.update)):
            chunk.insert(0, "rn", np.arange(rows, rows + len(chunk), dtype=np.int64))
            columns = columns or list(chunk.columns)
            table = pa.Table.from_pandas(chunk[columns], preserve_index=False)
            if writing is not None:
                writing.result()
            writing = writer.submit(write, table, folder / f"{i:08d}.parquet")
            rows += len(chunk)
        if writing is not None:
            writing.result()
    assert columns is not None  # read_chunks raises on a log without clicks
    con.execute(f"CREATE VIEW raw AS SELECT * FROM read_parquet({_sql_string(folder / '*.parquet')})")
    return "time" in columns


def _sql_string(value: object) -> str:
    """``value`` as an SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


_TYPES = {"rn": "BIGINT", "user": "VARCHAR", "item": "VARCHAR", "time": "DOUBLE", "category": "VARCHAR"}


def _canonical(column: str) -> str:
    """The SQL that reads ``column`` of a chunk as its type in ``raw``: users and items under the id
    rule of :mod:`recsys.data.ids` (a whole number written with a zero fraction is that number), as
    :func:`~recsys.data.ids.factorize_ids` applies it in memory."""
    value = f'CAST("{column}" AS {_TYPES[column]})'
    if column in ("user", "item"):  # the rule needs a '.': the test is cheaper than the pattern
        value = (
            f"CASE WHEN contains({value}, '.') THEN regexp_replace({value}, '{WHOLE_PATTERN}', '\\1') ELSE {value} END"
        )
    return f'{value} AS "{column}"'


def _build(
    con: Any,
    cfg: DataConfig,
    src: ClickSource,
    out: Path,
    features: RawFeatures | None,
    *,
    with_time: bool,
    progress: bool,
) -> None:
    """Stages 2-4: filter, ids, categories, sorted clicks -> the dataset files in ``out``, with the
    item ``features`` read from ``data.item_features`` aligned with the items' ids.
    ``with_time``: the clicks have a time column (to sort by; kept unless it is only a position)."""
    has_category = "category" in [row[0] for row in con.execute("DESCRIBE raw").fetchall()]
    with progress_bar(3, "data: filtering", enabled=progress, unit="stage") as bar:
        kept = _filter(con, cfg)
        if kept == 0:
            raise DataError(
                f"{cfg.source}: no clicks left after filtering (data.min_item_count={cfg.min_item_count}, "
                f"data.min_user_count={cfg.min_user_count}, data.kcore={cfg.kcore})"
            )
        bar.update()
        bar.set_description("data: numbering items and users")
        item_raw, item_counts = _number(con, "item", by_popularity=True)
        user_raw, user_counts = _number(con, "user", by_popularity=False)
        bar.update()
        bar.set_description("data: categories")
        item_category, category_raw = _item_categories(con, item_raw, item_counts, has_category)
        bar.update()
    indptr = np.zeros(len(user_raw) + 1, dtype=np.int64)
    np.cumsum(user_counts, out=indptr[1:])
    _write_clicks(
        con,
        out,
        kept,
        len(user_raw),
        with_time=with_time and not src.time_is_position,
        sort_time=with_time,
        progress=progress,
    )
    for name, value in (
        ("item_raw", item_raw),
        ("user_raw", user_raw),
        ("indptr", indptr),
        ("item_category", item_category),
        ("category_raw", category_raw),
        ("item_counts", item_counts),
    ):
        save_npy(out / f"{name}.npy", value)
    if features is not None:
        align_features(features, item_raw).save(out / FEATURES)
    Dataset.mapped(out, source=str(cfg.source)).write_meta(out)


def _filter(con: Any, cfg: DataConfig) -> int:
    """Stage 2, :func:`~recsys.data.prepare.filter_counts` on the log: tables ``item_kept(raw,
    clicks)`` and ``user_kept(raw, clicks)`` hold the items and users that survive, with their
    clicks after filtering; returns the clicks kept.

    A click survives when both its item and its user do (each pass only shrinks both sets), so
    each pass counts over the log joined with the two sets: no filtered copy of the log is written."""
    users = items = ""  # the conditions of the sets: every user and item before the first pass
    rows = None
    while True:
        before = rows
        _count_kept(con, "item", users + items, cfg.min_item_count)
        items = " AND item IN (SELECT raw FROM item_kept)"
        _count_kept(con, "user", users + items, cfg.min_user_count)
        users = ' AND "user" IN (SELECT raw FROM user_kept)'
        rows = int(con.execute("SELECT coalesce(sum(clicks), 0) FROM user_kept").fetchone()[0])
        if not cfg.kcore or rows == before:
            break
    _count_kept(con, "item", users + items, 1)  # the kept items' clicks after the last user pass
    return rows


def _count_kept(con: Any, role: str, where: str, least: int) -> None:
    """Table ``{role}_kept(raw, clicks)``: the users or items with at least ``least`` clicks among
    the rows that satisfy ``where`` (`` AND ...`` conditions)."""
    con.execute(
        f'CREATE TABLE {role}_next AS SELECT "{role}" AS raw, count(*) AS clicks FROM raw '
        f'WHERE true{where} GROUP BY "{role}" HAVING count(*) >= {int(least)}'
    )
    con.execute(f"DROP TABLE IF EXISTS {role}_kept")
    con.execute(f"ALTER TABLE {role}_next RENAME TO {role}_kept")


def _number(con: Any, role: str, *, by_popularity: bool) -> tuple[np.ndarray, np.ndarray]:
    """Stage 3 for users or items: ``(raw ids [n], clicks [n])`` in internal id order, and table
    ``{role}_ids(raw, id)``. Items are numbered from 1 by falling clicks, users from 0 by raw id."""
    table = con.execute(f"SELECT raw, clicks FROM {role}_kept").fetchnumpy()
    raw = np.asarray(table["raw"], dtype=str)
    clicks = np.asarray(table["clicks"], dtype=np.int64)
    order = popularity_order(raw, clicks) if by_popularity else raw_order(raw)
    first = 1 if by_popularity else 0
    ids = pd.DataFrame({"raw": raw[order], "id": np.arange(first, first + len(order))})
    con.register("ids", ids)
    con.execute(f"CREATE TABLE {role}_ids AS SELECT * FROM ids")
    con.unregister("ids")
    if by_popularity:
        return np.concatenate([[PAD], raw[order]]), np.concatenate([[0], clicks[order]]).astype(np.int64)
    return raw[order], clicks[order]


def _item_categories(
    con: Any, item_raw: np.ndarray, item_counts: np.ndarray, has_category: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``item_category [num_items]`` and ``category_raw [num_categories]`` (see :func:`category_ids`):
    a kept item's category is that of its first labelled row, filtered or not."""
    if not has_category:
        return np.zeros(len(item_raw), dtype=np.int64), np.array([UNKNOWN])
    table = con.execute(
        "SELECT item, arg_min(category, rn) AS category FROM raw "
        "WHERE category IS NOT NULL AND item IN (SELECT raw FROM item_ids) GROUP BY item"
    ).fetchnumpy()
    first = pd.Series(np.asarray(table["category"], dtype=object), index=np.asarray(table["item"], dtype=str))
    names = first.reindex(item_raw[1:])  # [num_items - 1], NaN = unknown
    codes, uniques = pd.factorize(names)
    return category_ids(codes.astype(np.int64), np.asarray(uniques, dtype=str), item_counts)


def _write_clicks(
    con: Any, out: Path, n: int, num_users: int, *, with_time: bool, sort_time: bool, progress: bool
) -> None:
    """Stage 4: ``items.npy`` (and ``times.npy``) ``[n]``, sorted by user, then time, then row.

    Users are numbered by raw id, not by activity, so ``users_per_bucket`` consecutive users hold
    about :data:`BUCKET_CLICKS` clicks; a bucket that holds more (a cluster of heavy users) only
    sorts with more spilling."""
    buckets = out / "spill" / "buckets"
    users_per_bucket = max(1, BUCKET_CLICKS * num_users // max(n, 1))
    time_col = ", k.time" if with_time or sort_time else ""
    _run(
        con,
        f'COPY (SELECT u.id AS "user", i.id AS item{time_col}, k.rn, u.id // {users_per_bucket} AS bucket '
        f'FROM raw k JOIN user_ids u ON k."user" = u.raw JOIN item_ids i ON k.item = i.raw) '
        f"TO {_sql_string(buckets)} (FORMAT PARQUET, PARTITION_BY (bucket))",
        "data: numbering clicks",
        progress,
    )
    con.execute("DROP VIEW raw")
    shutil.rmtree(out / "spill" / "raw")  # the log's copy is no longer read
    by_time = "time, " if sort_time else ""
    select = "item" + (", time" if with_time else "")
    with (
        _NpyWriter(out / "items.npy", np.int64, n) as items,
        _NpyWriter(out / "times.npy", np.float64, n if with_time else 0) as times,
        progress_bar(n, "data: sorting and writing clicks", enabled=progress, unit="click") as bar,
    ):
        for bucket in range((num_users + users_per_bucket - 1) // users_per_bucket):
            folder = buckets / f"bucket={bucket}"
            result = con.sql(
                f'SELECT {select} FROM read_parquet({_sql_string(folder / "*.parquet")}) ORDER BY "user", {by_time}rn'
            )
            for batch in result.to_arrow_reader(_WRITE_ROWS):
                items.write(batch.column(0).to_numpy())
                if with_time:
                    times.write(batch.column(1).to_numpy())
                bar.update(batch.num_rows)
            shutil.rmtree(folder)
    if not with_time:
        (out / "times.npy").unlink()


def _run(con: Any, sql: str, desc: str, progress: bool) -> None:
    """Execute one long statement with a bar of its percentage done (DuckDB's own estimate,
    polled from this thread while another runs the statement)."""
    if not progress:
        con.execute(sql)
        return
    with ThreadPoolExecutor(1) as pool, progress_bar(100, desc, unit="%") as bar:
        running = pool.submit(con.execute, sql)
        while not wait([running], timeout=0.5).done:
            bar.update(max(0.0, con.query_progress() - bar.n))
        running.result()  # its error, if any


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


__all__ = ["MEMORY_MAX", "MEMORY_MIN", "memory_limit", "prepare_on_disk"]
