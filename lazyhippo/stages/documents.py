"""The `documents` asset: read the source (all of it, or some files) into the documents table, skipping
documents deleted earlier with unchanged content and reporting what cannot be read.

The stage holds one batch of documents at a time, whatever the size of the source: files are read one at a time
and their documents written in batches, only those new or changed; which indexed documents are kept or removed
is decided in SQL over ids and content hashes. It all happens in one transaction, so a failed run changes
nothing (until it commits, DuckDB keeps the rows written within its memory cap, spilling past it).
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

# a batch of documents read or loaded at once: at most this many, of about this many characters
BATCH_DOCUMENTS = 1000
BATCH_CHARS = 8_000_000
_COLUMNS = ("doc_id", "source", "title", "kind", "content_hash", "n_chars", "sections")
_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("title", pa.string()), ("kind", pa.string()),
                     ("content_hash", pa.string()), ("n_chars", pa.int64()), ("sections", pa.string())])
# temporary tables of the connection: ids and hashes of the documents indexed before the run and of those read
_TEMP = ("lh_indexed", "lh_read", "lh_document_plan")


def read_namespace_source(settings: Settings) -> Iterator[Document | ReadError]:
    """The documents and read errors of the namespace's source, as they are read."""
    from lazyhippo.sources.bucket import source_path

    return iter_source(source_path(settings), settings.max_file_bytes)


