"""The HTTP JSON service (``recsys serve RUN``): FastAPI + uvicorn, the ``serve`` extra.

Endpoints::

    POST /recommend  {"items": [raw ids, oldest first]} or {"user": raw id},
                     optional "n", "exclude_seen", "diversity_lambda", "fallback_popular"
                     -> {"items": [{"item": raw id, "score": float, "interest": int}, ...],
                         "unknown_items": [...], "n": items held, "requested_n": int,
                         "source": "model" | "popular",
                         "user": raw id | null, "input_length": int}
    GET  /health     -> {"status": "ok"}
    GET  /info       -> model, dataset, catalogue size, index, K, d, max_len, limits

A ``user`` request uses that user's last ``max_len`` clicks in the run's dataset; an ``items``
request uses the last ``max_len`` known items given. Unknown item ids are skipped and listed
in ``unknown_items``. ``exclude_seen`` (default true) drops the user's clicked items (every
click in the dataset) or the given items.

The OpenAPI schema (``/openapi.json``) states all of this and the service keeps to it:

* 404 ``{"detail": str, "unknown_items": [...]}``: an unknown user, or an items sequence that
  is empty or has no known item, unless ``fallback_popular`` (default
  ``serve.fallback_popular``) asks for the most clicked items instead (``"source": "popular"``,
  interests ``-1``).
* 422 ``{"detail": [{"loc", "msg", "type"}, ...]}``: a body that breaks the schema, i.e. not
  exactly one of ``items`` / ``user`` (a ``oneOf``), an unknown field, a wrong type (strict:
  ``true`` is not ``1``, ``"10"`` is not ``10``; ``3.0`` is the integer 3, as in JSON Schema),
  ``n`` outside ``1..serve.max_n``, a ``diversity_lambda`` outside ``[0,
  MAX_DIVERSITY_LAMBDA]``, an integer id beyond :data:`MAX_JSON_INT`.
* 400 ``{"detail": str}``: a body that is not UTF-8 text (saying so, with the first bad byte's
  position) or not JSON at all; 415 likewise: one not sent as JSON.

Every error body is built from text made safe for any input: ids are shown truncated
(:data:`SHOWN_CHARS`) and with unpaired surrogates escaped.

The model and index load once at start. Requests in flight are micro-batched
(:class:`~recsys.serve.microbatch.MicroBatcher`): one model call and one index search per
batch, in a worker thread, while the event loop keeps parsing requests; a row's answer does
not depend on what else is in its batch (see :mod:`recsys.serve.recommender`).
"""

import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np

from recsys.extras import install_hint

try:
    import uvicorn
    from fastapi import Body, FastAPI, Request
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag
    from starlette.exceptions import HTTPException
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"FastAPI and uvicorn are not installed: {install_hint('serve')}") from err

from recsys.config import MAX_DIVERSITY_LAMBDA, ServeConfig
from recsys.serve.microbatch import MicroBatcher
from recsys.serve.recommender import Recommender
from recsys.text import count

__all__ = ["bind", "create_app", "run_server", "shown"]

MAX_ITEMS = 10_000  # longest accepted "items" list (only the last max_len known ones are used)
SHOWN_CHARS = 100  # an id or field name quoted in an error message is cut to this many characters
MAX_JSON_INT = 2**53 - 1  # the largest integer every JSON client holds exactly (a double's mantissa)


