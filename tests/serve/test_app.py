"""The real HTTP service (`recsys serve` in a subprocess on a free port) against a tiny run."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("fastapi", reason="recsys serve needs the serve extra: pip install 'multi-interest-recsys[serve]'")
pytest.importorskip("uvicorn", reason="recsys serve needs the serve extra: pip install 'multi-interest-recsys[serve]'")

from recsys.cli import main
from recsys.data.prepare import Dataset

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """A tiny JSON client on one keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def request(self, method: str, path: str, body=None, raw: bytes | None = None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        self.conn.request(method, path, data, {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())


@pytest.fixture(scope="module")
def server(tiny_run):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recsys",
            "serve",
            tiny_run,
            "--port",
            str(port),
            "--factory",
            "Flat",
            "--set",
            "serve.n=10",
            "--set",
            "serve.max_n=100",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"recsys serve exited early:\n{proc.stdout.read()}")
        try:
            if Client(port).request("GET", "/health")[0] == 200:
                break
        except OSError:
            if time.time() > deadline:
                proc.kill()
                pytest.fail("recsys serve did not become healthy within 60 s")
            time.sleep(0.2)
    yield port
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def dataset(tiny_run):
    return Dataset.load(f"{tiny_run}/dataset")


@pytest.fixture(scope="module")
def batch_answers(tiny_run, tmp_path_factory):
    """`recsys recommend` for every user, n = 10, with and without --exclude-seen."""
    out = tmp_path_factory.mktemp("recs")
    tables = {}
    for exclude in (False, True):
        path = out / f"recs-{exclude}.csv"
        args = ["recommend", tiny_run, "--all", "--n", "10", "--out", str(path), "--factory", "Flat"]
        assert main(args + (["--exclude-seen"] if exclude else ["--no-exclude-seen"])) == 0
        table = pd.read_csv(path, dtype={"user": str, "item": str})
        tables[exclude] = dict(list(table.groupby("user")))
    return tables


def _assert_same(response: dict, rows: pd.DataFrame) -> None:
    assert [r["item"] for r in response["items"]] == list(rows["item"])
    np.testing.assert_allclose([r["score"] for r in response["items"]], rows["score"], rtol=1e-5)
    assert [r["interest"] for r in response["items"]] == list(rows["interest"])


def test_health_and_info(server, dataset):
    client = Client(server)
    assert client.request("GET", "/health") == (200, {"status": "ok"})
    status, info = client.request("GET", "/info")
    assert status == 200
    assert info["model"] == "comirec_sa" and info["index"] == "Flat"
    assert info["items"] == dataset.num_items - 1 and info["users"] == dataset.num_users
    assert info["num_interests"] == 4 and info["dim"] == 16 and info["max_len"] == 10
    assert info["default_n"] == 10 and info["max_n"] == 100


def test_concurrent_requests_equal_batch_command(server, dataset, batch_answers):
    """40 concurrent requests (users and click sequences, some excluding history) on 8
    connections answer exactly what `recsys recommend` wrote for the same users."""
    users = list(dataset.user_raw[:20])
    jobs = []
    for i, user in enumerate(users):
        u = i
        clicks = dataset.item_raw[dataset.items[dataset.indptr[u] : dataset.indptr[u + 1]]].tolist()
        exclude = i % 3 == 0
        jobs.append(({"user": user, "exclude_seen": exclude}, user, exclude))
        if not exclude:  # the same user's clicks as an items request: the same answer, and by
            # default the given items are excluded, as the user's clicks are with exclude_seen
            jobs.append(({"items": clicks, "n": 10}, user, True))
            jobs.append(({"items": clicks, "n": 10, "exclude_seen": False}, user, False))

    def send(chunk):
        client = Client(server)
        return [client.request("POST", "/recommend", body) for body, _, _ in chunk]

    chunks = [jobs[i::8] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, chunks))
    checked = 0
    for chunk, answers in zip(chunks, results):
        for (_, user, exclude), (status, response) in zip(chunk, answers):
            assert status == 200, response
            assert response["source"] == "model" and response["n"] == 10 and response["unknown_items"] == []
            _assert_same(response, batch_answers[exclude][user])
            checked += 1
    assert checked == len(jobs) >= 30
    status, info = Client(server).request("GET", "/info")
    assert info["requests"] >= checked and info["batches"] <= info["requests"]


