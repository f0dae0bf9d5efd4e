"""Out-of-core preparation: the same dataset as in memory, from every source, in chunks; the
reader's errors and skip counts; atomic publishing; reuse keyed by the files and settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recsys.config import DataConfig, load_config
from recsys.data import chunks, load_dataset
from recsys.data.prepare import ARRAYS, Dataset, prepare
from recsys.data.readers import DataError, DataWarning, read_interactions
from tests.data.test_data_readers_fuzz import DAMAGE_SETTINGS, _write, damaged_files

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

from recsys.data import ondisk  # after the skips
from recsys.data.ondisk import prepare_on_disk

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """A few rows a chunk, so every test log spans many chunks (and the line scan starts mid-file),
    and a few clicks a bucket, so the clicks are sorted in many buckets."""
    monkeypatch.setattr(chunks, "CHUNK_ROWS", 7)
    monkeypatch.setattr(ondisk, "BUCKET_CLICKS", 60)


def assert_same(a: Dataset, b: Dataset) -> None:
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def both(cfg: DataConfig, target: Path) -> tuple[Dataset, Dataset]:
    """(in memory, out of core) preparations of ``cfg.source``."""
    return prepare(read_interactions(cfg), cfg), prepare_on_disk(cfg, target)


@pytest.mark.data
@pytest.mark.skipif(not DATA.is_dir(), reason=f"real datasets not found at {DATA}")
@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("amazon-beauty", {}),
        ("comirec-book-sample", {"min_item_count": 1, "min_user_count": 2}),  # categories from the file beside
        ("ml-100k", {"kcore": True, "min_item_count": 20, "min_user_count": 20}),
        ("taobao", {}),
    ],
)
def test_real_logs_prepare_alike(tmp_path, monkeypatch, name, settings):
    monkeypatch.setattr(chunks, "CHUNK_ROWS", 5_000)
    memory, disk = both(DataConfig(source=str(DATA / name), **settings), tmp_path / "ds")
    assert_same(memory, disk)
    assert isinstance(disk.items, np.memmap)  # the clicks stay on disk


def awkward_log(seed: int, n: int = 400) -> pd.DataFrame:
    """Ids with spaces, quotes, commas, unicode, numbers with leading zeros; many tied times;
    categories missing, blank or differing between an item's rows."""
    rng = np.random.default_rng(seed)
    users = np.array(["7", "007", "10", "u 1", 'q"x', "a,b", "é", "2", " 3", "11"])
    items = np.array([str(i) for i in range(12)] + ["x y", "z,", "ü"])
    return pd.DataFrame(
        {
            "user": users[rng.integers(0, len(users), n)],
            "item": items[rng.zipf(1.5, n).clip(max=len(items)) - 1],
            "timestamp": rng.integers(0, 6, n),  # few distinct times: ties everywhere
            "cat": np.array(["", "c1", "c2", " ", "c 3"])[rng.integers(0, 5, n)],
        }
    )


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kcore", [False, True])
def test_awkward_csv_and_parquet_prepare_alike(tmp_path, seed, kcore):
    log = awkward_log(seed)
    log.to_csv(tmp_path / "log.csv", index=False)
    log.to_parquet(tmp_path / "log.parquet")
    for source in ("log.csv", "log.parquet"):
        cfg = DataConfig(
            source=str(tmp_path / source), time_col="timestamp", category_col="cat", min_item_count=3, kcore=kcore
        )
        memory, disk = both(cfg, tmp_path / f"ds-{source}")
        assert_same(memory, disk)
        assert disk.num_categories > 1


def test_positions_and_date_times_prepare_alike(tmp_path):
    log = awkward_log(2).drop(columns="cat")
    log["timestamp"] = pd.to_datetime(log["timestamp"], unit="D").dt.strftime("%Y-%m-%dT%H:%M:%S")
    log.to_csv(tmp_path / "log.csv", index=False)
    for time_col in ("timestamp", ""):  # ISO date-times; no time column: the row order
        cfg = DataConfig(source=str(tmp_path / "log.csv"), time_col=time_col, min_item_count=2)
        memory, disk = both(cfg, tmp_path / f"ds-{time_col}")
        assert_same(memory, disk)
        assert (disk.times is None) == (time_col == "")


