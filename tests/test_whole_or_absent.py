"""Issue 58: every file a user relies on is whole or absent, and a full disk is one line naming
the path. Each kind of write, through the CLI, with the writer's own call failing as a full disk
does (``OSError(ENOSPC)``, or the text DuckDB and FAISS wrap it in); the training run's own
(checkpoints, and how to resume) are in tests/train/test_stopped_runs.py."""

from __future__ import annotations

import errno
import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.cli import main

from conftest import TINY_RUN_OVERRIDES

TINY_DATA = [a for o in TINY_RUN_OVERRIDES if not o.startswith(("name=", "train.")) for a in ("--set", o)]
NO_ROOM = "no space left on device; free some space and run it again"


def _no_room(filename: str | None = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    """A copy of the session's tiny run without the indexes other tests may have saved in it."""
    return shutil.copytree(tiny_run, tmp_path / "run", ignore=shutil.ignore_patterns("index"))


def test_recommend_out_keeps_no_cut_file(tiny_run, tmp_path, monkeypatch, capsys):
    """Was: exit 2 with a CSV cut mid-line left behind, which a downstream job reads as complete."""
    real = pd.DataFrame.to_csv

    def fills_up(self, path, **kwargs):
        real(self.head(len(self) // 2), path, **kwargs)  # half the rows reach the disk
        raise _no_room()

    out = tmp_path / "recs.csv"
    monkeypatch.setattr(pd.DataFrame, "to_csv", fills_up)
    assert main(["recommend", tiny_run, "--all", "--out", str(out), "--quiet"]) == 2
    assert _error_line(capsys) == f"recsys recommend: error: {out}: {NO_ROOM}"
    assert _files(tmp_path) == []
    out.write_text("user,rank,item\nan,earlier,answer\n")  # an earlier answer stays whole
    assert main(["recommend", tiny_run, "--all", "--out", str(out), "--quiet"]) == 2
    assert out.read_text() == "user,rank,item\nan,earlier,answer\n" and _files(tmp_path) == ["recs.csv"]


def test_recommend_out_csv_gz_is_still_gzip(tiny_run, tmp_path):
    """The temporary file's name has no .gz: the compression is asked for, not inferred."""
    out = tmp_path / "recs.csv.gz"
    assert main(["recommend", tiny_run, "--all", "--n", "5", "--out", str(out), "--quiet"]) == 0
    with gzip.open(out, "rt") as f:
        assert f.readline().strip() == "user,rank,item,score,interest"


def test_data_out_leaves_no_half_dataset(tmp_path, monkeypatch, capsys):
    real, calls = np.save, []

    def fills_up(file, value, **kwargs):  # the second array finds the disk full after a few bytes
        calls.append(file)
        if len(calls) == 2:
            file.write(b"\x93NUMPY")
            raise _no_room()
        real(file, value, **kwargs)

    out = tmp_path / "prepared"
    monkeypatch.setattr(np, "save", fills_up)
    assert main(["data", *TINY_DATA, "--out", str(out), "--quiet"]) == 2
    assert _error_line(capsys) == f"recsys data: error: {out}: {NO_ROOM}"
    assert _files(tmp_path) == []


def test_preparation_out_of_core_names_the_folder_not_a_duckdb_traceback(tmp_path, monkeypatch, capsys):
    """Was: a DuckDB IOException traceback (its message names a spill file)."""
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    import recsys.data.ondisk as ondisk

    def fills_up(con, out, *args, **kwargs):
        (out / "items.npy").write_bytes(b"\x93NUMPY")
        spill = out / "spill" / "buckets" / "0.parquet"
        raise duckdb.IOException(f'IO Error: Could not write file "{spill}": No space left on device')

    rows = [f"u{u},i{(u * 7 + k) % 40},{k}" for u in range(60) for k in range(8)]
    (tmp_path / "clicks.csv").write_text("user,item,timestamp\n" + "\n".join(rows) + "\n")
    cache = tmp_path / "cache"
    monkeypatch.setattr(ondisk, "_write_clicks", fills_up)
    args = ["data", "--data", str(tmp_path / "clicks.csv"), "--set", "data.prepare=disk"]
    assert main([*args, "--set", f"data.cache_dir={cache}", "--quiet"]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"recsys data: error: {cache}/") and line.endswith(f": {NO_ROOM}"), line
    assert _files(cache) == []


def test_index_leaves_no_cut_index(run_copy, monkeypatch, capsys):
    import faiss

    def fills_up(index, path):
        Path(path).write_bytes(b"IxF2")
        raise RuntimeError(
            f"Error in faiss::FileIOWriter::operator()(const void*, size_t, size_t) at impl/io.cpp:101: "
            f"write error in {path}: 4 != 1024 (No space left on device)"
        )

    monkeypatch.setattr(faiss, "write_index", fills_up)
    assert main(["index", str(run_copy), "--factory", "HNSW8,Flat", "--quiet"]) == 2
    assert _error_line(capsys) == f"recsys index: error: {run_copy}/index/HNSW8_Flat.faiss: {NO_ROOM}"
    assert not list(run_copy.glob("index/*"))


def test_export_is_published_whole_or_not_at_all(run_copy, tmp_path, monkeypatch, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(run_copy), "--format", "torchscript", "--out", str(out)]) == 0
    before = {name: (out / name).read_bytes() for name in _files(out)}
    real = np.save

    def fills_up(file, value, **kwargs):
        real(file, value[: len(value) // 2], **kwargs)
        raise _no_room()

    monkeypatch.setattr(np, "save", fills_up)
    assert main(["export", str(run_copy), "--format", "torchscript", "--out", str(out)]) == 2
    assert _error_line(capsys) == f"recsys export: error: {out.resolve()}: {NO_ROOM}"
    assert {name: (out / name).read_bytes() for name in _files(out)} == before  # the earlier export, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]


def test_export_refuses_a_folder_holding_other_files(run_copy, tmp_path, capsys):
    """Publishing the export replaces its folder, so a folder with anything else in it is not used."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["export", str(run_copy), "--format", "torchscript", "--out", str(tmp_path / "mine")]) == 2
    assert "holds other files than an export" in _error_line(capsys)
    assert _files(tmp_path / "mine") == ["notes.txt"]


def test_tune_says_the_same_tune_resumes_it(tmp_path, monkeypatch):
    """A trial stopped by a full disk is queued again, and the line names the tune, not the trial's run."""
    pytest.importorskip("optuna")
    import recsys.tune
    from recsys.config import load_config
    from recsys.io import DiskFull, full_disk
    from recsys.tune import open_study, tune

    def fills_up(cfg, *, run_dir, **kwargs):  # as train raises it
        raise full_disk(_no_room(), run_dir / "model.pt", f"recsys train --resume {run_dir}")

    monkeypatch.setattr(recsys.tune, "train", fills_up)
    folder = tmp_path / "tune"
    with pytest.raises(DiskFull) as raised:
        tune(load_config(None, TINY_RUN_OVERRIDES), folder, trials=2, log=lambda line: None)
    assert str(raised.value) == (
        f"{folder}/trials/0000/model.pt: no space left on device; free some space; "
        f"running the same recsys tune again (folder {folder}) resumes it"
    )
    trials = open_study(folder).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"] and trials[1].user_attrs["base"]
