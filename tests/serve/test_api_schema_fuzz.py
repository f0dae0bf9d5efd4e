"""schemathesis against the service's own OpenAPI schema, in process (ASGI): bodies that follow
the schema and bodies that break it; no 5xx, and every error names the field or the problem.

(schemathesis' pytest plugin cannot yet take the app from a fixture under pytest 9, so the
test draws cases from each operation's strategy itself.)"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi", reason="the service needs the serve extra: pip install 'recsys[serve]'")

from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

OPERATIONS = [("POST", "/recommend"), ("GET", "/health"), ("GET", "/info")]


@pytest.fixture(scope="module")
def api_schema(service_app):
    return schemathesis.openapi.from_asgi("/openapi.json", service_app)


def test_schema_lists_every_operation(api_schema):
    listed = {(op.method.upper(), op.path) for op in (r.ok() for r in api_schema.get_all_operations())}
    assert listed == set(OPERATIONS)


# GET endpoints take no input, so there is nothing to break: only POST gets negative cases
@pytest.mark.parametrize("method, path, mode", [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS]
                         + [("POST", "/recommend", GenerationMode.NEGATIVE)], ids=str)
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_server_errors(api_schema, method, path, mode, data):
    case = data.draw(api_schema[path][method].as_strategy(generation_mode=mode))
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error])
    if response.status_code >= 400:
        detail = response.json()["detail"]
        assert detail
        if isinstance(detail, list):  # schema violations: each names its field
            assert all(error["loc"] and error["msg"] for error in detail)
