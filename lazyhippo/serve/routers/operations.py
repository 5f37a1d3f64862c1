"""Keeping a knowledge base current: delete documents, merge entities (runs like `kg_create`'s, followed at
`/api/runs/{run_id}`) and export tables (a zip file). All three need the write key, scoped to the namespace."""

from __future__ import annotations

import shutil
from typing import Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from lazyhippo.serve import operations
from lazyhippo.serve.limits import text_problem
from lazyhippo.serve.routers import allowed_namespace, visible
from lazyhippo.serve.routers.knowledge import _accepted
from lazyhippo.serve.runs import QueueFull
from lazyhippo.stages.exports import EXPORTABLE, FORMATS
from lazyhippo.stages.merge import STRATEGIES

router = APIRouter(tags=["knowledge graphs"])


class DeleteRequest(BaseModel):
    documents: list[str] = Field(description="doc_id or source path (as in the documents table) of each document.")
    namespace: str = "default"


class MergeRequest(BaseModel):
    sources: list[str] = Field(description="Entities to fold (names or ids as in the entities table).")
    into: str = Field(description="The entity that remains; created when no entity has that name.")
    strategy: Literal[STRATEGIES] = Field("concatenate", description="The target's description: concatenate, "
                                          "keep_first, keep_longest, or llm_summary (needs the server's LLM).")
    namespace: str = "default"


class ExportRequest(BaseModel):
    namespace: str = "default"
    format: Literal[FORMATS] = "csv"
    tables: list[Literal[EXPORTABLE]] | None = Field(None, description="Default: entities, relations, chunks.")
    include_vectors: bool = Field(False, description="Add each row's embedding as a `vector` column.")


def known_settings(request: Request, namespace: str):
    """The server's settings for `namespace` when the caller may use it and it has an index (else 403/404)."""
    pool = request.app.state.pool
    allowed_namespace(request, namespace)
    if namespace not in pool.namespaces():
        known = ", ".join(visible(request, pool.namespaces())) or "none"
        raise HTTPException(404, f"unknown namespace {namespace!r} (known: {known})")
    return pool.settings.with_(namespace=namespace)


def _texts(name: str, values: list[str]) -> None:
    for v in values:
        if problem := text_problem(name, v):
            raise HTTPException(400, problem)


def _queue(request: Request, namespace: str, command: tuple[str, ...]) -> dict:
    try:
        run = request.app.state.runs.submit(None, namespace, None, command=command)
    except QueueFull as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": "30"}) from None
    return _accepted(request, run)


@router.post("/api/kg/delete", status_code=202)
def kg_delete(body: DeleteRequest, request: Request) -> dict:
    """Remove documents and rebuild the graph without them (a `lazyhippo delete` run); returns its run id at once."""
    settings = known_settings(request, body.namespace)
    _texts("document", body.documents)
    try:
        command = operations.delete_command(settings, body.documents)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return _queue(request, body.namespace, command)


@router.post("/api/kg/merge", status_code=202)
def kg_merge(body: MergeRequest, request: Request) -> dict:
    """Fold entities into one, kept across reindexing (a `lazyhippo merge` run); returns its run id at once."""
    settings = known_settings(request, body.namespace)
    _texts("entity", [*body.sources, body.into])
    try:
        command = operations.merge_command(settings, body.sources, body.into, body.strategy)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return _queue(request, body.namespace, command)


@router.post("/api/kg/export")
async def kg_export(body: ExportRequest, request: Request) -> FileResponse:
    """Tables of the namespace's served index as files (`lazyhippo export`), in one zip file."""
    settings = known_settings(request, body.namespace)
    try:
        archive, _ = await run_in_threadpool(operations.export_archive, settings, body.format, body.tables,
                                             body.include_vectors)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return FileResponse(archive, media_type="application/zip", filename=archive.name,
                        background=BackgroundTask(shutil.rmtree, archive.parent, ignore_errors=True))
