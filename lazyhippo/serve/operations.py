"""What the HTTP API and the MCP tool share to delete documents, merge entities and export tables: the checks a
request passes before anything is queued (against the namespace's published index, so a bad name is refused at
once, not by a failed run later), the `lazyhippo delete | merge` arguments its run executes (the same commands,
hence the same Dagster `rebuild_graph` run, as on the CLI), and exports written from the published index.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from lazyhippo.settings import Settings
from lazyhippo.stages.exports import DEFAULT_TABLES, Exported, check_request, export_tables
from lazyhippo.stages.lifecycle import resolve_documents
from lazyhippo.stages.merge import check_strategy, resolve_entities
from lazyhippo.stores.warehouse import connect

MAX_ITEMS = 1000  # documents or entities in one request


def _items(name: str, values: list[str]) -> list[str]:
    values = list(dict.fromkeys(v.strip() for v in values if v and v.strip()))
    if any("\x00" in v for v in values):
        raise ValueError(f"{name} holds a NUL character")
    if not values:
        raise ValueError(f"{name} is empty: give at least one")
    if len(values) > MAX_ITEMS:
        raise ValueError(f"{name} has {len(values)} items; the limit is {MAX_ITEMS}")
    return values


def delete_command(settings: Settings, documents: list[str]) -> tuple[str, ...]:
    """`lazyhippo delete` arguments for `documents` (doc ids or source paths) of `settings.namespace`; a
    ValueError names the ones it does not hold."""
    documents = _items("documents", documents)
    with connect(settings, read_only=True) as con:
        resolve_documents(con, settings.namespace, documents)
    return ("delete", "--", *documents)


def merge_command(settings: Settings, sources: list[str], into: str, strategy: str) -> tuple[str, ...]:
    """`lazyhippo merge` arguments; a ValueError names an unknown source, a bad strategy or `llm_summary`
    without an LLM. `into` may name no entity yet: the merge creates it."""
    sources = _items("sources", sources)
    check_strategy(strategy, settings.llm != "none")
    if not into.strip() or "\x00" in into:
        raise ValueError("into is empty or holds a NUL character: name the entity that remains")
    with connect(settings, read_only=True) as con:
        resolve_entities(con, settings.namespace, sources)
    return ("merge", f"--into={into.strip()}", f"--strategy={strategy}", "--", *sources)


def export_files(settings: Settings, fmt: str, tables: list[str] | None, include_vectors: bool, out: Path
                 ) -> list[Exported]:
    """The tables of `settings.namespace` (default: entities, relations, chunks) written to `out` from its
    published index, as `lazyhippo export` writes them."""
    tables = list(DEFAULT_TABLES if tables is None else tables)
    check_request(fmt, tables)
    with connect(settings, read_only=True) as con:
        return export_tables(con, settings.namespace, fmt, tables, out, include_vectors=include_vectors)


def export_archive(settings: Settings, fmt: str, tables: list[str] | None, include_vectors: bool
                   ) -> tuple[Path, list[Exported]]:
    """`export_files` as one zip file in a new temporary folder (the caller removes the folder)."""
    work = Path(tempfile.mkdtemp(prefix="lazyhippo-export-"))
    try:
        done = export_files(settings, fmt, tables, include_vectors, work / "files")
        archive = shutil.make_archive(str(work / f"{settings.namespace}-export"), "zip", work / "files")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Path(archive), done


def export_folder(settings: Settings) -> Path:
    """A new folder under the home for one export (`<home>/exports/<namespace>/<UTC time>`)."""
    base = Path(settings.home) / "exports" / settings.namespace
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder, n = base / stamp, 1
    while folder.exists():
        n += 1
        folder = base / f"{stamp}-{n}"
    return folder
