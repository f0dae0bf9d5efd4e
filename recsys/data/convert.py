"""Raw public-dataset files -> the prepared form ``recsys`` reads.

Each converter takes the dataset's raw files (in the order of its registry entry's
``[[dataset.files]]``) and an output folder, writes the prepared files there and returns their
counts. Most write ``clicks.csv`` (header ``user,item,timestamp[,category]``, unix seconds,
one row per click in the source's order; read with ``data.format = "csv"``); the ComiRec ones
write ComiRec's own files (:mod:`recsys.data.comirec_preprocess`). Archives (zip, tar, gzip)
are read in place; only MovieLens 100K is extracted, for the MovieLens reader.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.comirec_preprocess import comirec_categories, comirec_filter, write_comirec
from recsys.data.readers import DataError, read_interactions
from recsys.io import atomic_save

CLICKS = "clicks.csv"
Converter = Callable[[list[Path], Path], dict[str, int]]


def member_names(path: Path) -> list[str] | None:
    """The file names inside a zip or tar archive, or None when ``path`` is not one."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return [n for n in archive.namelist() if not n.endswith("/")]
    if tarfile.is_tarfile(path):
        with tarfile.open(path, "r:*") as archive:
            return [m.name for m in archive.getmembers() if m.isfile()]
    return None


@contextmanager
def open_member(path: Path, suffix: str = "") -> Iterator[IO[bytes]]:
    """A binary stream of ``path``: of its first member whose name ends with ``suffix`` when
    it is a zip or tar archive, decompressed when it is gzip, else the file itself."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            name = _member(path, [n for n in archive.namelist() if not n.endswith("/")], suffix)
            with archive.open(name) as stream:
                yield stream
        return
    if tarfile.is_tarfile(path):
        with tarfile.open(path, "r:*") as archive:
            members = {m.name: m for m in archive.getmembers() if m.isfile()}
            member = archive.extractfile(members[_member(path, list(members), suffix)])
            assert member is not None  # a regular file's member
            yield member
        return
    with path.open("rb") as head:
        gzipped = head.read(2) == b"\x1f\x8b"
    # a GzipFile is a binary stream (typeshed types it BufferedIOBase, not IO[bytes])
    with cast(IO[bytes], gzip.open(path, "rb")) if gzipped else path.open("rb") as file:
        yield file


def _member(path: Path, names: list[str], suffix: str) -> str:
    matches = [n for n in names if n.endswith(suffix)]
    if not matches:
        raise DataError(f"{path}: no file ending in {suffix!r} in the archive (it holds {names[:10]})")
    return matches[0]


def _records(path: Path, suffix: str, fields: tuple[str, ...], *, literal: bool = False) -> pd.DataFrame:
    """``fields`` of each line of a JSON-lines member (``literal``: Python dict literals, as in
    the 2014 Amazon metadata and the Steam reviews). Errors name the file and line."""
    parse = ast.literal_eval if literal else json.loads
    columns: list[list[object]] = [[] for _ in fields]
    for lineno, line in _text_lines(path, suffix):
        if not line.strip():
            continue
        try:
            record = parse(line)
            values = [record[f] for f in fields]
        except (ValueError, SyntaxError) as err:
            raise DataError(f"{path}:{lineno}: not a {'Python' if literal else 'JSON'} record ({err})") from None
        except KeyError as err:
            raise DataError(f"{path}:{lineno}: no field {err}") from None
        for column, value in zip(columns, values):
            column.append(value)
    return pd.DataFrame(dict(zip(fields, columns)))


def _text_lines(path: Path, suffix: str = "") -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of a UTF-8 member (see :func:`open_member`), a leading
    byte-order mark dropped; a line that is not UTF-8 raises :class:`DataError` naming it."""
    with open_member(path, suffix) as raw:
        for lineno, data in enumerate(raw, start=1):
            try:
                text = data.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}:{lineno}: not valid utf-8 text") from None
            yield lineno, text


def _csv(path: Path, suffix: str = "", **kwargs: Any) -> pd.DataFrame:
    with open_member(path, suffix) as stream:
        try:
            return pd.read_csv(stream, **kwargs)
        except (ValueError, pd.errors.ParserError) as err:
            raise DataError(f"{path}: {err}") from None


def write_clicks(df: pd.DataFrame, out: Path) -> dict[str, int]:
    """Write ``out/clicks.csv`` from columns ``user``, ``item``, ``timestamp`` and optional
    ``category``; returns the counts."""
    out.mkdir(parents=True, exist_ok=True)
    columns = [c for c in ("user", "item", "timestamp", "category") if c in df]
    atomic_save(out / CLICKS, lambda tmp: df[columns].to_csv(tmp, index=False))  # no .tmp left on failure
    counts = {"users": int(df["user"].nunique()), "items": int(df["item"].nunique()), "clicks": len(df)}
    if "category" in df:
        counts["categories"] = int(df["category"].nunique())
    return counts


