"""`lazyhippo serve`: the HTTP API over warm indexes (FastAPI; OpenAPI docs at /docs).

Queries run on the engine's `IndexPool` (one warm index per namespace, swapped atomically after a newer
index run) or on engine processes (`EnginePool`); `POST /api/kg/create` and `/api/kg/upload` queue index runs
that execute in their own processes (`lazyhippo.serve.runs`). Who may call what is decided in the ASGI layer
before any body is read (`lazyhippo.serve.middleware`; docs/security.md). Bad input gets a 4xx naming the
problem; a failing backend a 503 without internals.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from lazyhippo.serve.connections import server_config
from lazyhippo.serve.engines import EnginePool
from lazyhippo.serve.limits import Limits
from lazyhippo.serve.middleware import TOKEN_HEADER, Access, Guard, Metrics
from lazyhippo.serve.pool import IndexPool, limit_threads
from lazyhippo.serve.routers import entity, knowledge, operations, ops, query
from lazyhippo.serve.runs import IndexRuns
from lazyhippo.settings import environment

__all__ = ["Access", "Limits", "create_app", "serve"]
log = logging.getLogger("lazyhippo.api")


def create_app(pool: IndexPool | EnginePool, access: Access | None = None, limits: Limits = Limits(),
               lifespan=None, source_roots: tuple[Path, ...] = ()) -> FastAPI:
    """The API over `pool`; without `access` it is keyless with a new token. `source_roots`: the folders
    `kg_create` may read (none: it is off)."""
    access = access or Access(token=secrets.token_urlsafe(24))

    @asynccontextmanager
    async def running(app_: FastAPI):
        try:
            if lifespan is None:
                yield
            else:
                async with lifespan(app_):
                    yield
        finally:
            app.state.runs.stop()  # the waiting runs are canceled, the running one ends with the server

    app = FastAPI(title="lazyhippo", version="0.1.0", lifespan=running,
                  description="Cited retrieval and answers over lazyhippo knowledge graphs.")
    home = Path(pool.settings.home)
    for stale in (home / "uploads").glob(f"*/{knowledge.INCOMING}*"):  # left by a server that was killed
        shutil.rmtree(stale, ignore_errors=True)
    app.state.pool, app.state.limits = pool, limits
    app.state.source_roots = tuple(Path(r).expanduser().resolve() for r in source_roots)
    app.state.runs = IndexRuns(pool, limits.max_pending_runs)
    app.state.metrics = Metrics()
    app.add_middleware(Guard, access=access, metrics=app.state.metrics, limits=limits)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        problems = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {plain(e['msg'])}"
                    for e in exc.errors()]
        return JSONResponse({"error": "invalid request", "problems": problems}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse({"error": "internal error"}, status_code=500)

    for router in (query.router, knowledge.router, operations.router, entity.router, ops.router):
        app.include_router(router)
    return app


PYTHON_TEXT = re.compile(r"<class '(\w+)'>|\b[A-Z]\w*\((?:[^()]|\([^()]*\))*\)")
PYTHON_TYPES = {"str": "text", "int": "a whole number", "float": "a number", "bytes": "text", "list": "a list",
                "dict": "an object", "UploadFile": "an uploaded file"}


def plain(message: str) -> str:
    """A validation message without Python object text (`<class 'str'>`, `UploadFile(...)`)."""
    return PYTHON_TEXT.sub(lambda m: PYTHON_TYPES.get(m.group(1) or m.group(0).split("(")[0], "a value"),
                           message).replace("UploadFile", "an uploaded file")


def serve(settings, host: str = "127.0.0.1", port: int = 8000, limits: Limits = Limits(), workers: int = 1) -> None:
    """Load the warm indexes, then serve until interrupted. One worker answers queries in the server process;
    with more, one process owns the connections and hands each query to whichever of `workers` engine
    processes (each with its own warm indexes) is free (`lazyhippo.serve.engines`). A keyless server prints
    its token for the endpoints that change data."""
    import uvicorn

    env = environment()
    access = Access.for_host(env, host)
    # every core already serves its own queries: parallelism inside one query (BLAS, PPR blocks, ONNX) only
    # makes them fight over the cores (measured in `lazyhippo bench serve`); engine processes inherit it
    os.environ.setdefault("LAZYHIPPO_THREADS", "1")
    limit_threads()
    pool = (EnginePool(settings, workers, query_seconds=limits.query_seconds) if workers > 1
            else IndexPool(settings)).start()
    if access.token:
        print(f"keyless loopback server: creating or uploading needs the header {TOKEN_HEADER}: {access.token}",
              file=sys.stderr, flush=True)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        pool.stop()  # engine processes end with the server

    app = create_app(pool, access, limits, lifespan, env.source_roots)
    uvicorn.Server(server_config(app, host, port, limits, log_level="warning", access_log=False)).run()
