"""Readers: every format on small temporary files, format detection, malformed input."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.config import DataConfig
from recsys.data.readers import (
    DataError,
    DataWarning,
    detect_format,
    read_categories,
    read_frame,
    read_interactions,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def read(source: Path, **kw) -> pd.DataFrame:
    return read_interactions(DataConfig(source=str(source), **kw))


def test_csv_with_named_columns_and_category(tmp_path):
    path = write(tmp_path / "log.csv", "uid,ts,iid,cat\na,10,x,c1\na, 5,y,\nb,7, z ,c2\n")
    df = read(path, user_col="uid", item_col="iid", time_col="ts", category_col="cat")
    assert list(df.columns) == ["user", "item", "time", "category"]
    assert df["user"].tolist() == ["a", "a", "b"]
    assert df["item"].tolist() == ["x", "y", " z "]  # ids exactly as written: they round-trip
    assert df["time"].dtype == np.float64 and df["time"].tolist() == [10.0, 5.0, 7.0]
    assert df["category"].tolist()[0] == "c1" and pd.isna(df["category"].iloc[1])
    assert df.attrs["time_is_position"] is False


def test_csv_without_time_column_uses_position_within_user(tmp_path):
    path = write(tmp_path / "log.csv", "user,item\nu1,a\nu2,b\nu1,c\nu1,d\n")
    df = read(path, time_col="")
    assert df["time"].tolist() == [0.0, 0.0, 1.0, 2.0]
    assert df.attrs["time_is_position"] is True


def test_tsv_and_iso_datetimes(tmp_path):
    path = write(tmp_path / "log.tsv", "user\titem\ttimestamp\n1\t2\t2020-01-01T00:00:00Z\n1\t3\t2020-01-01 00:01:00\n")
    df = read(path)
    assert df["time"].tolist() == [1577836800.0, 1577836860.0]


def test_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "log.parquet"
    pd.DataFrame({"user": [1, 1, 2], "item": [10.0, 11.0, 10.0], "timestamp": [3, 1, 2]}).to_parquet(path)
    df = read(path)
    assert df["user"].tolist() == ["1", "1", "2"]
    assert df["item"].tolist() == ["10", "11", "10"]  # integral floats keep no ".0"
    assert df["time"].tolist() == [3.0, 1.0, 2.0]


def test_parquet_missing_value_names_the_row(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "log.parquet"
    pd.DataFrame({"user": ["a", None, "b"], "item": ["x", "y", "z"], "timestamp": [1, 2, 3]}).to_parquet(path)
    with pytest.raises(DataError, match=r"log\.parquet: row 2: empty user \(set data\.skip_bad_rows=true to drop"):
        read(path)
    with pytest.warns(DataWarning, match="skipped 1 malformed row"):
        assert len(read(path, skip_bad_rows=True)) == 2


def test_comirec_files_find_their_category_file(tmp_path):
    write(tmp_path / "book_train.txt", "0,5,0\n0,6,1\n1,5,0\n")
    write(tmp_path / "book_item_cate.txt", "5,1\n6,2\n99,3\n")
    df = read(tmp_path)  # a folder: the category file is not mistaken for data
    assert df["user"].tolist() == ["0", "0", "1"]
    assert df["time"].tolist() == [0.0, 1.0, 0.0]
    assert df["category"].tolist() == ["1", "2", "1"]
    assert df.attrs["time_is_position"] is True


def test_comirec_train_valid_test_folder_is_concatenated(tmp_path):
    write(tmp_path / "book_train.txt", "0,5,0\n0,6,1\n")
    write(tmp_path / "book_valid.txt", "1,5,0\n")
    write(tmp_path / "book_test.txt", "2,7,0\n")
    df = read(tmp_path)
    assert sorted(df["user"].unique()) == ["0", "1", "2"]
    assert len(df) == 4


def test_movielens_first_genre_is_the_category(tmp_path):
    write(tmp_path / "u.data", "1\t10\t5\t100\n1\t11\t3\t50\n2\t12\t4\t70\n")
    write(tmp_path / "u.genre", "unknown|0\nAction|1\nComedy|2\n\n")
    flags = {"10": "0|0|1", "11": "0|1|1", "12": "1|0|0"}  # 12: only 'unknown'
    write(tmp_path / "u.item", "".join(f"{i}|Title {i}|01-Jan-1995||http://x|{f}\n" for i, f in flags.items()))
    df = read(tmp_path)
    assert df["time"].tolist() == [100.0, 50.0, 70.0]
    assert df["category"].tolist()[:2] == ["Comedy", "Action"]
    assert pd.isna(df["category"].iloc[2])


def test_sequences_file(tmp_path):
    path = write(tmp_path / "seq.txt", "u1 a b c\n\nu2 b\nu1 d\n")
    df = read(path)
    assert df["user"].tolist() == ["u1"] * 3 + ["u2", "u1"]
    assert df["item"].tolist() == ["a", "b", "c", "b", "d"]
    assert df["time"].tolist() == [0.0, 1.0, 2.0, 0.0, 3.0]  # position continues across lines


def test_separate_category_file_with_and_without_header(tmp_path):
    data = write(tmp_path / "seq.txt", "u1 a b\nu2 c\n")
    for text in ("item,category\na,x\nb,y\na,z\n", "a\tx\nb\ty\n"):
        cats = write(tmp_path / "cats.csv", text)
        df = read(data, categories=str(cats))
        assert df["category"].tolist()[:2] == ["x", "y"]  # 'a' keeps its first category
        assert pd.isna(df["category"].iloc[2])
    assert read_categories(write(tmp_path / "c2.csv", "id,cat\n1,7\n")).to_dict() == {"1": "7"}


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("a.csv", "user,item,timestamp\n1,2,3\n", "csv"),
        ("a.tsv", "user\titem\n1\t2\n", "tsv"),
        ("a.txt", "1,2,0\n1,3,1\n", "comirec"),
        ("a.txt", "user,item,t\n1,2,0\n", "csv"),
        ("a.txt", "1 2 3 4\n", "sequences"),
        ("a.dat", "user\titem\n1\t2\n", "tsv"),
        ("u.data", "1\t2\t3\t4\n", "movielens"),
    ],
)
def test_detect_format(tmp_path, name, text, fmt):
    assert detect_format(write(tmp_path / name, text))[0] == fmt


def test_folder_with_several_data_files_is_ambiguous(tmp_path):
    write(tmp_path / "a.csv", "user,item\n")
    write(tmp_path / "b.csv", "user,item\n")
    with pytest.raises(DataError, match="a.csv, b.csv"):
        read(tmp_path)


def test_missing_column_names_the_option_and_header(tmp_path):
    path = write(tmp_path / "log.csv", "user,item,time\n1,2,3\n")
    with pytest.raises(DataError, match=r"no column 'timestamp' \(data.time_col\).*'user', 'item', 'time'"):
        read(path)


def test_missing_source(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read(tmp_path / "nope.csv")


CSV_HEADER = "user,item,timestamp\n"


@pytest.mark.parametrize(
    ("body", "line", "reason"),
    [
        ("1,2,3\n1,2,3,4\n", 3, "expected 3 fields, found 4"),
        ("1,2,3,4\n1,2,3\n", 2, "expected 3 fields, found 4"),  # the first data line too
        ("1,2,3\n,2,3\n", 3, "empty user"),
        ("1,2,3\n1, ,3\n", 3, "empty item"),
        ("1,2,3\n1,2,abc\n", 3, "time 'abc' is not a number"),
        ("1,2,3\n1,2,nan\n", 3, "time 'nan' is not a number"),
        ("1,2,3\n\n\n1,2\n", 5, r"time '' is not a number \(the line has 2 of 3 fields\)"),
    ],
)
def test_malformed_csv_names_file_and_line(tmp_path, body, line, reason):
    path = write(tmp_path / "log.csv", CSV_HEADER + body)
    with pytest.raises(DataError, match=rf"log\.csv:{line}: {reason}"):
        read(path)


def test_skip_bad_rows_drops_and_counts(tmp_path):
    body = "1,a,1\n1,b,x\n\n2,c,2,9\n2,d,3\n,e,4\n3,f,5\n3,g,\n"
    path = write(tmp_path / "log.csv", CSV_HEADER + body)
    with pytest.warns(DataWarning, match=r"skipped 4 malformed lines \(line 3, 5, 7, 9\)"):
        df = read(path, skip_bad_rows=True)
    assert df["item"].tolist() == ["a", "d", "f"]
    assert df["time"].tolist() == [1.0, 3.0, 5.0]


def test_skip_warning_lists_only_the_first_lines(tmp_path):
    path = write(tmp_path / "log.csv", CSV_HEADER + "1,a,1\n" + "1,b,x\n" * 8)
    with pytest.warns(DataWarning, match=r"skipped 8 malformed lines \(line 3, 4, 5, 6, 7, \.\.\.\)"):
        assert len(read(path, skip_bad_rows=True)) == 1


def test_clean_file_gives_no_warning(tmp_path):
    path = write(tmp_path / "log.csv", CSV_HEADER + "1,a,1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read(path, skip_bad_rows=True)


def test_malformed_comirec_and_sequences(tmp_path):
    comirec = write(tmp_path / "x" / "d_train.txt", "0,5,0\n0,6\n")
    with pytest.raises(DataError, match=r"d_train\.txt:2: time ''"):
        read(comirec, format="comirec")
    seq = write(tmp_path / "seq.txt", "u1 a b\nu2\nu3 c\n")
    with pytest.raises(DataError, match=r"seq\.txt:2: expected 'user item item \.\.\.'"):
        read(seq)
    with pytest.warns(DataWarning, match=r"skipped 1 malformed line \(line 2\)"):
        assert read(seq, skip_bad_rows=True)["user"].tolist() == ["u1", "u1", "u3"]


def test_malformed_category_file_and_movielens(tmp_path):
    data = write(tmp_path / "seq.txt", "u1 a b\n")
    cats = write(tmp_path / "cats.csv", "a,x\nb,\n")
    with pytest.raises(DataError, match=r"cats\.csv:2: empty category"):
        read(data, categories=str(cats))
    ml = tmp_path / "ml"
    write(ml / "u.data", "1\t10\t5\t100\n1\t11\t3\n")
    with pytest.raises(DataError, match=r"u\.data:2: time ''"):
        read(ml)
    write(ml / "u.data", "1\t10\t5\t100\n")
    write(ml / "u.genre", "unknown|0\nAction|1\n")
    write(ml / "u.item", "10|T|d||u|0|1\n10|T|d||u|0|7\n")
    with pytest.raises(DataError, match=r"u\.item:2: expected"):
        read(ml)


def test_undecodable_line_is_reported(tmp_path):
    path = tmp_path / "log.csv"
    path.write_bytes(CSV_HEADER.encode() + b"1,a,1\n1,\xff\xfe,2\n")
    with pytest.raises(DataError, match=r"log\.csv:3: not valid utf-8"):
        read(path)
    seq = tmp_path / "seq.txt"
    seq.write_bytes(b"u1 a b\nu2 \xff c\n")
    with pytest.raises(DataError, match=r"seq\.txt:2: not valid utf-8"):
        read(seq)


def clicks_csv(n: int, damaged: dict[int, str] | None = None) -> str:
    """A header and ``n`` clean clicks ``u{i % 60},i{i % 300},{i}``; ``damaged`` replaces lines
    by number (the header is line 1)."""
    lines = [CSV_HEADER.rstrip("\n")] + [f"u{i % 60},i{i % 300},{i}" for i in range(n)]
    for lineno, text in (damaged or {}).items():
        lines[lineno - 1] = text
    return "\n".join(lines) + "\n"


def test_quote_never_closed_is_an_error_at_its_line_even_when_skipping(tmp_path):
    path = write(tmp_path / "log.csv", clicks_csv(3600, {52: 'u4,"i7,3'}))
    for skip in (False, True):
        with pytest.raises(DataError, match=r"log\.csv:52: a quote opens here and is never closed"):
            read(path, skip_bad_rows=skip)


def test_quote_closed_lines_later_skips_every_line_it_swallowed(tmp_path):
    path = write(tmp_path / "log.csv", clicks_csv(3600, {52: 'u4,"i7,3', 60: 'u9,"i9,9'}))
    with pytest.raises(DataError, match=r"log\.csv:52: a quote opens the item field here and closes only on line 60"):
        read(path)
    with pytest.warns(DataWarning, match=r"skipped 1 malformed row on 9 lines \(lines 52-60\)"):
        df = read(path, skip_bad_rows=True)
    assert len(df) == 3600 - 9
    assert df["item"].str.len().max() <= 4  # nothing swallowed into an id


def test_quoted_line_break_in_a_column_not_read_is_one_row(tmp_path):
    path = write(tmp_path / "log.csv", 'user,item,timestamp,review\nu1,a,1,"good\nvery good"\nu1,b,2,\n')
    df = read(path)
    assert df["item"].tolist() == ["a", "b"] and df["time"].tolist() == [1.0, 2.0]


def test_every_row_with_one_field_too_many_is_an_error_not_a_shifted_table(tmp_path):
    path = write(tmp_path / "log.csv", CSV_HEADER + "u1,i1,3,7\nu2,i2,4,8\n")  # pandas would take column 1 as an index
    with pytest.raises(DataError, match=r"log\.csv:2: expected 3 fields, found 4"):
        read(path)


def test_byte_order_mark_is_dropped_in_every_text_format(tmp_path):
    bom = "\ufeff"
    csv_path = write(tmp_path / "a" / "log.csv", bom + CSV_HEADER + "u1,i1,3\n")
    assert read(csv_path)["user"].tolist() == ["u1"]
    seq = write(tmp_path / "b" / "seq.txt", bom + "u0 a b\nu1 c d\n")
    assert read(seq)["user"].tolist() == ["u0", "u0", "u1", "u1"]
    comirec = write(tmp_path / "c" / "book_train.txt", bom + "0,5,0\n0,6,1\n")
    assert detect_format(comirec)[0] == "comirec" and read(comirec)["user"].tolist() == ["0", "0"]
    cats = write(tmp_path / "d" / "cats.csv", bom + "item,category\na,x\n")
    assert read_categories(cats).to_dict() == {"a": "x"}
    bad = write(tmp_path / "e" / "log.csv", bom + CSV_HEADER + "u1,i1,3\nu1,i1,soon\n")
    with pytest.raises(DataError, match=r"log\.csv:3: time 'soon'"):
        read(bad)


def test_lone_carriage_returns_end_lines(tmp_path):
    seq = write(tmp_path / "seq.txt", "u0 a b\ru1 c d\r")
    assert read(seq)["user"].tolist() == ["u0", "u0", "u1", "u1"]
    path = tmp_path / "log.csv"
    path.write_bytes(b"user,item,timestamp\r1,a,1\r1,b,x\r2,c,2\r")
    with pytest.raises(DataError, match=r"log\.csv:3: time 'x'"):
        read(path)


def test_fields_longer_than_pythons_csv_limit_are_read(tmp_path):
    long_id = "x" * 140_000
    path = write(tmp_path / "log.csv", f'user,item,timestamp,{long_id}\nu1,"{long_id}",1,\nu2,i2,soon,\n')
    with pytest.warns(DataWarning, match=r"skipped 1 malformed line \(line 3\)"):
        df = read(path, skip_bad_rows=True)
    assert df["item"].tolist() == [long_id]
    cats = write(tmp_path / "cats.csv", f"item,{long_id}\n{long_id},c\n")
    assert read_categories(cats).to_dict() == {long_id: "c"}


def test_skipped_sequence_lines_count_their_clicks(tmp_path):
    seq = tmp_path / "seq.txt"
    seq.write_bytes(b"u1 a b\nu2 \xff c\nu3\nu4 d\n")
    with pytest.raises(DataError, match=r"seq\.txt:2: not valid utf-8"):
        read(seq)
    with pytest.warns(DataWarning, match=r"skipped 2 malformed lines \(line 2, 3\) holding 2 clicks"):
        assert read(seq, skip_bad_rows=True)["user"].tolist() == ["u1", "u1", "u4"]


def test_data_frame_time_error_quotes_the_value(tmp_path):
    frame = pd.DataFrame({"user": ["a", "b"], "item": ["x", "y"], "timestamp": [1.0, np.nan]})
    with pytest.raises(
        DataError, match=r"^clicks: row 2: time nan is missing or not a number \(set data\.skip_bad_rows"
    ):
        read_frame(frame, DataConfig())
    frame["timestamp"] = ["1", "soon"]
    with pytest.raises(DataError, match=r"row 2: time 'soon' is missing"):
        read_frame(frame, DataConfig())


def test_parquet_missing_column_names_the_option(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "log.parquet"
    pd.DataFrame({"user": ["a"], "item": ["x"], "timestamp": [1]}).to_parquet(path)
    with pytest.raises(
        DataError,
        match=r"^\S*log\.parquet: no column 'cat' \(data\.category_col\); the columns are "
        r"\['user', 'item', 'timestamp'\]$",
    ):
        read(path, category_col="cat")
