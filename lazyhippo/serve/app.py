"""`lazyhippo serve`: the HTTP API over warm indexes (FastAPI; OpenAPI docs at /docs).

Queries run on the engine's `IndexPool` (one warm index per namespace, swapped atomically after a newer
index run); `POST /api/kg/create` launches the Dagster `index` job in this process. Auth: an API key from
`LAZYHIPPO_API_KEY` (header `Authorization: Bearer <key>` or `X-API-Key`); without one the server only
binds to loopback. Bad input gets a 4xx naming the problem; a failing backend a 503 without internals.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import Depends, FastAPI, Form, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, Field

from lazyhippo.query import ROUTES
from lazyhippo.serve.engines import EnginePool
from lazyhippo.serve.pool import IndexPool, UnknownNamespace, limit_threads
from lazyhippo.settings import check_namespace as valid_namespace
from lazyhippo.settings import Settings, environment

log = logging.getLogger("lazyhippo.api")
API_KEY_ENV = "LAZYHIPPO_API_KEY"


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * 1024
    max_upload_bytes: int = 50 * 1024 * 1024
    max_question_chars: int = 2000
    max_budget: int = 32000
    max_top_k: int = 50
    max_history: int = 10


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_for(host: str) -> str | None:
    """The key requests must carry (None: no auth). Refuses a non-loopback bind without a key."""
    key = environment().api_key
    if key is None and not is_loopback(host):
        raise ValueError(f"binding to {host} needs an API key: set {API_KEY_ENV} (no key is needed on loopback only)")
    return key


class Turn(BaseModel):
    role: Literal["user", "assistant"]
    content: str = Field(max_length=4000)


class QueryRequest(BaseModel):
    question: str
    namespace: str = "default"
    route: str = "auto"
    top_k: int = Field(8, ge=1)
    budget: int = Field(32000, ge=1)
    history: list[Turn] = Field(default_factory=list, description="Earlier turns; the user's help resolve follow-ups.")


class FixedRouteRequest(BaseModel):
    question: str
    namespace: str = "default"
    top_k: int = Field(8, ge=1)
    budget: int = Field(32000, ge=1)


class CreateRequest(BaseModel):
    path: str = Field(description="Folder or file on the server to index.")
    namespace: str = "default"
    community_resolutions: list[float] | None = Field(None, description="Community levels coarse to fine.")
    knn_structural: Literal["off", "concat", "replace"] | None = Field(None, description="FastRP in the KNN (neo4j).")


class _Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("lazyhippo_requests", "HTTP requests", ["endpoint", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("lazyhippo_request_seconds", "HTTP request latency", ["endpoint", "route"],
                                 registry=self.registry,
                                 buckets=(.005, .01, .025, .05, .075, .1, .25, .5, 1, 2.5, 5, 10))


class Observe:
    """Body-size limits before a body is read, then request counts and latency per endpoint and route. Plain
    ASGI: Starlette's `BaseHTTPMiddleware` runs each request through extra tasks and streams, a cost paid on
    every query by the process that owns all connections."""

    def __init__(self, app, metrics: _Metrics, limits: Limits):
        self.app, self.metrics, self.limits = app, metrics, limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        scope.setdefault("state", {})
        size = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"content-length"), None)
        limit = self.limits.max_upload_bytes if scope["path"] == "/api/kg/upload" else self.limits.max_body_bytes
        status = [500]  # unless a response starts
        if scope["method"] == "POST" and size is None:  # a chunked body could not be limited before reading it
            refused = JSONResponse({"error": "a Content-Length header is required"}, status_code=411)
        elif size is not None and (not size.isdigit() or int(size) > limit):
            refused = JSONResponse({"error": f"request body over {limit} bytes"}, status_code=413)
        else:
            refused = None

        async def observed_send(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await (refused or self.app)(scope, receive, observed_send)
        finally:
            route = scope.get("route")
            endpoint = route.path if route is not None else "unmatched"
            label = scope["state"].get("route", "")
            self.metrics.requests.labels(endpoint, label, str(status[0])).inc()
            self.metrics.latency.labels(endpoint, label).observe(time.perf_counter() - t0)


def create_app(pool: IndexPool | EnginePool, api_key: str | None = None, limits: Limits = Limits(),
               lifespan=None) -> FastAPI:
    app = FastAPI(title="lazyhippo", version="0.1.0", lifespan=lifespan,
                  description="Cited retrieval and answers over lazyhippo knowledge graphs.")
    metrics = _Metrics()
    launched: dict[str, str] = {}  # run id -> namespace, for runs this server started
    failed: set[str] = set()     # of those, runs whose chain failed before their graph run existed
    home = Path(pool.settings.home)

    app.add_middleware(Observe, metrics=metrics, limits=limits)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        problems = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"error": "invalid request", "problems": problems}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse({"error": "internal error"}, status_code=500)

    async def authorized(request: Request) -> None:  # async: no thread hop per request
        if api_key is None:
            return
        given = request.headers.get("x-api-key") or ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise HTTPException(401, "missing or wrong API key", headers={"WWW-Authenticate": "Bearer"})

    def run_query(request: Request, question: str, namespace: str, route: str, top_k: int, budget: int,
                  history: list[Turn] = ()) -> JSONResponse:
        if route != "auto" and route not in ROUTES:
            raise HTTPException(400, f"unknown route {route!r} (expected auto or one of {', '.join(ROUTES)})")
        request.state.route = route  # a metrics label: only known routes, so the label set stays bounded
        question = question.strip()
        if not question:
            raise HTTPException(400, "question is empty")
        if len(question) > limits.max_question_chars:
            raise HTTPException(413, f"question is {len(question)} characters; the limit is {limits.max_question_chars}")
        if top_k > limits.max_top_k:
            raise HTTPException(400, f"top_k {top_k} is over the limit {limits.max_top_k}")
        if budget > limits.max_budget:
            raise HTTPException(400, f"budget {budget} is over the limit {limits.max_budget} tokens")
        if len(history) > limits.max_history:
            raise HTTPException(400, f"history has {len(history)} turns; the limit is {limits.max_history}")
        earlier = " ".join(t.content for t in history[-2:] if t.role == "user")
        try:
            result = pool.answer(namespace, f"{earlier} {question}" if earlier else question, route, top_k, budget)
        except UnknownNamespace:
            raise HTTPException(404, f"unknown namespace {namespace!r} (known: {', '.join(pool.namespaces()) or 'none'})")
        except Exception as exc:  # noqa: BLE001 - the client gets a 503, the log gets the details
            log.exception("query failed in namespace %s", namespace)
            raise HTTPException(503, f"query backend unavailable ({type(exc).__name__}); retry later")
        data = result.to_dict()
        data["question"] = question
        notice = pool.notice(namespace)
        if notice:  # the latest index run is unfinished, failed or was killed: the answer is from an older index
            data["notice"] = notice
        request.state.route = data["route"]
        return JSONResponse(data)  # already plain JSON types: skips FastAPI's slower generic encoder

    @app.get("/health", tags=["operations"])
    def health() -> dict:
        """Liveness, the warm indexes and the query engines with the queries each was given (no auth)."""
        return {"status": "ok", "namespaces": pool.namespaces(), "warm": pool.status(), "swaps": pool.swaps,
                "worker_pid": os.getpid(), "engines": pool.engines()}

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    def prometheus(_: None = Depends(authorized)) -> PlainTextResponse:
        """Request counts and latency histograms per endpoint and route, in Prometheus text format."""
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/namespaces", tags=["knowledge graphs"])
    def namespaces(_: None = Depends(authorized)) -> dict:
        return {"namespaces": pool.namespaces()}

    @app.post("/api/query", tags=["query"])
    def query(body: QueryRequest, request: Request, _: None = Depends(authorized)) -> JSONResponse:
        """Any route (auto, local, global, drift, hybrid, multi_hop): the JSON of `lazyhippo query --json`."""
        return run_query(request, body.question, body.namespace, body.route, body.top_k, body.budget, body.history)

    @app.post("/api/kg/qa", tags=["query"])
    def kg_qa(body: FixedRouteRequest, request: Request, _: None = Depends(authorized)) -> JSONResponse:
        """The global route: an answer from community evidence."""
        return run_query(request, body.question, body.namespace, "global", body.top_k, body.budget)

    @app.post("/api/kg/hybrid", tags=["query"])
    def kg_hybrid(body: FixedRouteRequest, request: Request, _: None = Depends(authorized)) -> JSONResponse:
        """The hybrid route: dense, BM25 and graph channels fused."""
        return run_query(request, body.question, body.namespace, "hybrid", body.top_k, body.budget)

    def check_namespace(namespace: str) -> None:
        """The one namespace rule of every store (lazyhippo.settings), as a 400."""
        try:
            valid_namespace(namespace)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    def launch_index(source: Path, namespace: str, how: str, **index_settings) -> dict:
        from lazyhippo_dagster.runner import launch_index, run_config

        pool.begin_write()

        def done(run_id: str, ok: bool) -> None:
            pool.end_write()
            if not ok:
                failed.add(run_id)
            log.info("index run %s for namespace %s ended (success=%s)", run_id, namespace, ok)

        config = run_config({"lazyhippo": {"home": str(home), "namespace": namespace, "source": str(source.resolve()),
                                           **{k: v for k, v in index_settings.items() if v is not None}}})
        run_id = launch_index(home, config, tags={"lazyhippo/api": how}, on_done=done, namespace=namespace)
        launched[run_id] = namespace
        return {"run_id": run_id, "namespace": namespace, "status_url": f"/api/runs/{run_id}"}

    @app.post("/api/kg/create", tags=["knowledge graphs"], status_code=202)
    def kg_create(body: CreateRequest, _: None = Depends(authorized)) -> dict:
        """Launch the Dagster `index` job on a folder or file of the server; returns its run id at once."""
        source = Path(body.path).expanduser()
        if not source.exists():
            raise HTTPException(400, f"path {body.path!r} does not exist on the server")
        check_namespace(body.namespace)
        try:  # the index settings the body sets, checked as the run would (a 400 now, not a failed run later)
            settings = Settings.from_env().with_(community_resolutions=body.community_resolutions,
                                                 knn_structural=body.knn_structural)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        if settings.knn_structural != "off" and settings.graph_store != "neo4j":
            raise HTTPException(400, f"knn_structural {settings.knn_structural!r} needs graph_store 'neo4j' (FastRP runs in GDS)")
        return launch_index(source, body.namespace, "kg_create", community_resolutions=body.community_resolutions,
                            knn_structural=body.knn_structural)

    @app.post("/api/kg/upload", tags=["knowledge graphs"], status_code=202)
    def kg_upload(files: list[UploadFile], namespace: str = Form("default"), _: None = Depends(authorized)) -> dict:
        """Index uploaded files (multipart, up to the upload limit in all): they are kept under the index folder
        and become the namespace's source; launches the Dagster `index` job and returns its run id."""
        check_namespace(namespace)
        names = [Path(f.filename or "").name for f in files]
        bad = [n for n in names if not n or n.startswith(".")]
        if bad or len(set(names)) != len(names):
            raise HTTPException(400, "every uploaded file needs a distinct name that does not start with '.'")
        folder = home / "uploads" / namespace / uuid.uuid4().hex
        folder.mkdir(parents=True)
        for f, name in zip(files, names):
            (folder / name).write_bytes(f.file.read())
        return launch_index(folder, namespace, "kg_upload")

    @app.get("/api/runs/{run_id}", tags=["knowledge graphs"])
    def run(run_id: str, _: None = Depends(authorized)) -> dict:
        """Status of a Dagster run (QUEUED, STARTED, SUCCESS, FAILURE, ...)."""
        from lazyhippo_dagster.runner import run_status

        status = run_status(home, run_id)
        if status is None:
            if run_id in launched:  # its documents run is under way, or failed before the graph run began
                return {"run_id": run_id, "job": "index_graph", "status": "FAILURE" if run_id in failed else "STARTING", "tags": {}}
            raise HTTPException(404, f"no run {run_id!r}")
        return status

    return app


def serve(settings, host: str = "127.0.0.1", port: int = 8000, limits: Limits = Limits(), workers: int = 1) -> None:
    """Load the warm indexes, then serve until interrupted. One worker answers queries in the server process;
    with more, one process owns the connections and hands each query to whichever of `workers` engine
    processes (each with its own warm indexes) is free (`lazyhippo.serve.engines`)."""
    import uvicorn

    api_key = api_key_for(host)
    # every core already serves its own queries: parallelism inside one query (BLAS, PPR blocks, ONNX) only
    # makes them fight over the cores (measured in `lazyhippo bench serve`); engine processes inherit it
    os.environ.setdefault("LAZYHIPPO_THREADS", "1")
    limit_threads()
    pool = (EnginePool(settings, workers) if workers > 1 else IndexPool(settings)).start()

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        pool.stop()  # engine processes end with the server

    uvicorn.run(create_app(pool, api_key, limits, lifespan), host=host, port=port, log_level="warning",
                access_log=False)