def ingest_documents(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> DocumentsResult:
    """Read the source; unreadable files are reported and skipped, and their earlier version is kept. With
    `only` (a run over some document partitions) or in mode "add", the other documents keep their rows as they are.
    An empty source is an error that rolls the run back, so a wrong or emptied path cannot wipe the namespace."""
    from lazyhippo.stages.incremental import write_inputs

    ns = settings.namespace
    p = {"ns": ns, "all": only is None, "add": settings.mode == "add",
         "only": pa.table({"doc_id": pa.array(sorted(only or ()), pa.string())})}
    with transaction(con):  # the temporary tables go with it: dropped at its end, or rolled back
        con.execute("CREATE OR REPLACE TEMP TABLE lh_indexed AS SELECT doc_id, content_hash, source, title, kind, n_chars, "
                    "md5(sections) AS body FROM documents WHERE namespace = $ns", {"ns": ns})
        con.execute("CREATE OR REPLACE TEMP TABLE lh_read (doc_id VARCHAR PRIMARY KEY, content_hash VARCHAR, "
                    "skipped BOOLEAN, wanted BOOLEAN)")
        errors = _write_source(con, p, read_namespace_source(settings))
        if not con.execute("SELECT count(*) FROM lh_read").fetchall()[0][0] and not errors:
            raise ValueError(f"source {settings.source} holds no readable file: nothing indexed and nothing removed "
                             "(removing every document of a namespace is an explicit delete)")
        counts = _remove_unread(con, p, {e.file for e in errors})
        write_inputs(con, ns, "documents", {"source": str(settings.source)})  # what `drop_vanished` may compare with
        err_rows = [{"source": e.source, "reason": e.reason} for e in errors]
        replace_rows(con, "document_errors", ns, with_namespace(pa.Table.from_pylist(err_rows), ns) if err_rows else None)
        con.execute("; ".join(f"DROP TABLE temp.{t}" for t in _TEMP))
    return DocumentsResult(errors=errors, **counts)


def _write_source(con: duckdb.DuckDBPyConnection, p: dict, items: Iterator[Document | ReadError]) -> list[ReadError]:
    """Write the documents `items` yields in bounded batches; the read errors."""
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
            _write_batch(con, p, batch)
            batch, chars = {}, 0
    _write_batch(con, p, batch)
    return errors


def _write_batch(con: duckdb.DuckDBPyConnection, p: dict, batch: dict[str, dict]) -> None:
    """Write the documents of `batch` that are new or changed. One deleted earlier with the same content is
    skipped; the others are wanted (with `only`, those in it). An id read again in this run replaces what its
    earlier reading wrote (the last one wins)."""
    if not batch:
        return
    # read by their variable names (DuckDB's replacement scan): a view registered inside the transaction would
    # keep every batch alive until it ends
    lh_batch = pa.Table.from_pylist(list(batch.values()), _SCHEMA)  # noqa: F841
    lh_only = p["only"]  # noqa: F841
    lh_plan = con.sql("""
        SELECT doc_id, content_hash, skipped, again, NOT skipped AND in_only AS wanted, same_row FROM (
            SELECT b.doc_id, b.content_hash, coalesce(b.content_hash = x.content_hash, false) AS skipped,
                   r.doc_id IS NOT NULL AS again, $all OR b.doc_id IN (SELECT doc_id FROM lh_only) AS in_only,
                   r.doc_id IS NULL AND i.doc_id IS NOT NULL
                     AND (b.content_hash, b.source, b.title, b.kind, b.n_chars, md5(b.sections))
                         IS NOT DISTINCT FROM (i.content_hash, i.source, i.title, i.kind, i.n_chars, i.body) AS same_row
            FROM lh_batch b
            LEFT JOIN lh_read r ON r.doc_id = b.doc_id
            LEFT JOIN lh_indexed i ON i.doc_id = b.doc_id
            LEFT JOIN (SELECT doc_id, content_hash FROM deleted_documents WHERE namespace = $ns) x ON x.doc_id = b.doc_id)""",
                      params={k: p[k] for k in ("ns", "all")}).to_arrow_table()  # noqa: F841
    con.execute("DELETE FROM documents WHERE namespace = ? AND doc_id IN (SELECT doc_id FROM lh_plan "
                "WHERE (wanted AND NOT same_row) OR (again AND skipped))", [p["ns"]])
    cols = ", ".join(_COLUMNS)
    con.execute(f"INSERT INTO documents (namespace, {cols}) SELECT ?, {cols} FROM lh_batch "
                "WHERE doc_id IN (SELECT doc_id FROM lh_plan WHERE wanted AND NOT same_row)", [p["ns"]])
    con.execute("INSERT OR REPLACE INTO lh_read SELECT doc_id, content_hash, skipped, wanted FROM lh_plan")


def _remove_unread(con: duckdb.DuckDBPyConnection, p: dict, failed_files: set[str]) -> dict[str, int]:
    """Once the whole source is written: remove the indexed documents neither read again nor kept, and forget
    the deletions whose document changed or vanished (it comes back when its content changes or it reappears).
    An indexed document not wanted is kept when outside `only`, in mode "add", or when it came from a file that
    failed (the file itself, or a JSONL row `file#id`: matched by prefix, so a ':' or '#' in a file name cannot
    detach a document from its file). The counts of the DocumentsResult."""
    # read by their variable names (DuckDB's replacement scan)
    lh_failed_files = pa.table({"file": pa.array(sorted(failed_files), pa.string())})  # noqa: F841
    lh_only = p["only"]  # noqa: F841
    con.execute("""CREATE OR REPLACE TEMP TABLE lh_document_plan AS
        SELECT doc_id, wanted, NOT wanted AND ((NOT $all AND doc_id NOT IN (SELECT doc_id FROM lh_only)) OR $add
                   OR source IN (SELECT file FROM lh_failed_files)
                   OR EXISTS (SELECT 1 FROM lh_failed_files f WHERE starts_with(source, f.file || '#'))) AS kept
        FROM (SELECT i.doc_id, i.source, coalesce(r.wanted, false) AS wanted FROM lh_indexed i LEFT JOIN lh_read r USING (doc_id))""",
                {k: p[k] for k in ("all", "add")})
    ns = p["ns"]
    con.execute("DELETE FROM documents WHERE namespace = ? AND doc_id IN "
                "(SELECT doc_id FROM lh_document_plan WHERE NOT wanted AND NOT kept)", [ns])
    con.execute("DELETE FROM deleted_documents WHERE namespace = ? AND doc_id NOT IN (SELECT doc_id FROM lh_read WHERE skipped)", [ns])
    (wanted, changed, skipped), = con.execute(
        "SELECT count(*) FILTER (r.wanted), count(*) FILTER (r.wanted AND r.content_hash IS DISTINCT FROM i.content_hash), "
        "count(*) FILTER (r.skipped) FROM lh_read r LEFT JOIN lh_indexed i USING (doc_id)").fetchall()
    (kept, removed), = con.execute("SELECT count(*) FILTER (kept), count(*) FILTER (NOT wanted AND NOT kept) "
                                   "FROM lh_document_plan").fetchall()
    return {"documents": wanted + kept, "changed": changed, "removed": removed, "kept_after_error": kept,
            "skipped_deleted": skipped}


def iter_documents(con: duckdb.DuckDBPyConnection, namespace: str) -> Iterator[list[Document]]:
    """The namespace's documents in id order, in batches of at most BATCH_DOCUMENTS documents and BATCH_CHARS
    characters before the last one: one batch in memory at a time. Each batch is one query over a range of ids,
    so the caller may write on `con` between batches."""
    # each document weighs its characters, at least BATCH_CHARS / BATCH_DOCUMENTS: a batch is the documents whose
    # running weight before them falls in one multiple of BATCH_CHARS
    ranges = con.execute("""
        SELECT min(doc_id), max(doc_id) FROM (
            SELECT doc_id, (sum(weight) OVER (ORDER BY doc_id) - weight) // $c AS batch
            FROM (SELECT doc_id, greatest(coalesce(n_chars, 0), $c // $n) AS weight FROM documents WHERE namespace = $ns))
        GROUP BY batch ORDER BY 1""", {"ns": namespace, "n": BATCH_DOCUMENTS, "c": BATCH_CHARS}).fetchall()
    for low, high in ranges:
        rows = con.execute("SELECT doc_id, source, title, kind, content_hash, sections FROM documents "
                           "WHERE namespace = ? AND doc_id BETWEEN ? AND ? ORDER BY doc_id", [namespace, low, high]).fetchall()
        yield [Document(doc_id, source, title, kind, tuple(Section(**s) for s in json.loads(sections)), h)
               for doc_id, source, title, kind, h, sections in rows]
