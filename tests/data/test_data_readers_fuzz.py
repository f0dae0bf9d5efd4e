"""Property-based tests of the readers (Hypothesis): random bytes, encodings, delimiters,
quoting and ids, and files of clean rows with random damage. A reader either returns clicks or
raises DataError naming the file (and the line, for a malformed line), ids come back exactly as
written, and every line of a damaged file is either a click or counted in the skip warning."""

import csv
import io
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recsys.config import DataConfig
from recsys.data.readers import DataError, read_interactions

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMATS = ["auto", "csv", "tsv", "comirec", "sequences"]

# ids: any text a CSV field can hold (quotes, delimiters, spaces at either end), but no line
# breaks, no NUL and not only blanks
_id_chars = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00") | st.sampled_from(
    [" ", "\t", ",", '"', "'", "é", "😀"]
)
ids = st.text(_id_chars, min_size=1, max_size=12).filter(lambda s: s.strip() != "" and "\ufeff" not in s)


def _read(path: Path, **kw):
    return read_interactions(DataConfig(source=str(path), **kw))


def _file(data: bytes, name: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="recsys-fuzz-"))
    path = folder / name
    path.write_bytes(data)
    return path


@SETTINGS
@given(
    data=st.binary(max_size=400),
    name=st.sampled_from(["x.csv", "x.tsv", "x.txt", "x"]),
    fmt=st.sampled_from(FORMATS),
    skip=st.booleans(),
)
def test_random_bytes_give_clicks_or_a_data_error_naming_the_file(data, name, fmt, skip):
    path = _file(data, name)
    try:
        df = _read(path, format=fmt, skip_bad_rows=skip, time_col="" if fmt in ("csv", "tsv") else "timestamp")
    except DataError as err:
        assert str(path) in str(err) or "data.format" in str(err)
    else:
        assert {"user", "item", "time"} <= set(df.columns) and len(df) > 0


@SETTINGS
@given(
    text=st.text(max_size=200),
    encoding=st.sampled_from(["utf-8", "utf-16", "latin-1", "cp1252"]),
    fmt=st.sampled_from(FORMATS),
)
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
@given(
    rows=st.lists(st.tuples(ids, ids, st.integers(0, 10**9)), min_size=1, max_size=25),
    sep=st.sampled_from([",", "\t"]),
    quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
    line_end=st.sampled_from(["\n", "\r\n"]),
)
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


HUGE = 140_000  # characters: past the 131,072 that Python's csv module allows in one field
DAMAGES = ("open quote", "extra field", "missing time", "empty user", "bad time", "invalid utf-8")
DAMAGE_SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Line:
    """One line of a generated file: its bytes (no line end), the click it holds (``None``: a
    malformed line) and whether it opens a quote it does not close."""

    data: bytes
    row: tuple[str, str, float] | None = None
    opens_quote: bool = False

    def __repr__(self) -> str:  # a failing example stays readable with a huge field in it
        data = self.data if len(self.data) < 80 else self.data[:40] + b"..." + self.data[-20:]
        return f"Line({data!r}, row={'None' if self.row is None else 'click'}, opens_quote={self.opens_quote})"

    def _repr_pretty_(self, printer, cycle) -> None:  # how Hypothesis prints an example
        printer.text(repr(self))


def _damaged(damage: str, sep: str, draw) -> Line:
    """A malformed line (its ids plain, so the only quote in it is the damage's)."""
    fields = ["du", "di", "7"]
    if damage == "open quote":
        at = draw(st.integers(0, 2))
        fields[at] = '"' + fields[at]
        return Line(sep.join(fields).encode(), opens_quote=True)
    if damage == "invalid utf-8":
        return Line(sep.join(fields).encode().replace(b"di", b"d\xffi"))
    text = {
        "extra field": fields + ["x"],
        "missing time": fields[:2],
        "empty user": [""] + fields[1:],
        "bad time": fields[:2] + ["soon"],
    }[damage]
    return Line(sep.join(text).encode())


@st.composite
def damaged_files(draw, fmt: str) -> tuple[list[Line], bytes, str]:
    """``(lines, line end, name)``: a header (CSV/TSV) and clean rows, some lines damaged, blank
    lines between, and ids that need quoting unless a damage opens a quote."""
    sep = {"csv": ",", "tsv": "\t"}.get(fmt, " ")
    n = draw(st.integers(1, 20))
    damages = draw(st.dictionaries(st.integers(0, n - 1), st.sampled_from(DAMAGES), max_size=4))
    if fmt == "sequences":
        damages = {k: v for k, v in damages.items() if v in ("invalid utf-8", "extra field")}
    plain = "open quote" in damages.values() or fmt == "sequences"
    id_text = tokens if fmt == "sequences" else ids.filter(lambda s: not set(s) & set('",\t')) if plain else ids
    lines = [] if fmt == "sequences" else [Line(sep.join(["user", "item", "timestamp"]).encode())]
    for k in range(n):
        if k in damages:
            lines.append(_damaged(damages[k], sep, draw) if fmt != "sequences" else _bad_sequence(damages[k]))
            continue
        user, item = draw(id_text), draw(id_text)
        if draw(st.integers(0, 9)) == 0:
            item = "h" * HUGE
        if fmt == "sequences":
            items = [item] + draw(st.lists(id_text, max_size=3))
            lines.append(Line(" ".join([user, *items]).encode(), (user, tuple(items))))
            continue
        time = draw(st.integers(0, 10**9))
        buf = io.StringIO()
        csv.writer(buf, delimiter=sep, lineterminator="").writerow([user, item, time])
        lines.append(Line(buf.getvalue().encode(), (user, item, float(time))))
    for at in sorted(draw(st.lists(st.integers(1, len(lines)), max_size=3)), reverse=True):
        lines.insert(at, Line(draw(st.sampled_from([b"", b"  "]))))
    name = {"csv": "clicks.csv", "tsv": "clicks.tsv"}.get(fmt, "seq.txt")
    return lines, draw(st.sampled_from([b"\n", b"\r\n", b"\r"])), name


