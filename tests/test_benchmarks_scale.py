"""benchmarks/scale.py on a tiny log, in seconds: the log it writes in parts is the log it writes
whole, recsys prepares it in a child process whose peak RSS is read, and the sparse and dense
runs train, validate and test at equal steps."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from recsys.config import load_config
from recsys.data import load_dataset

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def scale(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as when the scripts run
    import prepare
    import scale

    monkeypatch.setattr(prepare, "_BLOCK", 5_000)  # several parts from a tiny log
    return scale


def test_parts_hold_the_whole_log_and_prepare_out_of_core(scale, tmp_path):
    scale.write_log(tmp_path / "whole.parquet", 12_000, parts=False)
    scale.write_log(tmp_path / "parts", 12_000, parts=True)
    assert len(list((tmp_path / "parts").glob("part-*.parquet"))) == 3
    assert not list(tmp_path.glob("*.partial"))
    measured = scale.prepare(tmp_path / "parts", tmp_path / "cache")
    parts = load_dataset(load_config(None, scale.data_settings(tmp_path / "parts", tmp_path / "cache")))
    whole = load_dataset(load_config(None, scale.data_settings(tmp_path / "whole.parquet", tmp_path / "cache")))
    assert isinstance(parts.items, np.memmap)  # prepared on disk
    np.testing.assert_array_equal(parts.items, whole.items)
    np.testing.assert_array_equal(parts.indptr, whole.indptr)
    assert measured["clicks"] == len(parts.items) > 10_000
    assert (measured["users"], measured["items"]) == (parts.num_users, parts.num_items - 1)
    assert 0.05 < measured["rss_gib"] < 4  # the child's, with torch imported


def test_training_rows_compare_sparse_and_dense_at_equal_steps(scale, tmp_path, capsys):
    scale.write_log(tmp_path / "log.parquet", 12_000, parts=False)
    tiny = ["model.backend=torch", "model.dim=16", "train.batch_size=32", "data.max_len=10"]  # no interpreted kernels
    rows = dict(scale.training_rows(tmp_path / "log.parquet", tmp_path, scale.torch.device("cpu"), 6, 0.0, tiny))
    names = ["training, sparse item updates", "training, dense item updates", "test Recall@50, equal steps"]
    assert list(rows) == names
    for updates in ("sparse", "dense"):
        row = rows[f"training, {updates} item updates"]
        assert row.startswith("6 steps, ")
        assert 0 < float(re.search(r"validation ([\d.]+)% of", row)[1]) < 100
    assert "valid @ 6" in capsys.readouterr().out  # the last step validates
