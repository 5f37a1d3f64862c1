"""The `documents` asset: read the source (all of it, or some files) into the documents table, skipping
documents deleted earlier with unchanged content and reporting what cannot be read.

Memory stays flat in the size of the source: files are read one at a time and their documents go in batches
to a staging table of the connection; which documents are kept, changed or removed is then decided in SQL over
ids and content hashes, and the namespace's rows are replaced in one transaction (a failed run changes nothing).
"""

from __future__ import annotations

import json
from typing import Iterator

import duckdb
import pyarrow as pa

from lazyhippo.settings import Settings
from lazyhippo.sources.files import Document, ReadError, Section, iter_source
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.results import DocumentsResult
from lazyhippo.stores.warehouse import replace_rows, transaction

# a batch of documents read or loaded at once: whichever bound comes first
BATCH_DOCUMENTS = 1000
BATCH_CHARS = 8_000_000
_COLUMNS = ("doc_id", "source", "title", "kind", "content_hash", "n_chars", "sections")
_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("title", pa.string()), ("kind", pa.string()),
                     ("content_hash", pa.string()), ("n_chars", pa.int64()), ("sections", pa.string())])
_STAGED = "lh_read_documents"  # a temporary table: it lives and dies with the connection


def read_namespace_source(settings: Settings) -> Iterator[Document | ReadError]:
    """The documents and read errors of the namespace's source, as they are read."""
    from lazyhippo.sources.bucket import source_path

    return iter_source(source_path(settings), settings.max_file_bytes)


