"""Tiny files in each registered source's real format, and a local HTTP server to serve them.

Every builder returns ``(files, counts)``: the raw files (bytes, in the registry entry's file
order) and the counts the conversion must report.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# 5 users x 6 clicks over 4 items: (user, item, unix time); the same clicks for every format
CLICKS = [(u, (u + k) % 4 + 1, 1_000_000_000 + 86_400 * (10 * u + k)) for u in range(1, 6) for k in range(6)]
BASE = {"users": 5, "items": 4, "clicks": 30}


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def _tar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _date(t: int, fmt: str) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(fmt)


def ml_100k():
    data = "".join(f"{u}\t{i}\t{3}\t{t}\n" for u, i, t in CLICKS)
    genres = "unknown|0\nAction|1\nComedy|2\n"
    items = "".join(
        f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|0|{int(i % 2 == 1)}|{int(i % 2 == 0)}\n" for i in range(1, 5)
    )
    files = [
        _zip(
            {
                "ml-100k/u.data": data.encode(),
                "ml-100k/u.item": items.encode("latin-1"),
                "ml-100k/u.genre": genres.encode(),
            }
        )
    ]
    return files, {**BASE, "categories": 2}


def ml_1m():
    ratings = "".join(f"{u}::{i}::4::{t}\n" for u, i, t in CLICKS)
    movies = "".join(f"{i}::Caf\xe9 {i} (1995)::{'Comedy|Drama' if i < 3 else 'Horror'}\n" for i in range(1, 5))
    files = [_zip({"ml-1m/ratings.dat": ratings.encode("latin-1"), "ml-1m/movies.dat": movies.encode("latin-1")})]
    return files, {**BASE, "categories": 2}


def ml_20m():
    ratings = "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},3.5,{t}\n" for u, i, t in CLICKS)
    movies = "movieId,title,genres\n" + "".join(
        f'{i},"Title, The ({i})",{"(no genres listed)" if i == 4 else "Action|Drama"}\n' for i in range(1, 5)
    )
    files = [_zip({"ml-20m/ratings.csv": ratings.encode(), "ml-20m/movies.csv": movies.encode()})]
    return files, {**BASE, "categories": 1}


def _amazon_lines() -> bytes:
    return "".join(
        json.dumps(
            {
                "reviewerID": f"A{u}X",
                "asin": f"B00{i}",
                "reviewerName": "N, Jr.",
                "helpful": [0, 0],
                "reviewText": "ok",
                "overall": 5.0,
                "summary": "s",
                "unixReviewTime": t,
                "reviewTime": "01 1, 2001",
            }
        )
        + "\n"
        for u, i, t in CLICKS
    ).encode()


def amazon_reviews():
    return [gzip.compress(_amazon_lines())], dict(BASE)


def yelp():
    reviews = "".join(
        json.dumps(
            {
                "review_id": f"r{n}",
                "user_id": f"u{u}",
                "business_id": f"b{i}",
                "stars": 4,
                "date": _date(t, "%Y-%m-%d %H:%M:%S"),
                "text": "x",
            }
        )
        + "\n"
        for n, (u, i, t) in enumerate(CLICKS)
    )
    business = "".join(
        json.dumps({"business_id": f"b{i}", "categories": None if i == 4 else f"Food{i % 2}, Bars"}) + "\n"
        for i in range(1, 5)
    )
    files = [
        _tar(
            {
                "yelp_academic_dataset_business.json": business.encode(),
                "yelp_academic_dataset_review.json": reviews.encode(),
            }
        )
    ]
    return files, {**BASE, "categories": 2}


def steam():
    lines = "".join(
        repr(
            {
                "username": f"Player {u}",
                "hours": 1.5,
                "products": 3,
                "product_id": str(100 + i),
                "page_order": 0,
                "date": _date(t, "%Y-%m-%d"),
                "text": "it's fine",
                "early_access": False,
                "page": 1,
            }
        )
        + "\n"
        for u, i, t in CLICKS
    )
    return [gzip.compress(lines.encode())], dict(BASE)


def gowalla():
    lines = "".join(f"{u}\t{_date(t, '%Y-%m-%dT%H:%M:%SZ')}\t30.2\t-97.7\t{4200 + i}\n" for u, i, t in CLICKS)
    return [gzip.compress(lines.encode())], dict(BASE)


def retailrocket():
    rows = [f"{t * 1000},{u},view,{i}," for u, i, t in CLICKS]
    rows += ["1000000000000,9,addtocart,7,", "1000000000000,9,transaction,7,3"]  # not views: left out
    events = "timestamp,visitorid,event,itemid,transactionid\n" + "\n".join(rows) + "\n"
    return [_zip({"events.csv": events.encode()})], dict(BASE)


# ComiRec fixtures: 10 users x 6 clicks over items 1-4, and two users dropped by ComiRec's
# filters: item 9 has 3 clicks (< 5, dropped), then user 11 has 4 clicks on kept items and user 12 none
COMIREC_CLICKS = [(u, (u + k) % 4 + 1, 1_000_000_000 + 86_400 * (10 * u + k)) for u in range(1, 11) for k in range(6)]
COMIREC_CLICKS += [
    (11, 9, 1_000_000_000),
    (11, 9, 1_000_000_001),
    (12, 9, 1_000_000_002),
    (11, 1, 1_000_000_003),
    (11, 2, 1_000_000_004),
    (11, 3, 1_000_000_005),
    (11, 4, 1_000_000_006),
]
COMIREC_COUNTS = {
    "users": 10,
    "items": 4,
    "clicks": 60,
    "categories": 2,
    "train_users": 8,
    "valid_users": 1,
    "test_users": 1,
}


def comirec_book():
    reviews = "".join(
        json.dumps({"reviewerID": f"A{u}", "asin": f"B{i}", "overall": 4.0, "unixReviewTime": t}) + "\n"
        for u, i, t in COMIREC_CLICKS
    )
    meta = "".join(
        repr({"asin": f"B{i}", "title": "t", "categories": [["Books", f"Genre{i % 2}"], ["Other"]]}) + "\n"
        for i in (1, 2, 3, 4, 9)
    )
    return [gzip.compress(reviews.encode()), gzip.compress(meta.encode())], dict(COMIREC_COUNTS)


def comirec_taobao():
    rows = [f"{u},{i},{700 + i % 2},pv,{t}" for u, i, t in COMIREC_CLICKS] + ["1,1,700,buy,1000000100", "2,5,701,fav,1"]
    return [_zip({"UserBehavior.csv": ("\n".join(rows) + "\n").encode()})], dict(COMIREC_COUNTS)


BUILDERS = {
    "ml-100k": ml_100k,
    "ml-1m": ml_1m,
    "ml-20m": ml_20m,
    "amazon-beauty": amazon_reviews,
    "amazon-sports": amazon_reviews,
    "yelp": yelp,
    "steam": steam,
    "gowalla": gowalla,
    "retailrocket": retailrocket,
    "amazon-books-comirec": comirec_book,
    "taobao-comirec": comirec_taobao,
}


class FileServer:
    """An in-process HTTP server for ``files`` (path -> bytes) that honours ``Range: bytes=N-``.
    A path in ``cut`` is served once with its full ``Content-Length`` but only half its bytes,
    then the connection is closed (a cut connection). ``requests`` logs ``(path, Range header)``."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
                server.requests.append((self.path, self.headers.get("Range")))
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
                if start >= len(data) > 0:
                    self.send_error(416)
                    return
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if self.path in server.cut:
                    server.cut.discard(self.path)
                    self.wfile.write(data[start : start + (len(data) - start) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
