"""Knowledge bases: create one from a folder under a source root, or from uploaded files, and follow its run.

`kg_create` reads only inside the operator's source roots (`LAZYHIPPO_SOURCE_ROOTS`; none: it is off), with
the path resolved (symlinks too) before the check, and one answer for "not allowed" and "does not exist", so
a caller learns nothing about other paths. Uploads are written to a temporary folder renamed on success.
"""

from __future__ import annotations

import errno
import shutil
import uuid
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, HTTPException, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, FiniteFloat

from lazyhippo.serve.limits import text_problem
from lazyhippo.serve.routers import allowed_namespace, grant_of
from lazyhippo.serve.runs import QueueFull, Run, RunEnded
from lazyhippo.settings import Settings
from lazyhippo.sources.files import SUPPORTED

router = APIRouter(tags=["knowledge graphs"])
Mode = Literal["replace", "add"]
MAX_NAME_BYTES = 255
INCOMING = ".incoming-"


class CreateRequest(BaseModel):
    path: str = Field(description="Folder or file under one of the server's source roots.")
    namespace: str = "default"
    mode: Mode = Field("replace", description="replace: the namespace becomes exactly this source (documents it "
                                              "lacks are dropped); add: its documents are added or updated, none dropped.")
    community_resolutions: list[FiniteFloat] | None = Field(None, description="Community levels coarse to fine.")
    knn_structural: Literal["off", "concat", "replace"] | None = Field(None, description="FastRP in the KNN (neo4j).")


def index_options(body: CreateRequest) -> tuple[str, ...]:
    """The request's index settings as `lazyhippo index` options, checked as the run would (a 400 now, not a
    failed run later)."""
    try:
        settings = Settings.from_env().with_(community_resolutions=body.community_resolutions,
                                             knn_structural=body.knn_structural)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if settings.knn_structural != "off" and settings.graph_store != "neo4j":
        raise HTTPException(400, f"knn_structural {settings.knn_structural!r} needs graph_store 'neo4j' (FastRP runs in GDS)")
    options = ()
    if body.community_resolutions is not None:
        options += ("--community-resolutions", ",".join(f"{r:g}" for r in settings.community_resolutions))
    if body.knn_structural is not None:
        options += ("--knn-structural", body.knn_structural)
    return options


def source_under_roots(path: str, roots: tuple[Path, ...]) -> Path:
    """The resolved source when it lies inside a root, is not hidden and is a folder or a supported file."""
    if not roots:
        raise HTTPException(403, "creating knowledge bases from server paths is off: the operator names the "
                                 "folders it may read in LAZYHIPPO_SOURCE_ROOTS")
    refused = HTTPException(400, f"path {path!r} is not an indexable folder or file under a source root")
    if "\x00" in path or not path.strip():
        raise refused
    for root in roots:
        try:
            source = (root / Path(path).expanduser()).resolve(strict=True)  # an absolute path replaces the root
        except (OSError, RuntimeError, ValueError):  # missing, a symlink loop, not encodable as a file name
            continue
        inside = source.relative_to(root) if source == root or root in source.parents else None
        if inside is None or any(part.startswith(".") for part in inside.parts):
            continue
        if source.is_dir() or (source.is_file() and source.suffix.lower() in SUPPORTED):
            return source
    raise refused


def _accepted(request: Request, run: Run) -> dict:
    return {**request.app.state.runs.status(run), "status_url": f"/api/runs/{run.run_id}"}


def _submit(request: Request, source: Path, namespace: str, mode: str, upload: bool = False,
            options: tuple[str, ...] = ()) -> Run:
    try:
        return request.app.state.runs.submit(source, namespace, mode, upload, options)
    except QueueFull as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": "30"}) from None


