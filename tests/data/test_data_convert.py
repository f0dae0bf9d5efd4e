"""Converters of public datasets: text decoding and the errors that name a file and line."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from recsys.data.convert import CLICKS, amazon_reviews
from recsys.data.readers import DataError


def reviews(rows: list[tuple[str, str, int]]) -> bytes:
    return b"".join(json.dumps({"reviewerID": u, "asin": i, "unixReviewTime": t}).encode() + b"\n" for u, i, t in rows)


def test_json_lines_with_a_byte_order_mark_convert(tmp_path):
    source = tmp_path / "reviews.json.gz"
    source.write_bytes(gzip.compress(b"\xef\xbb\xbf" + reviews([("u1", "a", 5), ("u1", "b", 7)])))
    assert amazon_reviews([source], tmp_path / "out") == {"users": 1, "items": 2, "clicks": 2}
    clicks = pd.read_csv(tmp_path / "out" / CLICKS, dtype=str)
    assert clicks["user"].tolist() == ["u1", "u1"] and clicks["item"].tolist() == ["a", "b"]


def test_json_line_that_is_not_utf8_names_file_and_line(tmp_path):
    source = tmp_path / "reviews.json"
    source.write_bytes(reviews([("u1", "a", 5)]) + b'{"reviewerID": "\xff", "asin": "b", "unixReviewTime": 6}\n')
    with pytest.raises(DataError, match=r"reviews\.json:2: not valid utf-8 text$"):
        amazon_reviews([source], tmp_path / "out")