def _integral(value: Any) -> Any:
    """``5.0`` -> ``5``: JSON Schema counts a float with no fraction as an integer, so the strict
    models take it as one; everything else (``true``, ``"10"``) is left to strict validation."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _id_kind(value: Any) -> str | None:
    """Which kind of raw id ``value`` is meant to be (``None``: neither, the ``raw_id`` error)."""
    if isinstance(value, str):
        return "string"
    return "integer" if isinstance(value, int | float) and not isinstance(value, bool) else None


JsonInt = Annotated[int, BeforeValidator(_integral)]
# a raw id is a string or an integer (a oneOf, so an error names the kind it was taken for);
# integers are bounded by JSON's exact range (larger ids are sent as strings), which also keeps str() cheap
RawId = Annotated[
    Annotated[str, Tag("string")]
    | Annotated[int, Field(ge=-MAX_JSON_INT, le=MAX_JSON_INT), BeforeValidator(_integral), Tag("integer")],
    Discriminator(_id_kind, custom_error_type="raw_id", custom_error_message="a raw id is a string or an integer"),
]


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


def _sent_as_json(content_type: str | None) -> bool:
    """Whether FastAPI parses a body with this content type as JSON (``application/json`` or
    ``application/*+json``)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _validation_error(errors: Sequence[Any], content_type: str | None) -> Response:
    """The answer to a body FastAPI could not validate: 415 when it was not sent as JSON (e.g.
    ``curl -d`` without ``-H 'content-type: application/json'``), 400 when it is not JSON at
    all (both :class:`BadRequest`), else 422 (:class:`InvalidRequest`) listing each error with
    its field.

    Unlike FastAPI's default handler this does not echo the input back (that fails on NaN,
    Infinity and unpaired surrogates), and field names, which come from the client too, are
    shown safely."""
    if not _sent_as_json(content_type):
        given = f"'{shown(content_type)}'" if content_type else "none"
        return _error({"detail": f"send the body as JSON with content-type: application/json (got {given})"}, 415)
    for error in errors:
        if error["type"] == "json_invalid":
            reason = error.get("ctx", {}).get("error", "not JSON")
            where = error["loc"][-1] if isinstance(error["loc"][-1], int) else "?"
            return _error({"detail": f"the body is not valid JSON: {shown(reason)} (at character {where})"}, 400)
    return _error(
        {"detail": [{"loc": _field_loc(e["loc"]), "msg": shown(e["msg"]), "type": e["type"]} for e in errors]}, 422
    )


def _not_utf8(err: UnicodeDecodeError) -> Response:
    """The answer to a body that is not UTF-8 text (FastAPI's own says only "There was an error
    parsing the body"): 400 naming the first byte that breaks it."""
    byte = f" (0x{err.object[err.start]:02x})" if err.start < len(err.object) else ""
    return _error(
        {"detail": f"the body is not UTF-8 text: {err.reason} at byte {err.start}{byte}; send JSON encoded as UTF-8"},
        400,
    )


def _field_loc(loc: Sequence[str | int]) -> list[str | int]:
    """An error's location as the client wrote it: ``["body", field, ...]``, without the union
    tag (``"items"`` / ``"user"``) pydantic puts after ``"body"`` for a field of either request."""
    parts = list(loc)
    if len(parts) > 2 and parts[0] == "body" and parts[1] in ("items", "user"):
        del parts[1]
    return [p if isinstance(p, int) else shown(p) for p in parts]


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


ONE_INPUT = "send a JSON object with exactly one of 'items' (raw item ids) or 'user' (a raw user id)"


def _input_kind(body: Any) -> str | None:
    """Which request model ``body`` is meant for: ``"items"``, ``"user"``, or ``None`` (not an
    object, or neither or both of the two keys: the :data:`ONE_INPUT` error)."""
    if not isinstance(body, dict) or ("items" in body) == ("user" in body):
        return None
    return "items" if "items" in body else "user"


def _request_model(cfg: ServeConfig) -> Any:
    """The ``POST /recommend`` body: a ``oneOf`` of an items request and a user request (so the
    schema itself says "exactly one of"), options bounded by ``cfg.max_n``. Strict types: JSON
    ``true`` is not ``1`` and ``"10"`` is not ``10`` (an ``int`` is accepted where a float is)."""

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        n: JsonInt = Field(cfg.n, ge=1, le=cfg.max_n, description="how many items to return")
        exclude_seen: bool = Field(True, description="never return the user's clicks or the given items")
        diversity_lambda: float = Field(
            0.0,
            ge=0.0,
            le=MAX_DIVERSITY_LAMBDA,
            allow_inf_nan=False,
            description="ComiRec's diversity λ (0: max-score merge)",
        )
        fallback_popular: bool | None = Field(
            None,
            description="answer the most clicked items for an unknown user or a sequence with no "
            "known item (default: serve.fallback_popular)",
        )

    class ItemsRequest(Options):
        items: list[RawId] = Field(max_length=MAX_ITEMS, description="raw item ids, oldest first")

    class UserRequest(Options):
        user: RawId = Field(description="a raw user id of the run's dataset")

    return Annotated[
        Annotated[ItemsRequest, Tag("items")] | Annotated[UserRequest, Tag("user")],
        Discriminator(_input_kind, custom_error_type="one_input", custom_error_message=ONE_INPUT),
    ]


class RecommendedItem(BaseModel):
    item: str = Field(description="raw item id")
    score: float
    interest: int = Field(description="which of the K interests found it (-1: a popularity fallback)")


class RecommendResponse(BaseModel):
    items: list[RecommendedItem] = Field(description="best first")
    unknown_items: list[str] = Field(description="given item ids the run does not know (skipped)")
    n: int = Field(description="items in the list: requested_n, fewer only when the catalogue has fewer to return")
    requested_n: int = Field(description="the n asked for (or serve.n)")
    source: Literal["model", "popular"]
    user: str | None
    input_length: int = Field(description="clicks fed to the model (0 for a popularity fallback)")


class BadRequest(BaseModel):
    detail: str = Field(description="why the body could not be read")


class NotFound(BaseModel):
    detail: str = Field(description="the unknown user, or why the items sequence has no known item")
    unknown_items: list[str] = Field(description="the given item ids the run does not know ([] for a user)")


class FieldError(BaseModel):
    loc: list[str | int] = Field(description='where: "body", then the field (and list position)')
    msg: str
    type: str


class InvalidRequest(BaseModel):
    detail: list[FieldError]


RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": RecommendResponse, "description": "the recommendations"},
    400: {"model": BadRequest, "description": "the body is not UTF-8 text, or not valid JSON"},
    415: {"model": BadRequest, "description": "the body is not sent as JSON (content-type: application/json)"},
    404: {
        "model": NotFound,
        "description": "unknown user, or an items sequence with no known item (unless fallback_popular)",
    },
    422: {"model": InvalidRequest, "description": "the body breaks the schema; every error names its field"},
}


class _Service:
    """Request handling around a :class:`Recommender` (everything but the HTTP plumbing)."""

    def __init__(self, rec: Recommender, cfg: ServeConfig) -> None:
        self.rec, self.cfg = rec, cfg

    def prepare(self, req: Any) -> _Job | Response | bytes:
        """A model job, a finished popular answer (bytes), or an error response, for an items
        request or a user request (see :func:`_request_model`)."""
        fallback = self.cfg.fallback_popular if req.fallback_popular is None else req.fallback_popular
        if hasattr(req, "user"):
            return self._prepare_user(req, str(req.user), fallback)
        return self._prepare_items(req, [str(r) for r in req.items], fallback)

    def _prepare_user(self, req: Any, user: str, fallback: bool) -> _Job | Response | bytes:
        index, _ = self.rec.dataset.user_map.encode([user])
        if len(index) == 0:
            if fallback:
                return self.render_popular(req.n, [], user)
            return _error({"detail": f"unknown user '{shown(user)}'", "unknown_items": []}, 404)
        inputs, lengths = self.rec.user_inputs(index)
        exclude = self.rec.user_histories(index)[1] if req.exclude_seen else None
        return _Job(inputs[0], int(lengths[0]), req.n, req.diversity_lambda, exclude, [], user)

    def _prepare_items(self, req: Any, raw: list[str], fallback: bool) -> _Job | Response | bytes:
        ids, unknown = self.rec.dataset.item_map.encode(raw)
        if len(ids) == 0:
            if fallback:
                return self.render_popular(req.n, unknown, None)
            what = "is empty" if not raw else "has no known item"
            return _error(
                {
                    "detail": f"the items sequence {what}; send at least one known item id (or set fallback_popular)",
                    "unknown_items": [shown(u) for u in unknown],
                },
                404,
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
            inputs,
            lengths,
            np.array([job.n for job in jobs]),
            exclude=exclude,
            diversity_lambda=np.array([job.diversity_lambda for job in jobs]),
        )
        return [(recs.ids[b], recs.scores[b], recs.interest_of[b]) for b in range(len(jobs))]

    def render(self, job: _Job, row: tuple[np.ndarray, np.ndarray, np.ndarray]) -> bytes:
        return self._body(*row, n=job.n, unknown=job.unknown, user=job.user, length=job.length, source="model")

    def render_popular(self, n: int, unknown: list[str], user: str | None) -> bytes:
        recs = self.rec.popular(n)
        return self._body(
            recs.ids[0],
            recs.scores[0],
            recs.interest_of[0],
            n=n,
            unknown=unknown,
            user=user,
            length=0,
            source="popular",
        )

    def _body(
        self,
        ids: np.ndarray,
        scores: np.ndarray,
        interest_of: np.ndarray,
        *,
        n: int,
        unknown: list[str],
        user: str | None,
        length: int,
        source: str,
    ) -> bytes:
        valid = ids > 0
        items = [
            {"item": item, "score": score, "interest": k}
            for item, score, k in zip(
                self.rec.dataset.item_map.decode(ids[valid]).tolist(),
                scores[valid].tolist(),
                interest_of[valid].tolist(),
            )
        ]
        return json.dumps(
            {
                "items": items,
                "unknown_items": unknown,
                "n": len(items),
                "requested_n": n,
                "source": source,
                "user": user,
                "input_length": length,
            }
        ).encode()


def create_app(rec: Recommender, cfg: ServeConfig, *, run: str = "") -> FastAPI:
    """The FastAPI app serving ``rec`` with the limits and defaults of ``cfg``."""
    service = _Service(rec, cfg)
    info = {
        **rec.info(),
        "run": run,
        "default_n": cfg.n,
        "max_n": cfg.max_n,
        "max_batch": cfg.max_batch,
        "batch_workers": cfg.batch_workers,
        "fallback_popular": cfg.fallback_popular,
    }
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
        return _validation_error(exc.errors(), request.headers.get("content-type"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if isinstance(exc.__cause__, UnicodeDecodeError):  # raised by FastAPI reading the body as JSON text
            return _not_utf8(exc.__cause__)
        return await http_exception_handler(request, exc)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    async def get_info() -> dict[str, Any]:
        return {**info, "batches": app.state.batcher.batches, "requests": app.state.batcher.items}

    @app.post("/recommend", responses=RESPONSES)
    async def recommend(req: Annotated[RequestBody, Body()]) -> Response:  # type: ignore[valid-type]
        job = service.prepare(req)
        if isinstance(job, Response):
            return job
        if isinstance(job, bytes):
            return Response(job, media_type="application/json")
        row = await app.state.batcher.submit(job)
        return Response(service.render(job, row), media_type="application/json")

    return app


def run_server(
    rec: Recommender,
    cfg: ServeConfig,
    *,
    run: str | Path = "",
    threads: int = 1,
    access_log: bool = False,
) -> None:
    """Serve ``rec`` (e.g. :meth:`Recommender.from_run`, loaded once) on ``cfg.host:cfg.port``
    until interrupted; ``run`` names the run directory in ``GET /info`` and the start line.

    ``threads`` caps torch's and FAISS's CPU threads (1 suits a single-worker server:
    concurrency comes from micro-batching, not from intra-op threads).
    """
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    app = create_app(rec, cfg, run=str(run))
    sock = bind(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    print(
        f"serving {run} ({rec.name}, {count(rec.dataset.catalogue_size - 1, 'item')}, index {rec.index_name}) "
        f"on http://{cfg.host}:{port}",
        flush=True,
    )
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