@router.post("/api/kg/create", status_code=202)
def kg_create(body: CreateRequest, request: Request) -> dict:
    """Index a folder or file under a source root (a `lazyhippo index` run); returns its run id at once. The
    run's status reports the documents added, changed and removed."""
    allowed_namespace(request, body.namespace)
    source = source_under_roots(body.path, request.app.state.source_roots)
    return _accepted(request, _submit(request, source, body.namespace, body.mode, options=index_options(body)))


def _field(form, name: str, default: str) -> str:
    value = form.get(name, default)
    if not isinstance(value, str):
        raise HTTPException(400, f"{name} must be a form field, not a file")
    return value


def _file_name(raw: str | None) -> str:
    name = Path(raw or "").name
    if not name or name.startswith(".") or "\x00" in name or "\\" in name:
        raise HTTPException(400, "every uploaded file needs a name that does not start with '.'")
    if problem := text_problem("file name", name):
        raise HTTPException(400, problem)
    if len(name.encode()) > MAX_NAME_BYTES:
        raise HTTPException(400, f"file name over {MAX_NAME_BYTES} bytes: {name[:40]!r}...")
    if Path(name).suffix.lower() not in SUPPORTED:
        raise HTTPException(400, f"file {name!r}: unsupported type (supported: {', '.join(sorted(SUPPORTED))})")
    return name


def _store(home: Path, namespace: str, files: list[UploadFile], names: list[str]) -> Path:
    """Write the files to a temporary folder, renamed to its final name once all are written."""
    parent = home / "uploads" / namespace
    parent.mkdir(parents=True, exist_ok=True)
    folder_id = uuid.uuid4().hex
    incoming = parent / f"{INCOMING}{folder_id}"
    incoming.mkdir()
    try:
        for f, name in zip(files, names):
            with open(incoming / name, "wb") as out:
                shutil.copyfileobj(f.file, out)
        final = parent / folder_id
        incoming.rename(final)
        return final
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise HTTPException(400, "an uploaded file's path is too long for the server's file system") from None
        raise
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


@router.post("/api/kg/upload", status_code=202)
async def kg_upload(request: Request, files: list[UploadFile]) -> dict:
    """Index uploaded files (multipart, up to the upload limit in all; form fields `namespace` and `mode` as in
    `kg_create`): they become the namespace's source; returns the run id at once."""
    form = await request.form()  # parsed once already for `files`
    namespace = allowed_namespace(request, _field(form, "namespace", "default"))
    mode = _field(form, "mode", "replace")
    if mode not in ("replace", "add"):
        raise HTTPException(400, f"mode {mode!r}: expected replace or add")
    names = [_file_name(f.filename) for f in files]
    if len(set(names)) != len(names):
        raise HTTPException(400, "every uploaded file needs a distinct name")
    folder = await run_in_threadpool(_store, Path(request.app.state.pool.settings.home), namespace, files, names)
    try:
        run = _submit(request, folder, namespace, mode, upload=True)
    except HTTPException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return _accepted(request, run)


def _found(request: Request, run_id: str) -> Run:
    found = request.app.state.runs.get(run_id)
    if found is None or not grant_of(request).covers(found.namespace):
        raise HTTPException(404, f"no run {run_id!r}")
    return found


@router.get("/api/runs/{run_id}")
def run(run_id: str, request: Request) -> dict:
    """A run this server accepted, as the home's Dagster instance records it: its status (QUEUED, STARTED,
    CANCELING, SUCCESS once its index is served, FAILURE with the error, CANCELED), tags, and the documents
    added, changed, removed and failed once it read its source."""
    return request.app.state.runs.status(_found(request, run_id))


@router.post("/api/runs/{run_id}/cancel", status_code=202)
def cancel_run(run_id: str, request: Request) -> dict:
    """Cancel a run: a waiting one never starts, a running one's process is ended; the Dagster run ends
    CANCELED (409 when it ended already)."""
    try:
        return request.app.state.runs.cancel(_found(request, run_id))
    except RunEnded as exc:
        raise HTTPException(409, str(exc)) from None
