"""Operations: liveness with the server's state, and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lazyhippo.serve.routers import grant_of, visible

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health(request: Request) -> dict:
    """Liveness (no key needed); with a key (or on a keyless loopback server) also the warm indexes and the
    query engines with the queries each was given. Answered from state the pool keeps, never by asking an
    engine: a stuck engine cannot hold it up. `degraded` (still a 200) while engines are restarting or a
    namespace's index could not be read."""
    pool = request.app.state.pool
    health = pool.health()
    if grant_of(request) is None:
        return {"status": health["status"]}
    if "damaged" in health:
        health["damaged"] = {ns: why for ns, why in health["damaged"].items() if grant_of(request).covers(ns)}
    return {**health, "namespaces": visible(request, pool.namespaces()),
            "warm": {ns: w for ns, w in pool.status().items() if grant_of(request).covers(ns)},
            "swaps": pool.swaps, "engines": pool.engines(),
            "snapshots": pool.snapshots.status() if pool.snapshots else None}


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(request: Request) -> PlainTextResponse:
    """Request counts and latency histograms per endpoint and route, in Prometheus text format."""
    return PlainTextResponse(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
