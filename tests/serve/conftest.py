"""An in-process service over the tiny run, shared by the API tests (no port, no subprocess)."""

import pytest


@pytest.fixture(scope="session")
def service_app(tiny_run):
    """The FastAPI app serving the tiny run (Flat index, serve.n = 10, serve.max_n = 100)."""
    pytest.importorskip("fastapi", reason="the service needs the serve extra: pip install 'recsys[serve]'")
    from recsys.config import ServeConfig
    from recsys.serve.app import create_app
    from recsys.serve.recommender import Recommender

    rec = Recommender.from_run(tiny_run, factory="Flat", log=lambda line: None)
    return create_app(rec, ServeConfig(n=10, max_n=100), run=tiny_run)


@pytest.fixture(scope="session")
def client(service_app):
    """A starlette TestClient on :func:`service_app` (requests run through the real ASGI stack)."""
    from fastapi.testclient import TestClient

    with TestClient(service_app, raise_server_exceptions=False) as test_client:
        yield test_client
