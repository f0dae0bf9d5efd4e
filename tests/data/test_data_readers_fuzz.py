"""Property-based tests of the readers (Hypothesis): random bytes, encodings, delimiters,
quoting and ids. A reader either returns clicks or raises DataError naming the file (and the
line, for a malformed line), and ids come back exactly as written."""

import csv
import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recsys.config import DataConfig
from recsys.data.readers import DataError, read_interactions

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMATS = ["auto", "csv", "tsv", "comirec", "sequences"]

# ids: any text a CSV field can hold (quotes, delimiters, spaces at either end), but no line
# breaks, no NUL and not only blanks
_id_chars = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00") | st.sampled_from(
    [" ", "\t", ",", '"', "'", "é", "😀"])
ids = st.text(_id_chars, min_size=1, max_size=12).filter(lambda s: s.strip() != "")


def _read(path: Path, **kw):
    return read_interactions(DataConfig(source=str(path), **kw))


def _file(data: bytes, name: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="recsys-fuzz-"))
    path = folder / name
    path.write_bytes(data)
    return path


@SETTINGS
@given(data=st.binary(max_size=400), name=st.sampled_from(["x.csv", "x.tsv", "x.txt", "x"]),
       fmt=st.sampled_from(FORMATS), skip=st.booleans())
def test_random_bytes_give_clicks_or_a_data_error_naming_the_file(data, name, fmt, skip):
    path = _file(data, name)
    try:
        df = _read(path, format=fmt, skip_bad_rows=skip, time_col="" if fmt in ("csv", "tsv") else "timestamp")
    except DataError as err:
        assert str(path) in str(err) or "data.format" in str(err)
    else:
        assert {"user", "item", "time"} <= set(df.columns) and len(df) > 0


@SETTINGS
@given(text=st.text(max_size=200), encoding=st.sampled_from(["utf-8", "utf-16", "latin-1", "cp1252"]),
       fmt=st.sampled_from(FORMATS))
def test_text_in_any_encoding_gives_clicks_or_a_data_error(text, encoding, fmt):
    try:
        data = text.encode(encoding)
    except UnicodeEncodeError:
        return
    path = _file(data, "clicks.txt")
    try:
        _read(path, format=fmt, time_col="")
    except DataError as err:
        assert str(path) in str(err)


@SETTINGS
@given(rows=st.lists(st.tuples(ids, ids, st.integers(0, 10**9)), min_size=1, max_size=25),
       sep=st.sampled_from([",", "\t"]),
       quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
       line_end=st.sampled_from(["\n", "\r\n"]))
def test_ids_round_trip_exactly_through_any_delimiter_and_quoting(rows, sep, quoting, line_end):
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=sep, quoting=quoting, lineterminator=line_end)
    writer.writerow(["user", "item", "timestamp"])
    writer.writerows(rows)
    path = _file(buf.getvalue().encode("utf-8"), "clicks.csv" if sep == "," else "clicks.tsv")
    df = _read(path)
    assert df["user"].tolist() == [u for u, _, _ in rows]
    assert df["item"].tolist() == [i for _, i, _ in rows]
    assert df["time"].tolist() == [float(t) for _, _, t in rows]


@SETTINGS
@given(n=st.integers(2, 30), data=st.data(),
       problem=st.sampled_from(["too many fields", "empty user", "empty item", "bad time"]))
def test_a_malformed_line_is_named_by_its_number(n, data, problem):
    rows = [f"u{i % 3},i{i},{i}" for i in range(n)]
    at = data.draw(st.integers(0, n - 1))
    rows[at] = {"too many fields": f"u1,i1,{at},extra", "empty user": f" ,i1,{at}",
                "empty item": f"u1,,{at}", "bad time": "u1,i1,soon"}[problem]
    path = _file(("user,item,timestamp\n" + "\n".join(rows) + "\n").encode(), "clicks.csv")
    with pytest.raises(DataError) as err:
        _read(path)
    assert f"{path}:{at + 2}:" in str(err.value)  # header is line 1
    with pytest.warns(UserWarning, match=f"line {at + 2}"):
        df = _read(path, skip_bad_rows=True)
    assert len(df) == n - 1
