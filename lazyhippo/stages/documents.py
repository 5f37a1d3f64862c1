"""The `documents` asset: read the source (all of it, or some files) into the documents table, skipping
documents deleted earlier with unchanged content and reporting what cannot be read."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from lazyhippo.settings import Settings
from lazyhippo.sources.files import Document, Section, read_source
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.results import DocumentsResult
from lazyhippo.stores.warehouse import replace_rows


def read_namespace_source(settings: Settings) -> tuple[list[Document], list]:
    """The documents the source yields, and its unreadable files; an empty source is an error, so a wrong or
    emptied path cannot wipe the namespace."""
    from lazyhippo.sources.bucket import source_path

    docs, errors = read_source(source_path(settings), settings.max_file_bytes)
    if not docs and not errors:
        raise ValueError(f"source {settings.source} holds no readable file: nothing indexed and nothing removed "
                         "(removing every document of a namespace is an explicit delete)")
    return docs, errors


def ingest_documents(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> DocumentsResult:
    """Read the source; unreadable files are reported and skipped, and their earlier version is kept. With
    `only` (a run over some document partitions) or in mode "add", the other documents keep their rows as they are."""
    from lazyhippo.stages.incremental import write_inputs

    docs, errors = read_namespace_source(settings)
    ns = settings.namespace
    failed_files = {e.file for e in errors}
    cols = ("doc_id", "source", "title", "kind", "content_hash", "n_chars", "sections")
    rows = [{"doc_id": d.doc_id, "source": d.source, "title": d.title, "kind": d.kind,
             "content_hash": d.content_hash, "n_chars": len(d.text),
             "sections": json.dumps([s.__dict__ for s in d.sections])} for d in docs]
    rows, skipped_deleted = skip_deleted(con, ns, rows)
    if only is not None:
        rows = [r for r in rows if r["doc_id"] in only]
    ids = {r["doc_id"] for r in rows}
    previous = [dict(zip(cols, r)) for r in con.execute(
        f"SELECT {', '.join(cols)} FROM documents WHERE namespace = ?", [ns]).fetchall()]
    before = {r["doc_id"]: r["content_hash"] for r in previous}
    kept = [r for r in previous if r["doc_id"] not in ids
            and ((only is not None and r["doc_id"] not in only) or settings.mode == "add"
                 or _from_files(r["source"], failed_files))]
    rows += kept
    replace_rows(con, "documents", ns, with_namespace(pa.Table.from_pylist(rows), ns) if rows else None)
    write_inputs(con, ns, "documents", {"source": str(settings.source)})  # what `drop_vanished` may compare with
    err_rows = [{"source": e.source, "reason": e.reason} for e in errors]
    replace_rows(con, "document_errors", ns, with_namespace(pa.Table.from_pylist(err_rows), ns) if err_rows else None)
    changed = sum(1 for r in rows if before.get(r["doc_id"]) != r["content_hash"])
    return DocumentsResult(documents=len(rows), errors=errors, changed=changed,
                           removed=len(set(before) - {r["doc_id"] for r in rows}), kept_after_error=len(kept),
                           skipped_deleted=len(skipped_deleted))


def _from_files(source: str, files: set[str]) -> bool:
    """Whether a document came from one of `files` (a file itself, or a JSONL row `file#id`): no splitting, so a
    ':' or '#' in a file name cannot detach a document from its file."""
    return source in files or any(source[:i] in files for i, ch in enumerate(source) if ch == "#")


def load_documents(con: duckdb.DuckDBPyConnection, namespace: str) -> list[Document]:
    rows = con.execute("SELECT doc_id, source, title, kind, content_hash, sections FROM documents "
                       "WHERE namespace = ? ORDER BY doc_id", [namespace]).fetchall()
    return [Document(doc_id, source, title, kind, tuple(Section(**s) for s in json.loads(sections)), h)
            for doc_id, source, title, kind, h, sections in rows]


def skip_deleted(con: duckdb.DuckDBPyConnection, namespace: str, rows: list[dict]) -> tuple[list[dict], list[str]]:
    """Drop ingested rows deleted earlier with the same content; a changed or vanished document is forgotten
    as deleted (it comes back when its content changes or it reappears)."""
    deleted = dict(con.execute("SELECT doc_id, content_hash FROM deleted_documents WHERE namespace = ?", [namespace]).fetchall())
    if not deleted:
        return rows, []
    kept = [r for r in rows if deleted.get(r["doc_id"]) != r["content_hash"]]
    skipped = sorted(r["doc_id"] for r in rows if deleted.get(r["doc_id"]) == r["content_hash"])
    forget = sorted(set(deleted) - set(skipped))
    if forget:
        con.execute("DELETE FROM deleted_documents WHERE namespace = ? AND doc_id IN (SELECT unnest(?))", [namespace, forget])
    return kept, skipped