def test_a_folder_of_parquet_parts(tmp_path):
    log = awkward_log(3).drop(columns="cat")
    folder = tmp_path / "parts"
    folder.mkdir()
    for k, start in enumerate((0, 150, 290)):
        log.iloc[start : start + [150, 140, 110][k]].to_parquet(folder / f"part-{k:05d}-0c1f.snappy.parquet")
    (folder / "_SUCCESS").write_bytes(b"")  # as Spark leaves it
    log.to_parquet(tmp_path / "whole.parquet")
    cfg = DataConfig(source=str(folder), time_col="timestamp", min_item_count=2)
    whole = prepare(read_interactions(DataConfig(source=str(tmp_path / "whole.parquet"), time_col="timestamp")), cfg)
    memory, disk = both(cfg, tmp_path / "ds")
    assert_same(whole, memory)
    assert_same(whole, disk)


def test_float_ids_in_parquet_read_as_their_whole_column(tmp_path):
    # users: integral in the first batches, not in the last; items: integral throughout
    log = pd.DataFrame({"user": [1.0] * 10 + [2.5] * 10, "item": [3.0, 4.0] * 10, "timestamp": range(20)})
    log.to_parquet(tmp_path / "log.parquet")
    cfg = DataConfig(source=str(tmp_path / "log.parquet"), time_col="timestamp", min_item_count=1, min_user_count=1)
    memory, disk = both(cfg, tmp_path / "ds")
    assert_same(memory, disk)
    assert disk.user_raw.tolist() == ["1", "2.5"] and sorted(disk.item_raw[1:]) == ["3", "4"]  # the id rule


def test_the_id_rule_holds_out_of_core(tmp_path):
    """recsys.data.ids: ``17`` and ``17.0`` are one id, ``007`` and ``7`` two, in both paths."""
    lines = ["user,item,timestamp"] + [
        f"{u},{i},{t}" for t, (u, i) in enumerate([("17", "007")] * 3 + [("17.0", "7")] * 3)
    ]
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    cfg = DataConfig(source=str(tmp_path / "log.csv"), time_col="timestamp", min_item_count=1, min_user_count=1)
    memory, disk = both(cfg, tmp_path / "ds")
    assert_same(memory, disk)
    assert disk.user_raw.tolist() == ["17"] and sorted(disk.item_raw[1:]) == ["007", "7"]


def deep_csv(path: Path, bad_line: int, bad: str, rows: int = 60) -> None:
    """A CSV of ``rows`` good lines (the header is line 1) with ``bad`` as line ``bad_line``."""
    lines = ["user,item,timestamp"] + [f"u{i % 5},i{i % 4},{i}" for i in range(rows)]
    lines.insert(bad_line - 1, bad)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "bad",
    ["u1,i1,5,extra", ",i1,5", "u1,i1,soon", 'u1,"i\n1",5'],
    ids=["too many fields", "empty user", "time not a number", "quote over lines"],
)
def test_a_malformed_row_deep_in_the_file_names_its_line(tmp_path, bad):
    path = tmp_path / "log.csv"
    deep_csv(path, bad_line=40, bad=bad)  # chunks of 7 rows: the sixth chunk
    cfg = DataConfig(source=str(path), min_item_count=1, min_user_count=1)
    with pytest.raises(DataError) as memory:
        read_interactions(cfg)
    with pytest.raises(DataError) as disk:
        prepare_on_disk(cfg, tmp_path / "ds")
    assert str(disk.value) == str(memory.value)
    assert str(disk.value).startswith(f"{path}:40: ")
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds.*"))  # nothing published, nothing left