def test_unknown_items_are_skipped_and_reported(server, dataset, batch_answers):
    user = dataset.user_raw[3]
    clicks = dataset.item_raw[dataset.items[dataset.indptr[3] : dataset.indptr[4]]].tolist()
    mixed = ["no-such-item"] + clicks[:1] + [12345678] + clicks[1:]
    status, response = Client(server).request("POST", "/recommend", {"items": mixed})
    assert status == 200
    assert response["unknown_items"] == ["no-such-item", "12345678"]
    assert response["input_length"] == min(len(clicks), 10)
    _assert_same(response, batch_answers[True][user])  # input clicks excluded by default


def test_empty_or_unknown_sequences_and_users(server, dataset):
    client = Client(server)
    status, response = client.request("POST", "/recommend", {"items": []})
    assert status == 404 and "empty" in response["detail"]
    status, response = client.request("POST", "/recommend", {"items": ["nope", "nada"]})
    assert status == 404 and "no known item" in response["detail"] and response["unknown_items"] == ["nope", "nada"]
    status, response = client.request("POST", "/recommend", {"user": "ghost"})
    assert status == 404 and "ghost" in response["detail"] and response["unknown_items"] == []

    popular = [str(r) for r in dataset.item_raw[1 + np.argsort(-dataset.item_counts[1:], kind="stable")[:5]]]
    for body in (
        {"user": "ghost", "n": 5, "fallback_popular": True},
        {"items": ["nope"], "n": 5, "fallback_popular": True},
    ):
        status, response = client.request("POST", "/recommend", body)
        assert status == 200 and response["source"] == "popular"
        assert [r["item"] for r in response["items"]] == popular
        assert all(r["interest"] == -1 for r in response["items"])


@pytest.mark.parametrize(
    "raw, field",
    [
        (b"[1, 2]", None),  # not an object
        (b'{"items": ["1"], "user": "0"}', None),  # both inputs
        (b'{"n": 5}', None),  # neither
        (b'{"items": ["1"], "colour": "red"}', "colour"),  # unknown field
        (b'{"items": ["1"], "n": 0}', "n"),
        (b'{"items": ["1"], "n": 101}', "n"),  # above serve.max_n
        (b'{"items": ["1"], "n": "many"}', "n"),
        (b'{"items": ["1"], "n": "10"}', "n"),  # strict types: a string is not a number
        (b'{"items": ["1"], "n": true}', "n"),
        (b'{"items": ["1"], "exclude_seen": "yes"}', "exclude_seen"),
        (b'{"items": ["1"], "diversity_lambda": -0.1}', "diversity_lambda"),
        (b'{"items": ["1"], "diversity_lambda": NaN}', "diversity_lambda"),
        (b'{"items": [1.5]}', "items"),
        (b'{"items": "1"}', "items"),
    ],
)
def test_malformed_bodies_are_422(server, raw, field):
    status, response = Client(server).request("POST", "/recommend", raw=raw)
    assert status == 422
    assert response["detail"] and all({"loc", "msg", "type"} <= set(e) for e in response["detail"])
    if field is not None:
        assert any(field in e["loc"] for e in response["detail"])


def test_a_body_that_is_not_json_is_a_400(server):
    status, response = Client(server).request("POST", "/recommend", raw=b'{"items": ["1"')
    assert status == 400 and response["detail"].startswith("the body is not valid JSON: ")


def test_n_and_diversity(server, dataset, tiny_run):
    client = Client(server)
    user = dataset.user_raw[7]
    status, small = client.request("POST", "/recommend", {"user": user, "n": 3})
    status2, large = client.request("POST", "/recommend", {"user": user, "n": 100})
    assert status == status2 == 200
    assert len(small["items"]) == 3 and small["items"] == large["items"][:3]
    assert len(large["items"]) == min(100, dataset.num_items - 1)
    status, diverse = client.request("POST", "/recommend", {"user": user, "n": 10, "diversity_lambda": 5.0})
    assert status == 200
    cat = dict(zip(dataset.item_raw, dataset.item_category))
    assert len({cat[r["item"]] for r in diverse["items"]}) >= len({cat[r["item"]] for r in large["items"][:10]})
