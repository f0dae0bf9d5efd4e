"""The HTTP JSON service (``recsys serve RUN``): FastAPI + uvicorn, the ``serve`` extra.

Endpoints::

    POST /recommend  {"items": [raw ids, oldest first]} or {"user": raw id},
                     optional "n", "exclude_seen", "diversity_lambda", "fallback_popular"
                     -> {"items": [{"item": raw id, "score": float, "interest": int}, ...],
                         "unknown_items": [...], "n": int, "source": "model" | "popular",
                         "user": raw id | null, "input_length": int}
    GET  /health     -> {"status": "ok"}
    GET  /info       -> model, dataset, catalogue size, index, K, d, max_len, limits

A ``user`` request uses that user's last ``max_len`` clicks in the run's dataset; an ``items``
request uses the last ``max_len`` known items given. Unknown item ids are skipped and listed
in ``unknown_items``. ``exclude_seen`` (default true) drops the user's clicked items (every
click in the dataset) or the given items. An unknown user is a 404 and a sequence with no
known item a 422, unless ``fallback_popular`` (default ``serve.fallback_popular``) asks for the
most clicked items instead (``"source": "popular"``, interests ``-1``). Malformed bodies,
unknown fields, ``n`` outside ``1..serve.max_n`` and a ``diversity_lambda`` outside
``[0, MAX_DIVERSITY_LAMBDA]`` are 422s. Every error body is built from text made safe for any
input: ids are shown truncated (:data:`SHOWN_CHARS`) and with unpaired surrogates escaped.

The model and index load once at start. Requests in flight are micro-batched
(:class:`~recsys.serve.microbatch.MicroBatcher`): one model call and one index search per
batch, in a worker thread, while the event loop keeps parsing requests; a row's answer does
not depend on what else is in its batch (see :mod:`recsys.serve.recommender`).
"""

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from pydantic import BaseModel, ConfigDict, Field, model_validator
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("FastAPI and uvicorn are not installed: pip install 'recsys[serve]'") from err

from recsys.config import MAX_DIVERSITY_LAMBDA, ServeConfig
from recsys.serve.microbatch import MicroBatcher
from recsys.serve.recommender import Recommender

__all__ = ["bind", "create_app", "run_server", "shown"]

MAX_ITEMS = 10_000  # longest accepted "items" list (only the last max_len known ones are used)
SHOWN_CHARS = 100  # an id or field name quoted in an error message is cut to this many characters
# a raw id is a string or an integer; integers are bounded so str() of them is always cheap
RawId = str | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


def shown(text: object) -> str:
    """``text`` as it may appear inside an error message: at most :data:`SHOWN_CHARS`
    characters (the rest counted), unpaired surrogates and other unencodable characters
    escaped, so the message always encodes as UTF-8."""
    text = str(text)
    cut = text[:SHOWN_CHARS] + (f"... ({len(text):,} characters)" if len(text) > SHOWN_CHARS else "")
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")


def _error(content: dict[str, Any], status: int) -> Response:
    """A JSON error response that cannot fail to encode (``ensure_ascii``)."""
    return Response(json.dumps(content, ensure_ascii=True), status_code=status, media_type="application/json")


@dataclass
class _Job:
    """One validated model request: its padded input and options."""

    inputs: np.ndarray  # [max_len] int64, right-padded
    length: int
    n: int
    diversity_lambda: float
    exclude: np.ndarray | None  # internal ids never to return
    unknown: list[str]
    user: str | None


def _request_model(cfg: ServeConfig) -> type[BaseModel]:
    """The ``POST /recommend`` body schema, with ``n`` bounded by ``cfg.max_n``."""

    class RecommendRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        items: list[RawId] | None = Field(None, max_length=MAX_ITEMS)
        user: RawId | None = None
        n: int = Field(cfg.n, ge=1, le=cfg.max_n)
        exclude_seen: bool = True
        diversity_lambda: float = Field(0.0, ge=0.0, le=MAX_DIVERSITY_LAMBDA, allow_inf_nan=False)
        fallback_popular: bool | None = None

        @model_validator(mode="after")
        def _one_input(self) -> "RecommendRequest":
            if (self.items is None) == (self.user is None):
                raise ValueError("give exactly one of 'items' (raw item ids) or 'user' (a raw user id)")
            return self

    return RecommendRequest