def outcome(read) -> object:
    """``(rows, DataWarning messages)`` of a read, or its DataError's message."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            df = read()
        except DataError as err:
            return str(err)
    return df[["user", "item", "time"]].to_numpy().tolist(), [
        str(w.message) for w in caught if w.category is DataWarning
    ]


@DAMAGE_SETTINGS
@given(data=st.data(), fmt=st.sampled_from(["csv", "tsv"]), skip=st.booleans(), bom=st.booleans())
def test_damaged_files_read_alike_in_chunks(data, fmt, skip, bom):
    lines, end, name = data.draw(damaged_files(fmt))
    path = _write(lines, end, name, bom=bom, final_end=True)
    cfg = DataConfig(source=str(path), format=fmt, skip_bad_rows=skip)
    memory = outcome(lambda: read_interactions(cfg))
    disk = outcome(lambda: pd.concat(list(chunks.read_chunks(chunks.open_source(cfg))), ignore_index=True))
    assert disk == memory


def test_skipped_rows_are_counted_exactly(tmp_path):
    path = tmp_path / "log.csv"
    deep_csv(path, bad_line=12, bad="u1,i1,later")
    text = path.read_text().splitlines()
    text.insert(45, ",i2,7")
    text.insert(50, "u3,i3,8,9")
    path.write_text("\n".join(text) + "\n")
    cfg = DataConfig(source=str(path), min_item_count=1, min_user_count=1, skip_bad_rows=True)
    with pytest.warns(DataWarning) as memory_warnings:
        memory = prepare(read_interactions(cfg), cfg)
    with pytest.warns(DataWarning) as disk_warnings:
        disk = prepare_on_disk(cfg, tmp_path / "ds")
    said = [
        [str(w.message) for w in caught if w.category is DataWarning] for caught in (memory_warnings, disk_warnings)
    ]
    assert said[0] == said[1] == [f"{path}: skipped 3 malformed lines (line 12, 46, 51)"]
    assert_same(memory, disk)


def test_a_killed_preparation_leaves_nothing_read_and_restarts(tmp_path, monkeypatch):
    log = awkward_log(4, n=60_000).drop(columns="cat")
    log.to_csv(tmp_path / "log.csv", index=False)
    target = tmp_path / "ds"
    script = (
        "import sys; from recsys.data import chunks; chunks.CHUNK_ROWS = 50\n"
        "from recsys.config import DataConfig; from recsys.data.ondisk import prepare_on_disk\n"
        f"prepare_on_disk(DataConfig(source={str(tmp_path / 'log.csv')!r}, time_col='timestamp'), {str(target)!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".ds.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # well inside reading 1,200 chunks
    assert child.poll() is None, "the preparation ended before it could be killed"
    child.send_signal(signal.SIGKILL)
    child.wait()
    leftover = list(tmp_path.glob(".ds.tmp-*"))
    assert leftover and not target.exists()  # half a preparation, under a name no reader opens
    cfg = DataConfig(source=str(tmp_path / "log.csv"), time_col="timestamp")
    monkeypatch.setattr(chunks, "CHUNK_ROWS", 5_000)
    disk = prepare_on_disk(cfg, target)
    assert not any(p.exists() for p in leftover)  # the next preparation cleans up
    assert_same(prepare(read_interactions(cfg), cfg), disk)


def test_reused_keyed_by_file_and_settings(tmp_path, monkeypatch):
    awkward_log(5).drop(columns="cat").to_csv(tmp_path / "log.csv", index=False)

    def config(*extra: str):
        return load_config(
            None,
            [f"data.source={tmp_path / 'log.csv'}", "data.prepare=disk", f"data.cache_dir={tmp_path / 'c'}", *extra],
        )

    first = load_dataset(config())
    assert isinstance(first.items, np.memmap)
    from recsys.data import ondisk

    def refuse(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(ondisk, "prepare_on_disk", refuse)
    assert_same(load_dataset(config()), first)  # same file, same settings: reused
    monkeypatch.undo()
    monkeypatch.setattr(chunks, "CHUNK_ROWS", 7)
    load_dataset(config("data.min_item_count=2"))
    assert len(list((tmp_path / "c").iterdir())) == 2  # another setting, another folder
    os.utime(tmp_path / "log.csv", ns=(0, 0))
    load_dataset(config())
    assert len(list((tmp_path / "c").iterdir())) == 3  # the file changed


def test_auto_prepares_small_files_in_memory(tmp_path, monkeypatch):
    awkward_log(6).drop(columns="cat").to_csv(tmp_path / "log.csv", index=False)
    cfg = load_config(None, [f"data.source={tmp_path / 'log.csv'}", f"data.cache_dir={tmp_path / 'c'}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not isinstance(load_dataset(cfg).items, np.memmap)  # under DISK_THRESHOLD
    monkeypatch.setattr("recsys.data.DISK_THRESHOLD", 1)
    cfg = load_config(None, [f"data.source={tmp_path / 'log.csv'}", f"data.cache_dir={tmp_path / 'd'}"])
    assert isinstance(load_dataset(cfg).items, np.memmap)


def test_saving_a_mapped_dataset_links_its_clicks(tmp_path):
    awkward_log(7).drop(columns="cat").to_csv(tmp_path / "log.csv", index=False)
    disk = prepare_on_disk(DataConfig(source=str(tmp_path / "log.csv"), time_col="timestamp"), tmp_path / "ds")
    disk.save(tmp_path / "run" / "dataset")
    for name in ("items", "times"):
        assert (tmp_path / "run/dataset" / f"{name}.npy").stat().st_ino == (
            tmp_path / "ds" / f"{name}.npy"
        ).stat().st_ino
    assert_same(Dataset.load(tmp_path / "run" / "dataset"), disk)


def test_the_published_folder_holds_the_dataset_only(tmp_path):
    """DuckDB's spill folder is removed before the dataset folder is published."""
    awkward_log(8).drop(columns="cat").to_csv(tmp_path / "log.csv", index=False)
    prepare_on_disk(DataConfig(source=str(tmp_path / "log.csv"), time_col="timestamp"), tmp_path / "ds")
    names = {path.name for path in (tmp_path / "ds").iterdir()}
    assert names == {f"{name}.npy" for name in ARRAYS} | {"dataset.json"}


