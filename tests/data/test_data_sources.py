"""Sources on disk: folders of parts shaped exactly as Spark writes them (Hive ``key=value``
folders, the same part names in every partition, ``_SUCCESS``, ``.crc`` checksums,
``_started_*``/``_committed_*`` markers), read in memory and out of core; compressed text."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import uuid
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.cli import main
from recsys.config import DataConfig, load_config
from recsys.data import load_dataset
from recsys.data.prepare import ARRAYS, Dataset
from recsys.data.readers import DataError, DataWarning, read_interactions

pytest.importorskip("pyarrow")

DAY = 86_400
JAN_1 = 1_767_225_600  # 2026-01-01T00:00:00Z


def spark_folder(root: Path, log: pd.DataFrame, by: tuple[str, ...] = ("dt",), fmt: str = "parquet") -> Path:
    """``log`` written as Spark writes ``df.write.partitionBy(*by).parquet(root)`` (or ``.csv`` with
    a header): one ``key=value`` folder a partition value (nested in ``by``'s order), each holding
    the parts ``part-00000`` and ``part-00001`` of one job's id (so every partition repeats the
    same part names) without the partition columns, a hidden ``.crc`` beside each part,
    Databricks' ``_started_*``/``_committed_*`` markers, and ``_SUCCESS`` with its ``.crc`` at the
    top. Returns ``root``."""
    job = uuid.UUID(int=0x5EED)  # one write job: its id is in every part's name
    root.mkdir(parents=True)
    (root / "_SUCCESS").write_bytes(b"")
    (root / "._SUCCESS.crc").write_bytes(b"crc\x00\x00\x00\x00")
    for keys, group in log.groupby(list(by), sort=True):
        folder = root.joinpath(*(f"{key}={value}" for key, value in zip(by, keys)))
        folder.mkdir(parents=True)
        rows = group.drop(columns=list(by))
        for n, part in enumerate(np.array_split(np.arange(len(rows)), 2)):
            if fmt == "parquet":
                name = f"part-{n:05d}-{job}.c000.snappy.parquet"
                rows.iloc[part].to_parquet(folder / name, index=False, compression="snappy")
            else:
                name = f"part-{n:05d}-{job}-c000.csv"
                rows.iloc[part].to_csv(folder / name, index=False)
            (folder / f".{name}.crc").write_bytes(b"crc\x00\x00\x00\x00")
        (folder / f"_started_{job.int % 10**6}").write_bytes(b"")
        (folder / f"_committed_{job.int % 10**6}").write_bytes(b'{"added":[],"removed":[]}')
    return root


def click_log(n: int = 600, seed: int = 0) -> pd.DataFrame:
    """Clicks over five days in time order, with the day (``dt``) and hour (``hour``) Spark
    would partition by."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.integers(JAN_1, JAN_1 + 5 * DAY, n))
    log = pd.DataFrame(
        {
            "user": [f"u{u}" for u in rng.integers(0, 30, n)],
            "item": [f"i{i}" for i in rng.zipf(1.3, n).clip(max=40)],
            "timestamp": times,
        }
    )
    stamp = pd.to_datetime(log["timestamp"], unit="s")
    log["dt"] = stamp.dt.strftime("%Y-%m-%d")
    log["hour"] = stamp.dt.hour.map("{:02d}".format)
    return log


