"""The `documents` asset: read the source (all of it, or some files) into the documents table, skipping
documents deleted earlier with unchanged content and reporting what cannot be read."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from lazyhippo.settings import Settings
from lazyhippo.sources.files import Document, Section, iter_source
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.results import DocumentsResult
from lazyhippo.stores.warehouse import drop_temp, insert_rows, replace_rows, transaction


DOCUMENT_BATCH = 500  # documents read and staged at a time: the corpus's text is never held whole
_COLS = ("doc_id", "source", "title", "kind", "content_hash", "n_chars", "sections")


def _stage_source(settings: Settings, con: duckdb.DuckDBPyConnection) -> list:
    """Read the source into the temporary table `lh_ingest` (one row per document id: the last one read, at the
    place of the first), DOCUMENT_BATCH documents at a time; its read errors are returned."""
    from lazyhippo.sources.bucket import source_path

    con.execute("CREATE OR REPLACE TEMP TABLE lh_ingest (seq BIGINT, doc_id VARCHAR, source VARCHAR, title VARCHAR, "
                "kind VARCHAR, content_hash VARCHAR, n_chars BIGINT, sections VARCHAR)")
    errors, batch, seq = [], [], 0

    def flush() -> None:
        insert_rows(con, "lh_ingest", pa.Table.from_pylist(batch))
        batch.clear()

    for item in iter_source(source_path(settings), settings.max_file_bytes):
        if not isinstance(item, Document):
            errors.append(item)
            continue
        batch.append({"seq": seq, "doc_id": item.doc_id, "source": item.source, "title": item.title, "kind": item.kind,
                      "content_hash": item.content_hash, "n_chars": len(item.text),
                      "sections": json.dumps([s.__dict__ for s in item.sections])})
        seq += 1
        if len(batch) >= DOCUMENT_BATCH:
            flush()
    if batch:
        flush()
    con.execute(f"""CREATE OR REPLACE TEMP TABLE lh_ingest AS SELECT {', '.join(_COLS)} FROM lh_ingest
                    QUALIFY row_number() OVER (PARTITION BY doc_id ORDER BY seq DESC) = 1
                    ORDER BY min(seq) OVER (PARTITION BY doc_id)""")
    return errors


def ingest_documents(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> DocumentsResult:
    """Read the source; unreadable files are reported and skipped, and their earlier version is kept. With
    `only` (a run over some document partitions) or in mode "add", the other documents keep their rows as they are.
    The documents are staged in DuckDB batch by batch and compared there: Python holds ids, never the corpus."""
    from lazyhippo.stages.incremental import write_inputs

    ns = settings.namespace
    with transaction(con):
        errors = _stage_source(settings, con)
        if not errors and not con.execute("SELECT count(*) FROM lh_ingest").fetchone()[0]:
            # an empty source is an error, so a wrong or emptied path cannot wipe the namespace
            raise ValueError(f"source {settings.source} holds no readable file: nothing indexed and nothing removed "
                             "(removing every document of a namespace is an explicit delete)")
        skipped_deleted = skip_deleted(con, ns)
        if only is not None:
            con.execute("DELETE FROM lh_ingest WHERE doc_id NOT IN (SELECT unnest(?))", [sorted(only)])
        ids = {r[0] for r in con.execute("SELECT doc_id FROM lh_ingest").fetchall()}
        failed_files = {e.file for e in errors}
        previous = con.execute("SELECT doc_id, source FROM documents WHERE namespace = ?", [ns]).fetchall()
        kept = [d for d, source in previous if d not in ids
                and ((only is not None and d not in only) or settings.mode == "add" or _from_files(source, failed_files))]
        changed = con.execute("SELECT count(*) FROM lh_ingest i LEFT JOIN documents d ON d.namespace = ? AND "
                              "d.doc_id = i.doc_id WHERE d.content_hash IS DISTINCT FROM i.content_hash", [ns]).fetchone()[0]
        con.execute("DELETE FROM documents WHERE namespace = ? AND doc_id NOT IN (SELECT unnest(?))", [ns, kept])
        con.execute(f"INSERT INTO documents (namespace, {', '.join(_COLS)}) SELECT ?, * FROM lh_ingest", [ns])
        write_inputs(con, ns, "documents", {"source": str(settings.source)})  # what `drop_vanished` may compare with
        err_rows = [{"source": e.source, "reason": e.reason} for e in errors]
        replace_rows(con, "document_errors", ns, with_namespace(pa.Table.from_pylist(err_rows), ns) if err_rows else None)
    drop_temp(con, "lh_ingest")
    return DocumentsResult(documents=len(ids) + len(kept), errors=errors, changed=changed,
                           removed=len({d for d, _ in previous} - ids - set(kept)), kept_after_error=len(kept),
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


def skip_deleted(con: duckdb.DuckDBPyConnection, namespace: str) -> list[str]:
    """Drop staged documents (`lh_ingest`) deleted earlier with the same content; a changed or vanished document
    is forgotten as deleted (it comes back when its content changes or it reappears)."""
    if not con.execute("SELECT count(*) FROM deleted_documents WHERE namespace = ?", [namespace]).fetchone()[0]:
        return []
    skipped = sorted(r[0] for r in con.execute(
        "SELECT i.doc_id FROM lh_ingest i JOIN deleted_documents d ON d.namespace = ? AND d.doc_id = i.doc_id "
        "AND d.content_hash = i.content_hash", [namespace]).fetchall())
    con.execute("DELETE FROM lh_ingest WHERE doc_id IN (SELECT unnest(?))", [skipped])
    con.execute("DELETE FROM deleted_documents WHERE namespace = ? AND doc_id NOT IN (SELECT unnest(?))", [namespace, skipped])
    return skipped