def test_buckets_write_the_same_files(tmp_path, monkeypatch):
    """The clicks sorted a user at a time or all in one bucket: the same bytes, and the in-memory
    dataset (tied times and repeated items keep the file's order)."""
    awkward_log(4).drop(columns="cat").to_csv(tmp_path / "log.csv", index=False)
    cfg = DataConfig(source=str(tmp_path / "log.csv"), time_col="timestamp", min_item_count=2)
    for bucket_clicks in (1, 10**9):
        monkeypatch.setattr(ondisk, "BUCKET_CLICKS", bucket_clicks)
        disk = prepare_on_disk(cfg, tmp_path / f"ds-{bucket_clicks}")
    assert_same(prepare(read_interactions(cfg), cfg), disk)
    for name in ("items", "times", "indptr"):
        assert (tmp_path / "ds-1" / f"{name}.npy").read_bytes() == (
            tmp_path / f"ds-{10**9}" / f"{name}.npy"
        ).read_bytes()


def test_progress_bars_and_memory_limit(tmp_path, monkeypatch):
    """With bars on (the numbering pass runs in a second thread, its progress polled), the same
    dataset; DuckDB's memory grows with the log between its bounds, and the variable decides."""
    awkward_log(5).drop(columns="cat").to_csv(tmp_path / "log.csv", index=False)
    cfg = DataConfig(source=str(tmp_path / "log.csv"), time_col="timestamp", min_item_count=2)
    assert_same(prepare(read_interactions(cfg), cfg), prepare_on_disk(cfg, tmp_path / "ds", progress=True))
    monkeypatch.delenv("RECSYS_PREPARE_MEMORY", raising=False)
    assert ondisk.memory_limit(1000) == "768MB"
    assert ondisk.memory_limit(3 << 30) == "1536MB"
    assert ondisk.memory_limit(1 << 40) == "8192MB"
    monkeypatch.setenv("RECSYS_PREPARE_MEMORY", "2GB")
    assert ondisk.memory_limit(1000) == "2GB"
