"""Hostile inputs against the service, in process: every answer is a 2xx or a 4xx built safely,
never a 500 (issue 16's failures, then Hypothesis over random JSON bodies)."""

import json
import socket

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the service needs the serve extra: pip install 'multi-interest-recsys[serve]'")

from recsys.cli import main
from recsys.config import MAX_DIVERSITY_LAMBDA
from recsys.data.prepare import Dataset
from recsys.serve.app import SHOWN_CHARS


@pytest.fixture(scope="module")
def dataset(tiny_run):
    return Dataset.load(f"{tiny_run}/dataset")


def post(client, raw: bytes):
    return client.post("/recommend", content=raw, headers={"content-type": "application/json"})


def test_lone_surrogate_item_is_a_404_not_a_500(client):
    """Was: HTTP 500, UnicodeEncodeError while building the error answer."""
    resp = post(client, b'{"items": ["\\ud800"]}')
    assert resp.status_code == 404
    body = resp.json()
    assert "no known item" in body["detail"] and body["unknown_items"] == ["\\ud800"]
    resp = post(client, b'{"items": ["1"], "\\udfff": 1}')  # an unknown field with a surrogate name
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][0] == "body"


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ('{"items": ["café"]}'.encode("latin-1"), "invalid continuation byte at byte 15 (0xe9)"),
        (b'{"user": "\xff"}', "invalid start byte at byte 10 (0xff)"),
        (b'{"user": "\xe2\x82"}', "at byte 10 (0xe2)"),
    ],
)
def test_a_body_that_is_not_utf8_is_a_400_saying_so(client, raw, where):
    """Was: 400 "There was an error parsing the body" (FastAPI's), which says nothing of the encoding."""
    resp = post(client, raw)
    assert resp.status_code == 400
    detail = resp.json()["detail"]
    assert detail.startswith("the body is not UTF-8 text: ") and where in detail, detail


def test_huge_unknown_user_id_is_truncated_in_the_404(client):
    """Was: a 5 MB unknown user id echoed back whole."""
    user = "u" * 5_000_000
    resp = client.post("/recommend", json={"user": user})
    assert resp.status_code == 404
    detail = resp.json()["detail"]
    assert len(detail) < 3 * SHOWN_CHARS and "5,000,000 characters" in detail


@pytest.mark.parametrize("lam", [1e308, 1e306, MAX_DIVERSITY_LAMBDA * 1.01, -1e-9])
def test_diversity_lambda_out_of_range_is_a_422(client, dataset, lam):
    """Was: 1e308 answered 200 with 2 items for n = 10 (1e306, n = 1000: 180 items)."""
    resp = client.post("/recommend", json={"user": str(dataset.user_raw[0]), "n": 10, "diversity_lambda": lam})
    assert resp.status_code == 422
    assert any("diversity_lambda" in e["loc"] for e in resp.json()["detail"])


@pytest.mark.parametrize("lam", [MAX_DIVERSITY_LAMBDA, 1e3, 1e-12])
def test_largest_allowed_lambda_returns_n_items(client, dataset, lam):
    for user in dataset.user_raw[:5]:
        resp = client.post("/recommend", json={"user": str(user), "n": 100, "diversity_lambda": lam})
        assert resp.status_code == 200
        items = [r["item"] for r in resp.json()["items"]]
        assert len(items) == len(set(items)) == 100  # the catalogue has ~200 items, history excluded


def test_input_clicks_are_excluded_by_default(client, dataset):
    for u in range(10):
        clicks = dataset.item_raw[dataset.items[dataset.indptr[u] : dataset.indptr[u + 1]]].tolist()
        for body in ({"user": str(dataset.user_raw[u])}, {"items": clicks}):
            answer = {r["item"] for r in client.post("/recommend", json={**body, "n": 50}).json()["items"]}
            assert len(answer) == 50 and not answer & set(clicks)
        kept = client.post("/recommend", json={"items": clicks, "n": 50, "exclude_seen": False}).json()["items"]
        assert {r["item"] for r in kept} & set(clicks)  # the model does rank them when asked to keep them


def test_huge_integer_ids_are_4xx(client):
    resp = post(client, b'{"items": [' + b"9" * 5000 + b"]}")  # beyond Python's int-to-str limit
    assert resp.status_code == 400 and resp.json()["detail"]  # FastAPI: cannot parse the body
    resp = post(client, b'{"items": [' + b"9" * 30 + b"]}")
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][:2] == ["body", "items"]


def test_serve_binds_before_announcing(tiny_run, capsys):
    """Was: "serving on :PORT" printed, then the bind failed on a used port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", tiny_run, "--port", str(port), "--factory", "Flat"]) == 2
    out = capsys.readouterr()
    assert "serving" not in out.out
    assert f"cannot listen on 127.0.0.1:{port}" in out.err and "Traceback" not in out.err


# -- property-based: random JSON bodies ------------------------------------------------------

_json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_raw_id = st.text(max_size=30) | st.integers() | st.sampled_from(["1", "2", "17", " 1", "1 "])
_body = (
    st.fixed_dictionaries(
        {},
        optional={
            "items": st.lists(_raw_id, max_size=30) | _json,
            "user": _raw_id | _json,
            "n": st.integers(-5, 200) | _json,
            "exclude_seen": st.booleans() | _json,
            "diversity_lambda": st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0, 1e6, 1e308]),
            "fallback_popular": st.booleans() | st.none(),
        },
    )
    | _json
)


def _names_the_problem(status: int, body: dict) -> bool:
    if status == 422 and isinstance(body["detail"], list):  # schema errors: every one has a location
        return all(e["loc"] and e["msg"] for e in body["detail"])
    return bool(body["detail"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_body)
def test_random_bodies_never_fail_the_server(client, dataset, body):
    raw = json.dumps(body).encode()  # NaN / Infinity included, as JSON clients may send them
    resp = post(client, raw)
    assert resp.status_code in (200, 400, 404, 422), resp.text
    answer = resp.json()
    if resp.status_code == 200:
        n = answer["n"]
        # ~200 items, n <= 100: there are always n to give, and the greedy never runs short
        assert len(answer["items"]) == n and len({r["item"] for r in answer["items"]}) == n
        assert all(np.isfinite(r["score"]) for r in answer["items"])
    else:
        assert _names_the_problem(resp.status_code, answer)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_random_bytes_are_rejected_cleanly(client, raw):
    resp = post(client, raw)
    assert resp.status_code in (200, 400, 404, 422)
    assert resp.json()["detail"] if resp.status_code != 200 else True