def _first_genre(genres: pd.Series) -> pd.Series:
    first = genres.str.split("|").str[0]
    return first.where(first != "(no genres listed)")


def movielens_100k(files: list[Path], out: Path) -> dict[str, int]:
    """``ml-100k.zip``: extract ``u.data``, ``u.item``, ``u.genre`` and read them with the
    MovieLens reader (the first genre flag is the category)."""
    folder = out / "ml-100k"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(files[0]) as archive:
        for name in ("u.data", "u.item", "u.genre"):
            (folder / name).write_bytes(archive.read(_member(files[0], archive.namelist(), f"/{name}")))
    df = read_interactions(DataConfig(source=str(folder), format="movielens"))
    return write_clicks(df.rename(columns={"time": "timestamp"}), out)


def movielens_dat(files: list[Path], out: Path) -> dict[str, int]:
    """``ml-1m.zip``: ``ratings.dat`` (``user::movie::rating::time``) and ``movies.dat``
    (``movie::title::Genre|Genre``, latin-1); every rating is a click, the first genre the category."""
    with open_member(files[0], "/ratings.dat") as stream:
        text = stream.read().decode("latin-1").replace("::", "\t")
    ratings = pd.read_csv(io.StringIO(text), sep="\t", header=None, names=["user", "item", "rating", "timestamp"])
    with open_member(files[0], "/movies.dat") as stream:
        movies = [line.rsplit("::", 2) for line in stream.read().decode("latin-1").splitlines() if line.strip()]
    genres = pd.Series({int(m[0]): m[-1] for m in movies})
    ratings["category"] = ratings["item"].map(_first_genre(genres))
    return write_clicks(ratings, out)


def movielens_csv(files: list[Path], out: Path) -> dict[str, int]:
    """``ml-20m.zip``: ``ratings.csv`` (``userId,movieId,rating,timestamp``) and ``movies.csv``
    (``movieId,title,genres``)."""
    ratings = _csv(files[0], "/ratings.csv").rename(columns={"userId": "user", "movieId": "item"})
    movies = _csv(files[0], "/movies.csv")
    ratings["category"] = ratings["item"].map(_first_genre(movies.set_index("movieId")["genres"]))
    return write_clicks(ratings, out)


def amazon_reviews(files: list[Path], out: Path) -> dict[str, int]:
    """An Amazon 2014 5-core review file (JSON lines: ``reviewerID``, ``asin``, ``unixReviewTime``)."""
    df = _records(files[0], "", ("reviewerID", "asin", "unixReviewTime"))
    return write_clicks(df.set_axis(["user", "item", "timestamp"], axis=1), out)


def _unix_seconds(text: pd.Series, path: Path) -> pd.Series:
    stamps = pd.to_datetime(text, errors="coerce", utc=True)
    if stamps.isna().any():
        raise DataError(f"{path}: unreadable date {text[stamps.isna()].iloc[0]!r}")
    return (stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)


def yelp(files: list[Path], out: Path) -> dict[str, int]:
    """The Yelp Open Dataset (its tar/zip, or the review file itself): every review of
    ``yelp_academic_dataset_review.json`` is a click; with ``..._business.json`` in the archive,
    a business's first listed category is its category."""
    reviews = _records(files[0], "review.json", ("user_id", "business_id", "date"))
    df = pd.DataFrame(
        {
            "user": reviews["user_id"],
            "item": reviews["business_id"],
            "timestamp": _unix_seconds(reviews["date"], files[0]),
        }
    )
    if any(name.endswith("business.json") for name in member_names(files[0]) or []):
        business = _records(files[0], "business.json", ("business_id", "categories"))
        first = business["categories"].fillna("").str.split(",").str[0].str.strip()
        df["category"] = df["item"].map(first.where(first != "").set_axis(business["business_id"]))
    return write_clicks(df, out)


def steam(files: list[Path], out: Path) -> dict[str, int]:
    """Kang & McAuley's Steam reviews (Python dict literals per line: ``username``,
    ``product_id``, ``date`` as ``YYYY-MM-DD``)."""
    df = _records(files[0], "", ("username", "product_id", "date"), literal=True)
    return write_clicks(
        pd.DataFrame(
            {"user": df["username"], "item": df["product_id"], "timestamp": _unix_seconds(df["date"], files[0])}
        ),
        out,
    )


