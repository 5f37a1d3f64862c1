"""Document lifecycle: delete documents and rebuild the graph from what remains.

The graph-wide tables are pure functions of the per-document tables (the SQL models read the cached
extractions), so removing a document's rows and re-running the graph stages gives exactly the graph a fresh
index of the remaining documents would: entities only it supported disappear, the others get their
descriptions, weights and degrees rebuilt from the remaining chunks, and no extractor or LLM is called.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from lazyhippo.settings import Settings
from lazyhippo.stores.graphs import GraphStore
from lazyhippo.stores.objects import ObjectStore
from lazyhippo.stores.warehouse import transaction

# per-document tables keyed by chunk, then by document (deleted in this order)
CHUNK_TABLES = ("extracted_entities", "extracted_relations", "extracted_facts", "extraction_failures")


class UnknownDocumentError(ValueError):
    """A document id (or source path) that the namespace does not hold."""


@dataclass(frozen=True)
class Deleted:
    doc_ids: tuple[str, ...]
    sources: tuple[str, ...]
    chunks: int

    def figures(self) -> dict:
        return {"documents": len(self.doc_ids), "chunks": self.chunks, "doc_ids": ", ".join(self.doc_ids)}


def resolve_documents(con: duckdb.DuckDBPyConnection, namespace: str, refs: list[str]) -> dict[str, tuple[str, str]]:
    """doc_id -> (source, content_hash) for refs naming a doc_id or a source path; unknown refs raise, naming them."""
    rows = con.execute("SELECT doc_id, source, content_hash FROM documents WHERE namespace = $1 "
                       "AND (doc_id IN (SELECT unnest($2)) OR source IN (SELECT unnest($2)))", [namespace, refs]).fetchall()
    found = {doc_id: (source, h) for doc_id, source, h in rows}
    missing = [r for r in refs if r not in found and r not in {s for s, _ in found.values()}]
    if missing:
        raise UnknownDocumentError(f"namespace {namespace!r} holds no document {', '.join(map(repr, missing))} "
                                   "(give a doc_id or a source path as listed in the documents table)")
    return found


def remove_documents(settings: Settings, con: duckdb.DuckDBPyConnection, refs: list[str],
                     store: GraphStore | None = None, objects: ObjectStore | None = None, remember: bool = True) -> Deleted:
    """Remove the documents, their chunks and extractions (and extraction parts) in one transaction, and
    remember them as deleted (a later ingest skips them while their content is unchanged) unless `remember` is
    off (a vanished file's documents come back when it does). The graph stages must run afterwards."""
    ns = settings.namespace
    found = resolve_documents(con, ns, list(dict.fromkeys(refs)))
    ids = sorted(found)
    with transaction(con):
        chunk_ids = [r[0] for r in con.execute("SELECT chunk_id FROM chunks WHERE namespace = ? AND doc_id IN (SELECT unnest(?))",
                                               [ns, ids]).fetchall()]
        for table in CHUNK_TABLES:
            con.execute(f"DELETE FROM {table} WHERE namespace = ? AND chunk_id IN (SELECT unnest(?))", [ns, chunk_ids])
        for table in ("chunks", "documents", "deleted_documents", "extraction_parts"):
            con.execute(f"DELETE FROM {table} WHERE namespace = ? AND doc_id IN (SELECT unnest(?))", [ns, ids])
        if remember:
            con.executemany("INSERT INTO deleted_documents (namespace, doc_id, source, content_hash) VALUES (?, ?, ?, ?)",
                            [(ns, d, *found[d]) for d in ids])
    if store is not None:
        for stage in ("documents", "chunks"):
            store.sync(con, ns, stage)
    if objects is not None:
        from lazyhippo.stages.extractions import part_key

        for doc_id in ids:
            objects.delete(part_key(ns, doc_id))
    return Deleted(tuple(ids), tuple(found[d][0] for d in ids), len(chunk_ids))


def drop_vanished(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore | None = None,
                  objects: ObjectStore | None = None) -> Deleted:
    """Remove the documents the source no longer yields (file gone, row removed), keeping those of files that
    cannot be read right now: what a run over document partitions leaves to the graph-wide run. By the run's
    mode: "add" drops nothing; "replace" makes the source the namespace's source (so a re-created knowledge base
    serves nothing its new source lacks); no mode drops only against the source the namespace was indexed from
    (a rebuild after a delete, configured without it, drops nothing)."""
    from lazyhippo.stages.incremental import fingerprint, read_inputs, write_inputs

    if settings.mode == "add":
        return Deleted((), (), 0)
    if settings.mode == "replace":
        write_inputs(con, settings.namespace, "documents", {"source": str(settings.source)})
    elif read_inputs(con, settings.namespace, "documents").get("source") != fingerprint(str(settings.source)):
        return Deleted((), (), 0)
    gone = _vanished(settings, con.execute("SELECT doc_id, source FROM documents WHERE namespace = ?",
                                           [settings.namespace]).fetchall())
    return remove_documents(settings, con, gone, store, objects, remember=False) if gone else Deleted((), (), 0)


def _vanished(settings: Settings, held: list[tuple[str, str]]) -> list[str]:
    """The held documents whose file is gone, or whose row a multi-document file (JSONL) no longer has. Only
    those files are read: a document that is a whole file is there while its file is (a PDF is never parsed)."""
    from lazyhippo.sources.bucket import source_path
    from lazyhippo.sources.files import ReadError, read_path, scan_source

    source = source_path(settings).resolve()
    root = source.parent if source.is_file() else source
    files = {p.relative_to(root).as_posix(): p for p in scan_source(source)[0]}
    if not files:  # an emptied folder must not wipe the namespace
        raise ValueError(f"source {settings.source} holds no file: nothing removed (removing every document of a "
                         "namespace is an explicit delete)")
    gone, rows = [], {}
    for doc_id, src in held:
        if src in files:
            continue
        owner = next((src[:i] for i, ch in enumerate(src) if ch == "#" and src[:i] in files), None)
        if owner is None:
            gone.append(doc_id)
        else:
            rows.setdefault(owner, []).append(doc_id)
    for rel, doc_ids in rows.items():
        items = list(read_path(files[rel], root, settings.max_file_bytes))
        if any(isinstance(i, ReadError) and i.source == rel for i in items):  # unreadable now: keep its rows
            continue
        present = {i.doc_id for i in items if not isinstance(i, ReadError)}
        gone += [d for d in doc_ids if d not in present]
    return gone


def delete_documents(settings: Settings, con: duckdb.DuckDBPyConnection, refs: list[str], store: GraphStore,
                     objects: ObjectStore, run_id: str = "delete") -> dict:
    """Library entry point: remove the documents, then rebuild every graph-wide stage (and its sync and exports)."""
    from lazyhippo.index import GRAPH_STAGES, run_stage

    deleted = remove_documents(settings, con, refs, store, objects)
    return {"deleted": deleted.figures(),
            **{stage: run_stage(stage, settings, con, store, objects, run_id=run_id) for stage in GRAPH_STAGES}}


def merge_entities(settings: Settings, con: duckdb.DuckDBPyConnection, sources: list[str], target: str,
                   strategy: str, store: GraphStore, objects: ObjectStore, run_id: str = "merge") -> dict:
    """Library entry point: record the merge, switch the served graph in one transaction (Neo4j), then rebuild
    every graph-wide stage, which folds the merge into the tables and resyncs."""
    from lazyhippo.index import GRAPH_STAGES, run_stage
    from lazyhippo.stages.merge import merge_on_neo4j, record_merge

    merge = record_merge(con, settings.namespace, sources, target, strategy, settings.llm != "none")
    served = merge_on_neo4j(store, settings.namespace, merge) if store.name == "neo4j" else {}
    return {"merge": merge, "served": served,
            **{stage: run_stage(stage, settings, con, store, objects, run_id=run_id) for stage in GRAPH_STAGES}}
