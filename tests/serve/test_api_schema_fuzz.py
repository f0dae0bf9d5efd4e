"""The service against its own OpenAPI schema, in process (ASGI): schemathesis' default checks on
bodies that follow the schema and bodies that break it (no 5xx, every status and body as declared,
schema-valid bodies accepted, schema-invalid ones rejected), and hand-written bodies for which
schema and behaviour once disagreed.

(schemathesis' pytest plugin cannot yet take the app from a fixture under pytest 9, so the
tests draw cases from each operation's strategy themselves.)"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi", reason="the service needs the serve extra: pip install 'multi-interest-recsys[serve]'")

from schemathesis import GenerationMode  # noqa: E402

from recsys.data.prepare import Dataset  # noqa: E402

OPERATIONS = [("POST", "/recommend"), ("GET", "/health"), ("GET", "/info")]


@pytest.fixture(scope="module")
def api_schema(service_app):
    return schemathesis.openapi.from_asgi("/openapi.json", service_app)


@pytest.fixture(scope="module")
def known_user(tiny_run) -> str:
    return str(Dataset.load(f"{tiny_run}/dataset").user_raw[0])


def test_schema_lists_every_operation(api_schema):
    listed = {(op.method.upper(), op.path) for op in (r.ok() for r in api_schema.get_all_operations())}
    assert listed == set(OPERATIONS)


# GET endpoints take no input, so there is nothing to break: only POST gets negative cases
@pytest.mark.parametrize(
    "method, path, mode",
    [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + [("POST", "/recommend", GenerationMode.NEGATIVE)],
    ids=str,
)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_default_checks_pass(api_schema, method, path, mode, data):
    case = data.draw(api_schema[path][method].as_strategy(generation_mode=mode))
    response = case.call()
    case.validate_response(response)  # every default check
    if response.status_code == 422:  # schema violations: each names its field
        assert all(error["loc"] and error["msg"] for error in response.json()["detail"])


# (body, status): `known` stands for a user of the run's dataset
AGREEMENT = [
    ({"user": "known"}, 200),
    ({"user": "known", "n": 3.0}, 200),  # JSON Schema counts 3.0 as an integer
    ({"items": []}, 404),  # was: a 422 whose string detail broke the declared 422 schema
    ({"items": ["nope", "nada"]}, 404),  # likewise
    ({"user": "ghost"}, 404),
    ({}, 422),  # was: valid by the schema (both fields optional) yet rejected
    ({"items": ["1"], "user": "known"}, 422),
    ({"user": "known", "n": True}, 422),  # was: taken as n = 1
    ({"user": "known", "n": "10"}, 422),  # was: taken as n = 10
    ({"user": "known", "exclude_seen": "yes"}, 422),  # was: taken as true
    ({"items": [True]}, 422),
    ({"user": 2**53}, 422),  # beyond JSON's exact integers: send it as a string
]


@pytest.mark.parametrize("body, status", AGREEMENT, ids=[str(body) for body, _ in AGREEMENT])
def test_schema_and_behaviour_agree(api_schema, client, known_user, body, status):
    """The request schema accepts exactly the bodies the service accepts (a 404 is an accepted
    body naming nothing the run knows), and every answer is the declared body of its status."""
    body = {key: known_user if value == "known" else value for key, value in body.items()}
    operation = api_schema["/recommend"]["POST"]
    response = client.post("/recommend", json=body)
    assert response.status_code == status, response.text
    assert next(iter(operation.body)).is_valid(body) == (status != 422)
    operation.validate_response(response)


@pytest.mark.parametrize(
    "raw, content_type, status",
    [
        (b'{"items": ["1"', "application/json", 400),  # was: 422, where the docs promised 400
        (b"\xff\xfe", "application/json", 400),
        (b'{"user": "17"}', "application/x-www-form-urlencoded", 415),  # curl -d without -H
        (b'{"user": "17"}', None, 415),
    ],
)
def test_unreadable_bodies_are_declared_errors(api_schema, client, raw, content_type, status):
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/recommend", content=raw, headers=headers)
    assert response.status_code == status
    assert isinstance(response.json()["detail"], str) and "JSON" in response.json()["detail"]
    api_schema["/recommend"]["POST"].validate_response(response)