tokens = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters="\ufeff"),
    min_size=1,
    max_size=8,
).filter(lambda s: s.split() == [s])


def _bad_sequence(damage: str) -> Line:
    """A malformed one-user-per-line line: a user without clicks, or an id that is not UTF-8."""
    return Line(b"lonely") if damage == "extra field" else Line(b"du a \xff b")


def _write(lines: list[Line], end: bytes, name: str, *, bom: bool, final_end: bool) -> Path:
    data = end.join(line.data for line in lines) + (end if final_end else b"")
    return _file((b"\xef\xbb\xbf" if bom else b"") + data, name)


def _expected(lines: list[Line], fmt: str) -> tuple[int | None, int | None, list, int]:
    """``(first malformed line, the line of a quote never closed, the rows kept, lines skipped)``
    for a damaged file, lines numbered from 1: a quote opened on one line closes at the next
    line that opens one, and everything between is one malformed row."""
    opens = [n for n, line in enumerate(lines, 1) if line.opens_quote]
    spans = list(zip(opens[0::2], opens[1::2]))
    unclosed = opens[-1] if len(opens) % 2 else None

    def swallowed(n: int) -> bool:
        return any(a <= n <= b for a, b in spans)

    data = list(enumerate(lines, 1))[0 if fmt == "sequences" else 1 :]
    bad = [n for n, line in data if line.row is None and line.data.strip()]
    kept = [line.row for n, line in data if line.row is not None and not swallowed(n)]
    skipped = sum(b - a + 1 for a, b in spans) + sum(1 for n in bad if not swallowed(n) and n != unclosed)
    return (bad[0] if bad else None), unclosed, kept, skipped


def _read_checked(path: Path, fmt: str, skip: bool):
    """The reader's answer: ``(clicks, skip warning or "")``, or the DataError's one line (any
    other exception fails the test)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            df = _read(path, format=fmt, skip_bad_rows=skip, time_col="" if fmt == "sequences" else "timestamp")
        except DataError as err:
            assert "\n" not in str(err), str(err)
            return None, str(err)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) <= 1, messages
    return df, messages[0] if messages else ""


def _skipped_lines(warning: str) -> int:
    """Lines a skip warning counts: 'skipped N malformed lines' or '... rows on N lines'."""
    match = re.search(r"skipped ([\d,]+) malformed (?:lines?|rows? on ([\d,]+) lines?)", warning)
    assert match, warning
    return int((match.group(2) or match.group(1)).replace(",", ""))


def _clicks(df, fmt: str) -> list[tuple]:
    """The clicks read, as the generator wrote them: (user, item, time), or (user, item) for
    one-user-per-line files (their time is a position)."""
    columns = [df["user"], df["item"]] if fmt == "sequences" else [df["user"], df["item"], df["time"]]
    return list(zip(*columns))


def _flat(kept: list, fmt: str) -> list[tuple]:
    return [(user, item) for user, items in kept for item in items] if fmt == "sequences" else kept


@DAMAGE_SETTINGS
@given(
    data=st.data(),
    fmt=st.sampled_from(["csv", "tsv", "sequences"]),
    skip=st.booleans(),
    bom=st.booleans(),
    final_end=st.booleans(),
)
def test_damaged_file_is_a_line_named_error_or_every_line_accounted_for(data, fmt, skip, bom, final_end):
    lines, end, name = data.draw(damaged_files(fmt))
    path = _write(lines, end, name, bom=bom, final_end=final_end)
    first_bad, unclosed, kept, skipped = _expected(lines, fmt)
    df, message = _read_checked(path, fmt, skip)
    if first_bad is not None and (not skip or unclosed is not None):
        expected_line = first_bad if not skip else unclosed
        assert df is None and message.startswith(f"{path}:{expected_line}: "), message
        return
    if not kept:
        assert df is None and message == f"{path}: no clicks found", message
        return
    assert df is not None, message
    assert _clicks(df, fmt) == _flat(kept, fmt)  # no id changed, no click lost or invented
    assert (_skipped_lines(message) if message else 0) == skipped, message
    if fmt == "sequences" and message:
        lost = sum(len(line.data.split()) - 1 for line in lines if line.row is None and line.data.strip())
        assert f"holding {lost:,} click" in message, message
