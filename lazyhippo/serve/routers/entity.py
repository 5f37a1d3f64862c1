"""One entity as the graph holds it (`lazyhippo entity`): any key that may read the namespace."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool

from lazyhippo.query.entity import lookup_entity
from lazyhippo.serve.limits import text_problem
from lazyhippo.serve.routers.operations import known_settings

router = APIRouter(tags=["knowledge graphs"])


@router.get("/api/kg/entity")
async def kg_entity(request: Request, name: str = Query(min_length=1, max_length=500), namespace: str = "default",
                    neighbours: int = Query(20, ge=0, le=200), chunks: int = Query(10, ge=0, le=100)) -> dict:
    """Description, type, PageRank, communities (finest level first), neighbours with their relation descriptions
    and weights, and the passages that mention it with their citations. `match` says how the name was found:
    exact, fuzzy (one clear candidate), or ambiguous (no entity; `candidates` to choose from)."""
    settings = known_settings(request, namespace)
    if problem := text_problem("name", name):
        raise HTTPException(400, problem)
    try:
        found = await run_in_threadpool(lookup_entity, settings, name, neighbours, chunks)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if found.match == "none":
        raise HTTPException(404, f"no entity like {name!r} in namespace {namespace!r}")
    return found.to_dict()