class _Service:
    """Request handling around a :class:`Recommender` (everything but the HTTP plumbing)."""

    def __init__(self, rec: Recommender, cfg: ServeConfig) -> None:
        self.rec, self.cfg = rec, cfg

    def prepare(self, req: Any) -> _Job | Response | bytes:
        """A model job, a finished popular answer (bytes), or an error response."""
        fallback = self.cfg.fallback_popular if req.fallback_popular is None else req.fallback_popular
        if req.user is not None:
            user = str(req.user)
            index, _ = self.rec.dataset.user_map.encode([user])
            if len(index) == 0:
                if fallback:
                    return self.render_popular(req.n, [], user)
                return _error({"detail": f"unknown user '{shown(user)}'"}, 404)
            inputs, lengths = self.rec.user_inputs(index)
            exclude = self.rec.user_histories(index)[1] if req.exclude_seen else None
            return _Job(inputs[0], int(lengths[0]), req.n, req.diversity_lambda, exclude, [], user)
        raw = [str(r) for r in req.items]
        ids, unknown = self.rec.dataset.item_map.encode(raw)
        if len(ids) == 0:
            if fallback:
                return self.render_popular(req.n, unknown, None)
            what = "is empty" if not raw else "has no known item"
            return _error(
                {"detail": f"the items sequence {what}; send at least one known item id "
                           "(or set fallback_popular)", "unknown_items": [shown(u) for u in unknown]},
                422,
            )
        inputs, lengths = self.rec.sequence_inputs([ids])
        exclude = ids if req.exclude_seen else None
        return _Job(inputs[0], int(lengths[0]), req.n, req.diversity_lambda, exclude, unknown, None)

    def run(self, jobs: list[_Job]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Answer ``jobs`` with one model call (runs in the micro-batch worker thread)."""
        inputs = np.stack([job.inputs for job in jobs])
        lengths = np.array([job.length for job in jobs], dtype=np.int64)
        exclude = None
        if any(job.exclude is not None for job in jobs):
            empty = np.empty(0, dtype=np.int64)
            exclude = Recommender.sequences_csr([empty if job.exclude is None else job.exclude for job in jobs])
        recs = self.rec.recommend(
            inputs, lengths, np.array([job.n for job in jobs]), exclude=exclude,
            diversity_lambda=np.array([job.diversity_lambda for job in jobs]),
        )
        return [(recs.ids[b], recs.scores[b], recs.interest_of[b]) for b in range(len(jobs))]

    def render(self, job: _Job, row: tuple[np.ndarray, np.ndarray, np.ndarray]) -> bytes:
        return self._body(*row, n=job.n, unknown=job.unknown, user=job.user, length=job.length, source="model")

    def render_popular(self, n: int, unknown: list[str], user: str | None) -> bytes:
        recs = self.rec.popular(n)
        return self._body(recs.ids[0], recs.scores[0], recs.interest_of[0], n=n, unknown=unknown, user=user,
                          length=0, source="popular")

    def _body(self, ids: np.ndarray, scores: np.ndarray, interest_of: np.ndarray, *, n: int,
              unknown: list[str], user: str | None, length: int, source: str) -> bytes:
        valid = ids > 0
        items = [
            {"item": item, "score": score, "interest": k}
            for item, score, k in zip(
                self.rec.dataset.item_map.decode(ids[valid]).tolist(), scores[valid].tolist(), interest_of[valid].tolist()
            )
        ]
        return json.dumps({
            "items": items, "unknown_items": unknown, "n": n, "source": source,
            "user": user, "input_length": length,
        }).encode()


def create_app(rec: Recommender, cfg: ServeConfig, *, run: str = "") -> FastAPI:
    """The FastAPI app serving ``rec`` with the limits and defaults of ``cfg``."""
    service = _Service(rec, cfg)
    info = {**rec.info(), "run": run, "default_n": cfg.n, "max_n": cfg.max_n, "max_batch": cfg.max_batch,
            "batch_workers": cfg.batch_workers, "fallback_popular": cfg.fallback_popular}
    RequestBody = _request_model(cfg)

    def new_batcher() -> MicroBatcher[_Job, Any]:
        return MicroBatcher(service.run, max_batch=cfg.max_batch, workers=cfg.batch_workers)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # a fresh batcher for every start: the app may be started again after a shutdown
        # (test clients do), and a closed batcher cannot take work
        app.state.batcher.close()
        app.state.batcher = new_batcher()
        try:
            yield
        finally:
            app.state.batcher.close()

    app = FastAPI(title="recsys", description="Multi-interest candidate retrieval", version="1", lifespan=lifespan)
    app.state.batcher = new_batcher()  # also serves an app used without its lifespan

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        # The default handler echoes the input back, which fails on NaN / Infinity and on
        # unpaired surrogates; field names in "loc" come from the client too.
        errors = [{"loc": [p if isinstance(p, int) else shown(p) for p in e["loc"]], "msg": shown(e["msg"]),
                   "type": e["type"]} for e in exc.errors()]
        return _error({"detail": errors}, 422)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    async def get_info() -> dict[str, Any]:
        return {**info, "batches": app.state.batcher.batches, "requests": app.state.batcher.items}

    @app.post("/recommend")
    async def recommend(req: RequestBody) -> Response:  # type: ignore[valid-type]
        job = service.prepare(req)
        if isinstance(job, Response):
            return job
        if isinstance(job, bytes):
            return Response(job, media_type="application/json")
        row = await app.state.batcher.submit(job)
        return Response(service.render(job, row), media_type="application/json")

    return app


def run_server(
    run: str | Path,
    cfg: ServeConfig,
    *,
    factory: str | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    device: str = "cpu",
    threads: int = 1,
    access_log: bool = False,
) -> None:
    """Load ``run`` once, then serve it on ``cfg.host:cfg.port`` until interrupted.

    ``threads`` caps torch's and FAISS's CPU threads (1 suits a single-worker server:
    concurrency comes from micro-batching, not from intra-op threads).
    """
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    rec = Recommender.from_run(run, factory=factory, nprobe=nprobe, ef_search=ef_search, device=device)
    app = create_app(rec, cfg, run=str(run))
    sock = bind(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    print(f"serving {run} ({rec.name}, {rec.dataset.num_items - 1:,} items, index {rec.index_name}) "
          f"on http://{cfg.host}:{port}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=access_log))
    server.run(sockets=[sock])


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one). A port in use or a bad
    address is an ``OSError`` naming both, raised before the service says it is serving."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise OSError(f"serve.host: cannot use {host!r}: {err.strerror or err}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise OSError(f"serve.port: cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock
