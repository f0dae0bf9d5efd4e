"""Preparing a large click log: time and peak RSS of each engine, side by side.

Writes a Taobao-like CSV (``user,item,timestamp``; power-law item popularity, about 85 clicks
a user, 1.7 items per 85 clicks as in ComiRec's Taobao log) of each size, then prepares it
(ComiRec's filter: items and users with at least 5 clicks; ids; clicks sorted by user and time)
with each engine, each in a fresh process so its peak RSS is its own:

- ``memory``: today's in-memory path (``read_interactions`` + ``prepare``: pandas and numpy);
- ``duckdb``: recsys's out-of-core path (``prepare_on_disk``: the reader's chunks into DuckDB);
- ``polars``: the same work in Polars' streaming engine (its own CSV reader, ``sink_parquet``).

PyArrow datasets are not in the table: Acero's group-by and sort hold their whole input in
memory, so they are not out of core. Prints one table, with time and RSS as ratios to
``memory``. The CSVs go under ``--dir`` (deleted afterwards unless ``--keep``).

Usage::

    python benchmarks/prepare.py [--rows 10M,30M] [--engines memory,duckdb,polars] [--dir /tmp/prepare-bench]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from recsys.config import DataConfig

if TYPE_CHECKING:
    import pyarrow as pa

ENGINES = ("memory", "duckdb", "polars")
_CLICKS_PER_USER = 85  # ComiRec's Taobao: 85.4M clicks, 977k users, 1.71M items
_ITEMS_PER_CLICK = 0.02
_BLOCK = 5_000_000  # clicks generated at a time


def taobao_like(rows: int, seed: int = 0) -> Iterator[pa.Table]:
    """The clicks of a Taobao-like log of ``rows`` clicks, in blocks of :data:`_BLOCK` rows (so a
    log larger than memory streams): ``user``, ``item``, ``timestamp`` (int64); users drawn
    uniformly, items Zipf-like, times over 9 days."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    users, items = max(1, rows // _CLICKS_PER_USER), max(10, int(rows * _ITEMS_PER_CLICK))
    for start in range(0, rows, _BLOCK):
        n = min(_BLOCK, rows - start)
        user = rng.integers(0, users, n)
        item = np.minimum(rng.zipf(1.2, n), items) * 7919 % items  # popular ids spread over the range
        stamp = 1_500_000_000 + rng.integers(0, 86_400 * 9, n)  # 9 days, second resolution: ties happen
        yield pa.table({"user": user, "item": item, "timestamp": stamp})


def write_log(path: Path, rows: int, seed: int = 0) -> None:
    """:func:`taobao_like` as one CSV file."""
    import pyarrow.csv as pacsv

    blocks = taobao_like(rows, seed)
    first = next(blocks)
    with pacsv.CSVWriter(path, first.schema) as w:
        w.write_table(first)
        for table in blocks:
            w.write_table(table)


def run_engine(engine: str, csv: Path, work: Path) -> dict[str, float]:
    """Prepare ``csv`` with ``engine`` in this process: seconds, peak RSS (GiB) and clicks kept."""
    cfg = DataConfig(source=str(csv), time_col="timestamp")
    start = time.perf_counter()
    if engine == "memory":
        from recsys.data.prepare import prepare
        from recsys.data.readers import read_interactions

        clicks = len(prepare(read_interactions(cfg), cfg).items)
    elif engine == "duckdb":
        from recsys.data.ondisk import prepare_on_disk

        clicks = len(prepare_on_disk(cfg, work / "duckdb").items)
    else:
        clicks = _polars(cfg, work / "polars")
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"seconds": seconds, "rss_gib": peak, "clicks": clicks}


def _polars(cfg: DataConfig, out: Path) -> int:
    """The preparation in Polars' streaming engine: filter, number, sort, write."""
    import polars as pl

    from recsys.data.prepare import popularity_order, raw_order

    out.mkdir(parents=True, exist_ok=True)
    log = pl.scan_csv(cfg.source, schema_overrides={"user": pl.String, "item": pl.String}).with_row_index("rn")
    log = log.rename({"timestamp": "time"}).with_columns(pl.col("time").cast(pl.Float64))
    items = log.group_by("item").agg(pl.len().alias("n")).filter(pl.col("n") >= cfg.min_item_count)
    log = log.join(items.select("item"), on="item", how="semi")
    users = log.group_by("user").agg(pl.len().alias("n")).filter(pl.col("n") >= cfg.min_user_count)
    log.join(users.select("user"), on="user", how="semi").sink_parquet(out / "kept.parquet", engine="streaming")
    kept = pl.scan_parquet(out / "kept.parquet")
    ids = []
    for role, by_popularity in (("item", True), ("user", False)):
        counts = kept.group_by(role).agg(pl.len().alias("n")).collect(engine="streaming")
        raw, n = counts[role].to_numpy().astype(str), counts["n"].to_numpy()
        order = popularity_order(raw, n) if by_popularity else raw_order(raw)
        ids.append(pl.DataFrame({role: raw[order], f"{role}_id": np.arange(len(order)) + by_popularity}).lazy())
    (
        kept.join(ids[0], on="item")
        .join(ids[1], on="user")
        .sort(["user_id", "time", "rn"])
        .select("item_id", "time")
        .sink_parquet(out / "clicks.parquet", engine="streaming")
    )
    return pl.scan_parquet(out / "clicks.parquet").select(pl.len()).collect().item()


def parse_count(text: str) -> int:
    """``"100M"`` -> 100,000,000 (K, M, B suffixes; a plain number as it is)."""
    scale = {"K": 1_000, "M": 1_000_000, "B": 1_000_000_000}
    return int(float(text[:-1]) * scale[text[-1].upper()]) if text[-1].upper() in scale else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="10M,30M", help="log sizes, comma separated (10M, 1.5B, ...)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--dir", default="", help="where the CSVs go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the CSVs")
    parser.add_argument("--run", nargs=2, metavar=("ENGINE", "CSV"), help=argparse.SUPPRESS)  # one measurement
    args = parser.parse_args()
    if args.run:
        engine, csv = args.run
        work = Path(tempfile.mkdtemp(dir=Path(csv).parent))
        try:
            print(json.dumps(run_engine(engine, Path(csv), work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    folder = Path(args.dir or tempfile.mkdtemp(prefix="prepare-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    engines = args.engines.split(",")
    print(f"# {platform.node()}: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(
        f"{'rows':>6} {'engine':<8} {'seconds':>8} {'peak RSS GiB':>12} {'clicks kept':>12} {'time ×':>7} {'RSS ×':>6}"
    )
    try:
        for size in args.rows.split(","):
            csv = folder / f"clicks-{size}.csv"
            if not csv.exists():
                write_log(csv, parse_count(size))
            base = None
            for engine in engines:
                cmd = [sys.executable, __file__, "--run", engine, str(csv)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode:
                    print(f"{size:>6} {engine:<8} failed: {done.stderr.strip().splitlines()[-1]}")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                base = base or r
                print(
                    f"{size:>6} {engine:<8} {r['seconds']:>8.1f} {r['rss_gib']:>12.2f} {r['clicks']:>12,} "
                    f"{r['seconds'] / base['seconds']:>7.2f} {r['rss_gib'] / base['rss_gib']:>6.2f}",
                    flush=True,
                )
            if not args.keep:
                csv.unlink()
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