def gowalla(files: list[Path], out: Path) -> dict[str, int]:
    """SNAP's Gowalla check-ins (``user \\t time \\t latitude \\t longitude \\t location``): a
    check-in is a click on its location."""
    df = _csv(files[0], sep="\t", header=None, names=["user", "time", "lat", "lon", "item"])
    return write_clicks(df.assign(timestamp=_unix_seconds(df["time"], files[0])), out)


def retailrocket(files: list[Path], out: Path) -> dict[str, int]:
    """RetailRocket's ``events.csv`` (``timestamp`` in ms, ``visitorid``, ``event``, ``itemid``):
    the ``view`` events are the clicks (add-to-cart and transaction rows are left out)."""
    df = _csv(files[0], "events.csv")
    views = df[df["event"] == "view"]
    return write_clicks(
        pd.DataFrame({"user": views["visitorid"], "item": views["itemid"], "timestamp": views["timestamp"] // 1000}),
        out,
    )


_META_ASIN = re.compile(r"""['"]asin['"]\s*:\s*['"]([^'"]+)['"]""")


def _book_categories(path: Path, item_raw: np.ndarray) -> tuple[list[str], list[str]]:
    """``(asin, category)`` of the kept items' records in ``meta_Books.json``: the last level
    of the first category path (``categories[0][-1]``). Records of other items are skipped
    before parsing (ComiRec parses every line)."""
    wanted = set(item_raw)
    asins, categories = [], []
    for lineno, line in _text_lines(path):
        match = _META_ASIN.search(line)
        if match is None or match.group(1) not in wanted:
            continue
        try:
            paths = ast.literal_eval(line).get("categories") or [[]]
        except (ValueError, SyntaxError) as err:
            raise DataError(f"{path}:{lineno}: not a Python record ({err})") from None
        if paths[0]:
            asins.append(match.group(1))
            categories.append(str(paths[0][-1]))
    return asins, categories


def comirec_book(files: list[Path], out: Path) -> dict[str, int]:
    """ComiRec's Amazon Books: ``reviews_Books_5.json.gz`` and ``meta_Books.json.gz`` through
    ComiRec's preprocessing, written as ``comirec/book_*.txt`` and ``maps/book_*_map.txt``."""
    reviews = _records(files[0], "", ("reviewerID", "asin", "unixReviewTime"))
    data = comirec_filter(
        reviews["reviewerID"].to_numpy(), reviews["asin"].to_numpy(), reviews["unixReviewTime"].to_numpy(np.float64)
    )
    del reviews
    asins, categories = _book_categories(files[1], data.item_raw)
    category_raw, item_cate = comirec_categories(
        np.array(asins, dtype=object), np.array(categories, dtype=object), data.item_raw
    )
    return write_comirec(data, category_raw, item_cate, out / "comirec", out / "maps", "book")


def comirec_taobao(files: list[Path], out: Path) -> dict[str, int]:
    """ComiRec's Taobao: the ``pv`` rows of ``UserBehavior.csv`` (``user,item,category,behavior,
    timestamp``; the zip from Tianchi or the csv) through ComiRec's preprocessing, written as
    ``comirec/taobao_*.txt`` and ``maps/taobao_*_map.txt``."""
    names = ["user", "item", "category", "behavior", "timestamp"]
    with open_member(files[0], ".csv") as stream:
        try:
            chunks = pd.read_csv(stream, header=None, names=names, dtype={"behavior": str}, chunksize=5_000_000)
            pv = pd.concat(
                [c.loc[c["behavior"] == "pv", ["user", "item", "category", "timestamp"]] for c in chunks],
                ignore_index=True,
            )
        except (ValueError, pd.errors.ParserError) as err:
            raise DataError(f"{files[0]}: {err}") from None
    data = comirec_filter(pv["user"].to_numpy(), pv["item"].to_numpy(), pv["timestamp"].to_numpy(np.float64))
    category_raw, item_cate = comirec_categories(pv["item"].to_numpy(), pv["category"].to_numpy(), data.item_raw)
    return write_comirec(data, category_raw, item_cate, out / "comirec", out / "maps", "taobao")


CONVERTERS: dict[str, Converter] = {
    "movielens-100k": movielens_100k,
    "movielens-dat": movielens_dat,
    "movielens-csv": movielens_csv,
    "amazon-reviews": amazon_reviews,
    "yelp": yelp,
    "steam": steam,
    "gowalla": gowalla,
    "retailrocket": retailrocket,
    "comirec-book": comirec_book,
    "comirec-taobao": comirec_taobao,
}


def convert(kind: str, files: list[Path], out: Path) -> dict[str, int]:
    """Run converter ``kind`` (a registry entry's ``convert``) on ``files``; returns the counts."""
    if kind not in CONVERTERS:
        raise DataError(f"unknown converter {kind!r}; known: {', '.join(CONVERTERS)}")
    return CONVERTERS[kind](files, out)