def ingest_documents(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> DocumentsResult:
    """Read the source; unreadable files are reported and skipped, and their earlier version is kept. With
    `only` (a run over some document partitions) or in mode "add", the other documents keep their rows as they are.
    An empty source is an error, raised before anything is written, so a wrong or emptied path cannot wipe the
    namespace."""
    from lazyhippo.stages.incremental import write_inputs

    ns = settings.namespace
    try:
        read, errors = _stage_source(con, read_namespace_source(settings))
        if not read and not errors:
            raise ValueError(f"source {settings.source} holds no readable file: nothing indexed and nothing removed "
                             "(removing every document of a namespace is an explicit delete)")
        con.register("lh_failed_files", pa.table({"file": pa.array(sorted({e.file for e in errors}), pa.string())}))
        con.register("lh_only", pa.table({"doc_id": pa.array(sorted(only or ()), pa.string())}))
        with transaction(con):
            counts = _replace(con, {"ns": ns, "all": only is None, "add": settings.mode == "add"})
            write_inputs(con, ns, "documents", {"source": str(settings.source)})  # what `drop_vanished` may compare with
            err_rows = [{"source": e.source, "reason": e.reason} for e in errors]
            replace_rows(con, "document_errors", ns, with_namespace(pa.Table.from_pylist(err_rows), ns) if err_rows else None)
    finally:
        for view in ("lh_failed_files", "lh_only"):
            con.unregister(view)
        con.execute(f"DROP TABLE IF EXISTS temp.{_STAGED}; DROP TABLE IF EXISTS temp.lh_document_plan")
    return DocumentsResult(errors=errors, **counts)


def _stage_source(con: duckdb.DuckDBPyConnection, items: Iterator[Document | ReadError]) -> tuple[int, list[ReadError]]:
    """Write the documents `items` yields to the staging table in bounded batches (a repeated id: the last one
    read wins); the number of distinct documents, and the read errors."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_STAGED} (doc_id VARCHAR PRIMARY KEY, source VARCHAR, title VARCHAR, "
                "kind VARCHAR, content_hash VARCHAR, n_chars BIGINT, sections VARCHAR)")
    errors: list[ReadError] = []
    batch: dict[str, dict] = {}
    chars = 0
    for item in items:
        if isinstance(item, ReadError):
            errors.append(item)
            continue
        sections = json.dumps([s.__dict__ for s in item.sections])
        batch[item.doc_id] = {"doc_id": item.doc_id, "source": item.source, "title": item.title, "kind": item.kind,
                              "content_hash": item.content_hash, "n_chars": len(item.text), "sections": sections}
        chars += len(sections)
        if len(batch) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
            _stage(con, batch)
            batch, chars = {}, 0
    _stage(con, batch)
    return con.execute(f"SELECT count(*) FROM {_STAGED}").fetchall()[0][0], errors


def _stage(con: duckdb.DuckDBPyConnection, batch: dict[str, dict]) -> None:
    if not batch:
        return
    con.register("lh_batch", pa.Table.from_pylist(list(batch.values()), _SCHEMA))
    try:
        con.execute(f"INSERT OR REPLACE INTO {_STAGED} SELECT * FROM lh_batch")
    finally:
        con.unregister("lh_batch")


def _replace(con: duckdb.DuckDBPyConnection, p: dict) -> dict[str, int]:
    """Decide from ids and content hashes what becomes of each staged and each indexed document, then replace
    the namespace's rows: only rows that differ are deleted and written. Call inside a transaction.

    A staged document deleted earlier with the same content is skipped; the others are wanted (with `only`, those
    in it). An indexed document not wanted is kept when outside `only`, in mode "add", or when it came from a file
    that failed (the file itself, or a JSONL row `file#id`: matched by prefix, so a ':' or '#' in a file name
    cannot detach a document from its file); else it is removed."""
    con.execute(f"""CREATE OR REPLACE TEMP TABLE lh_document_plan AS
        WITH r AS (SELECT doc_id, content_hash, source, title, kind, n_chars, md5(sections) AS body FROM {_STAGED}),
             d AS (SELECT doc_id, content_hash, source, title, kind, n_chars, md5(sections) AS body
                   FROM documents WHERE namespace = $ns),
             j AS (SELECT coalesce(r.doc_id, d.doc_id) AS doc_id, r.doc_id IS NOT NULL AS staged,
                          d.doc_id IS NOT NULL AS indexed, d.source AS old_source,
                          r.content_hash IS DISTINCT FROM d.content_hash AS new_content,
                          (r.content_hash, r.source, r.title, r.kind, r.n_chars, r.body)
                            IS NOT DISTINCT FROM (d.content_hash, d.source, d.title, d.kind, d.n_chars, d.body) AS same_row,
                          coalesce(r.content_hash = x.content_hash, false) AS skipped,
                          coalesce(r.doc_id, d.doc_id) IN (SELECT doc_id FROM lh_only) AS in_only
                   FROM r FULL JOIN d ON d.doc_id = r.doc_id
                   LEFT JOIN (SELECT doc_id, content_hash FROM deleted_documents WHERE namespace = $ns) x
                     ON x.doc_id = r.doc_id),
             w AS (SELECT *, staged AND NOT skipped AND ($all OR in_only) AS wanted FROM j)
        SELECT doc_id, indexed, skipped, wanted, wanted AND new_content AS changed, wanted AND indexed AND same_row AS same_row,
               indexed AND NOT wanted AND ((NOT $all AND NOT in_only) OR $add OR old_source IN (SELECT file FROM lh_failed_files)
                   OR EXISTS (SELECT 1 FROM lh_failed_files f WHERE starts_with(old_source, f.file || '#'))) AS kept
        FROM w""", p)
    ns = p["ns"]
    con.execute("DELETE FROM deleted_documents WHERE namespace = ? AND doc_id NOT IN "
                "(SELECT doc_id FROM lh_document_plan WHERE skipped)", [ns])
    con.execute("DELETE FROM documents WHERE namespace = ? AND doc_id IN "
                "(SELECT doc_id FROM lh_document_plan WHERE indexed AND NOT kept AND NOT same_row)", [ns])
    cols = ", ".join(_COLUMNS)
    con.execute(f"INSERT INTO documents (namespace, {cols}) SELECT ?, {cols} FROM {_STAGED} WHERE doc_id IN "
                "(SELECT doc_id FROM lh_document_plan WHERE wanted AND NOT same_row)", [ns])
    documents, changed, removed, kept, skipped = con.execute(
        "SELECT count(*) FILTER (wanted OR kept), count(*) FILTER (changed), count(*) FILTER (indexed AND NOT wanted AND NOT kept), "
        "count(*) FILTER (kept), count(*) FILTER (skipped) FROM lh_document_plan").fetchall()[0]
    return {"documents": documents, "changed": changed, "removed": removed, "kept_after_error": kept,
            "skipped_deleted": skipped}


def iter_documents(con: duckdb.DuckDBPyConnection, namespace: str) -> Iterator[list[Document]]:
    """The namespace's documents in id order, in batches of at most BATCH_DOCUMENTS documents and BATCH_CHARS
    characters before the last one: one batch in memory at a time. Each batch is one query over a range of ids,
    so the caller may write on `con` between batches."""
    ranges = con.execute("""
        SELECT min(doc_id), max(doc_id) FROM (
            SELECT doc_id, (row_number() OVER w - 1) // $n + (sum(coalesce(n_chars, 0)) OVER w - coalesce(n_chars, 0)) // $c AS batch
            FROM documents WHERE namespace = $ns WINDOW w AS (ORDER BY doc_id))
        GROUP BY batch ORDER BY 1""", {"ns": namespace, "n": BATCH_DOCUMENTS, "c": BATCH_CHARS}).fetchall()
    for low, high in ranges:
        rows = con.execute("SELECT doc_id, source, title, kind, content_hash, sections FROM documents "
                           "WHERE namespace = ? AND doc_id BETWEEN ? AND ? ORDER BY doc_id", [namespace, low, high]).fetchall()
        yield [Document(doc_id, source, title, kind, tuple(Section(**s) for s in json.loads(sections)), h)
               for doc_id, source, title, kind, h, sections in rows]