def seconds(texts: pd.Series) -> list[float]:
    """ISO 8601 date-times -> unix seconds."""
    return ((pd.to_datetime(texts, utc=True) - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).tolist()


def tidy(df: pd.DataFrame) -> list[tuple]:
    return list(df[["user", "item", "time"]].itertuples(index=False, name=None))


def assert_same(a: Dataset, b: Dataset) -> None:
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def config(tmp_path: Path, source: Path, *settings: str, prepare: str = "memory"):
    return load_config(
        None,
        [
            f"data.source={source}",
            f"data.prepare={prepare}",
            f"data.cache_dir={tmp_path / f'cache-{prepare}'}",  # each way its own: neither opens the other's
            "data.min_item_count=2",
            "data.min_user_count=2",
            *settings,
        ],
    )


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_spark_folder_reads_as_the_log_it_was_written_from(tmp_path, fmt):
    log = click_log()
    folder = spark_folder(tmp_path / "clicks", log, fmt=fmt)
    df = read_interactions(DataConfig(source=str(folder)))
    # the partitions in path order, each part in name order: the log's own order here
    assert tidy(df) == [(u, i, float(t)) for u, i, t in zip(log["user"], log["item"], log["timestamp"])]
    assert df.attrs["time_is_position"] is False


def test_partition_columns_are_columns(tmp_path):
    log = click_log()
    folder = spark_folder(tmp_path / "clicks", log, by=("dt", "hour"))  # two levels
    df = read_interactions(DataConfig(source=str(folder), time_col="dt", category_col="hour"))
    assert df["time"].tolist() == seconds(log["dt"])  # ISO dates read as date-times
    assert df["category"].tolist() == log["hour"].tolist()
    assert df["user"].tolist() == log["user"].tolist()


def test_a_user_partition_gives_the_user_column(tmp_path):
    log = click_log().sort_values(["user", "timestamp"], kind="stable").drop(columns=["dt", "hour"])
    folder = spark_folder(tmp_path / "clicks", log.assign(user=log["user"].str[1:]), by=("user",))
    df = read_interactions(DataConfig(source=str(folder), user_col="user"))
    assert sorted(tidy(df)) == sorted((u[1:], i, float(t)) for u, i, t in log.itertuples(index=False))


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("time_col", ["timestamp", "dt"])
def test_a_spark_folder_prepares_alike_in_memory_and_out_of_core(tmp_path, fmt, time_col):
    pytest.importorskip("duckdb")
    log = click_log()
    folder = spark_folder(tmp_path / "clicks", log, fmt=fmt)
    log.drop(columns=["hour"]).to_csv(tmp_path / "whole.csv", index=False)
    settings = (f"data.time_col={time_col}",)
    memory = load_dataset(config(tmp_path, folder, *settings))
    disk = load_dataset(config(tmp_path, folder, *settings, prepare="disk"))  # forced out of core
    whole = load_dataset(config(tmp_path, tmp_path / "whole.csv", *settings))
    assert isinstance(disk.items, np.memmap)  # it was prepared on disk, not in memory
    assert_same(memory, disk)
    assert_same(whole, disk)
    assert disk.num_users == log["user"].nunique()


def test_an_explicit_format_and_the_command_line_read_the_folder(tmp_path, capsys):
    folder = spark_folder(tmp_path / "clicks", click_log())
    assert len(read_interactions(DataConfig(source=str(folder), format="parquet"))) == 600
    unfiltered = ["--set", "data.min_item_count=1", "--set", "data.min_user_count=1"]
    assert main(["data", "--data", f"{folder}/", "--set", "data.prepare=memory", *unfiltered]) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines["interactions"] == "600"


def test_a_new_partition_is_a_new_cache_entry(tmp_path):
    pytest.importorskip("duckdb")
    log = click_log()
    folder = spark_folder(tmp_path / "clicks", log[log["dt"] < "2026-01-05"])
    cfg = config(tmp_path, folder, prepare="disk")
    before = load_dataset(cfg)
    spark_folder(tmp_path / "last", log[log["dt"] == "2026-01-05"])
    os.rename(tmp_path / "last" / "dt=2026-01-05", folder / "dt=2026-01-05")  # the top folder's files stay as they were
    after = load_dataset(cfg)
    assert len(after.items) > len(before.items)


def test_escaped_and_missing_partition_values(tmp_path):
    log = click_log(40)
    log["minute"] = pd.to_datetime(log["timestamp"], unit="s").dt.strftime("%Y-%m-%d %H:%M")
    folder = spark_folder(tmp_path / "clicks", log.drop(columns=["dt", "hour"]), by=("minute",))
    for path in folder.iterdir():  # Spark escapes ':' in a folder name as %3A
        if path.is_dir():
            path.rename(path.with_name(path.name.replace(":", "%3A")))
    df = read_interactions(DataConfig(source=str(folder), time_col="minute"))
    assert df["time"].tolist() == seconds(log["minute"])
    hive_null = folder / "minute=__HIVE_DEFAULT_PARTITION__"  # Spark's folder for a null value
    next(p for p in folder.iterdir() if p.is_dir()).rename(hive_null)
    with pytest.raises(DataError, match=r"minute=__HIVE_DEFAULT_PARTITION__: time '__HIVE_DEFAULT_PARTITION__'"):
        read_interactions(DataConfig(source=str(folder), time_col="minute"))
    df = read_interactions(DataConfig(source=str(folder), category_col="minute"))  # a missing category
    assert df["category"].isna().sum() == sum(len(pd.read_parquet(p)) for p in hive_null.glob("part-*")) > 0


def test_a_partition_value_that_cannot_serve_its_role_names_its_folder(tmp_path):
    log = click_log(60)
    log["dt"] = np.where(log["dt"] == "2026-01-03", "soon", log["dt"])
    folder = spark_folder(tmp_path / "clicks", log)
    with pytest.raises(DataError, match=r"dt=soon: time 'soon' is not a date-time \(the folder gives data\.time_col"):
        read_interactions(DataConfig(source=str(folder), time_col="dt"))
    with pytest.raises(DataError, match=r"dt=2026-01-01/part-00000-\S+: no column 'dt' \(data\.time_col\)"):
        read_interactions(DataConfig(source=str(folder / "dt=2026-01-01"), time_col="dt"))  # no dt= folder below


def test_csv_files_that_are_not_parts_stay_ambiguous(tmp_path):
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text("user,item\nu,i\n")
    with pytest.raises(DataError, match=r"cannot tell which file holds the clicks \(data files: a\.csv, b\.csv\)"):
        read_interactions(DataConfig(source=str(tmp_path)))
    (tmp_path / "_SUCCESS").write_bytes(b"")  # now they are a job's parts
    assert len(read_interactions(DataConfig(source=str(tmp_path), time_col=""))) == 2


def test_a_glob_is_not_expanded_and_the_error_says_so(tmp_path):
    with pytest.raises(DataError, match=r"does not exist \(a glob is not expanded: point data\.source at the folder\)"):
        read_interactions(DataConfig(source=str(tmp_path / "clicks" / "*" / "*.parquet")))


def null_users(folder: Path, every: int = 2) -> int:
    """Empty the first user of every ``every``-th part; returns how many parts were damaged."""
    parts = sorted(folder.rglob("part-*.parquet"))[::every]
    for path in parts:
        table = pd.read_parquet(path)
        table.loc[0, "user"] = None
        table.to_parquet(path, index=False)
    return len(parts)


def flat_parts(folder: Path, log: pd.DataFrame, parts: int = 10) -> Path:
    """``log`` as ``parts`` Parquet parts side by side in ``folder``, as Dask or Ray write them."""
    folder.mkdir()
    for n, rows in enumerate(np.array_split(np.arange(len(log)), parts)):
        log.iloc[rows].to_parquet(folder / f"part-{n:05d}.parquet", index=False)
    return folder


@pytest.mark.parametrize("prepare", ["memory", "disk"])
@pytest.mark.parametrize("layout", ["partitioned", "flat"])
def test_rows_skipped_across_parts_give_one_warning(tmp_path, prepare, layout):
    if prepare == "disk":
        pytest.importorskip("duckdb")
    log = click_log()
    if layout == "flat":
        folder, first = flat_parts(tmp_path / "clicks", log.drop(columns=["dt", "hour"])), "part-00000.parquet"
    else:
        folder, first = spark_folder(tmp_path / "clicks", log), "dt=2026-01-01/part-00000-"
    damaged = null_users(folder)  # 5 of the 10 parts
    with pytest.raises(DataError, match=rf"{first}\S*: row 1: empty user \(set data\.skip_bad_rows"):
        load_dataset(config(tmp_path, folder, prepare=prepare))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_dataset(config(tmp_path, folder, "data.skip_bad_rows=true", prepare=prepare))
    messages = [str(w.message) for w in caught if w.category is DataWarning]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{folder}: skipped {damaged} malformed rows in {damaged} of 10 files: ")
    assert f": {first}" in messages[0] and messages[0].endswith("; ...")


LINES = "user,item,timestamp\n" + "".join(f"u{i % 7},i{i % 5},{i}\n" for i in range(70))


@pytest.mark.parametrize(
    ("name", "compress"),
    [("log.csv.gz", gzip.compress), ("log.csv.bz2", bz2.compress), ("log.CSV.xz", lzma.compress)],
)
def test_compressed_csv_reads_as_the_plain_file(tmp_path, name, compress):
    (tmp_path / "log.csv").write_text(LINES)
    (tmp_path / name).write_bytes(compress(LINES.encode()))
    plain = read_interactions(DataConfig(source=str(tmp_path / "log.csv")))
    assert tidy(read_interactions(DataConfig(source=str(tmp_path / name)))) == tidy(plain)


def test_compressed_text_of_every_kind_and_its_errors(tmp_path):
    (tmp_path / "seq.txt.gz").write_bytes(gzip.compress(b"u1 a b c\nu2 b c\n"))
    assert read_interactions(DataConfig(source=str(tmp_path / "seq.txt.gz")))["item"].tolist() == list("abcbc")
    bad = LINES.replace("u3,i0,10\n", "u3,i0,soon\n")
    (tmp_path / "bad.csv.gz").write_bytes(gzip.compress(bad.encode()))
    with pytest.raises(DataError, match=r"bad\.csv\.gz:12: time 'soon' is not a number"):
        read_interactions(DataConfig(source=str(tmp_path / "bad.csv.gz")))
    whole = gzip.compress((LINES * 40).encode())
    (tmp_path / "cut.csv.gz").write_bytes(whole[: len(whole) // 2])  # a download cut short
    with pytest.raises(DataError, match=r"cut\.csv\.gz: not a readable gzip file \(Compressed file ended"):
        read_interactions(DataConfig(source=str(tmp_path / "cut.csv.gz")))
    (tmp_path / "log.csv.zst").write_bytes(b"(\xb5/\xfd")
    with pytest.raises(DataError, match=r"log\.csv\.zst: zstd-compressed files are not read; decompress it"):
        read_interactions(DataConfig(source=str(tmp_path / "log.csv.zst")))


def test_compressed_csv_prepares_alike_out_of_core(tmp_path, monkeypatch):
    pytest.importorskip("duckdb")
    from recsys.data import chunks

    monkeypatch.setattr(chunks, "CHUNK_ROWS", 7)  # many chunks of one compressed stream
    (tmp_path / "log.csv").write_text(LINES)
    (tmp_path / "log.csv.gz").write_bytes(gzip.compress(LINES.encode()))
    plain = load_dataset(config(tmp_path, tmp_path / "log.csv"))
    packed = load_dataset(config(tmp_path, tmp_path / "log.csv.gz", prepare="disk"))
    assert_same(plain, packed)
