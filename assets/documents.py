"""`documents` and `chunks`: one step reads the namespace's source and chunks what changed. The engine's content
hashes decide which documents are read into rows and chunked again (the rest keep theirs), so a run costs
Dagster the same few events for ten documents or a hundred thousand; what changed is in the metadata."""

import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS, PREVIEW_ROWS, preview
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource

PER_NAMESPACE = dict(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, group_name="per_document")
CHANGES_SHOWN = 500  # rows of a run's change table: the counts beside it are complete
WARNINGS_LOGGED = 20  # unreadable documents logged one by one (each is an event): the rest are in the table
CHANGE_ORDER = ("added", "changed", "removed", "failed")
_KINDS = store_kinds("duckdb", graph=True)


def _held(con, namespace: str) -> dict[str, tuple[str, str]]:
    """doc_id -> (source, content hash) of the namespace's documents."""
    return {d: (s, h) for d, s, h in con.execute(
        "SELECT doc_id, source, content_hash FROM documents WHERE namespace = ?", [namespace]).fetchall()}


def document_changes(before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]], errors,
                     chunks: dict[str, int]) -> list[tuple]:
    """(document, doc_id, change, chunks, problem) for every document a run added, changed or removed, and
    every file or row it could not read, in that order, then by document."""
    rows = [(after[d][0], d, "added", chunks.get(d, 0), None) for d in after.keys() - before.keys()]
    rows += [(after[d][0], d, "changed", chunks.get(d, 0), None) for d in after.keys() & before.keys()
             if after[d][1] != before[d][1]]
    rows += [(before[d][0], d, "removed", None, None) for d in before.keys() - after.keys()]
    rows += [(e.source, None, "failed", None, e.reason) for e in errors]
    return sorted(rows, key=lambda r: (CHANGE_ORDER.index(r[2]), r[0]))


def changes_metadata(rows: list[tuple]) -> dict:
    """Counts per kind of change (complete) and the first CHANGES_SHOWN rows as a typed table."""
    counts = {kind: sum(1 for r in rows if r[2] == kind) for kind in CHANGE_ORDER}
    shown = rows[:CHANGES_SHOWN]
    schema = dg.TableSchema(columns=[
        dg.TableColumn("document", "string", description="path under the source, or `file#row id`"),
        dg.TableColumn("doc_id", "string"), dg.TableColumn("change", "string", description=" | ".join(CHANGE_ORDER)),
        dg.TableColumn("chunks", "int", description="chunks of an added or changed document"),
        dg.TableColumn("problem", "string", description="why a file or row could not be read (skipped; its "
                                                        "earlier version is kept)")])
    records = [dg.TableRecord(dict(zip(("document", "doc_id", "change", "chunks", "problem"), r))) for r in shown]
    return {**{f"documents_{k}": v for k, v in counts.items()}, "changes_shown": len(shown),
            "changes": dg.MetadataValue.table(records, schema)}


@dg.multi_asset(
    name="documents", **PER_NAMESPACE,
    specs=[dg.AssetSpec("documents", kinds=_KINDS, owners=OWNERS,
                        description="Documents read from the namespace's source, with stable ids and content hashes; "
                                    "each run lists the documents it added, changed, removed or could not read."),
           dg.AssetSpec("chunks", deps=["documents"], kinds=_KINDS, owners=OWNERS,
                        description="Token-aware chunks (tiktoken) with citation metadata; only new or changed "
                                    "documents are chunked again.")])
def documents(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource):
    settings = lazyhippo.settings()
    ns = settings.namespace
    with lazyhippo.warehouse() as con:
        before = _held(con, ns)
        docs = run_stage("documents", settings, con, graph_store.store)
        after = _held(con, ns)
        chunked = run_stage("chunks", settings, con, graph_store.store)
        touched = sorted(d for d in after if after[d][1] != before.get(d, (None, None))[1])
        counts = dict(con.execute("SELECT doc_id, count(*) FROM chunks WHERE namespace = ? AND doc_id IN (SELECT unnest(?)) "
                                  "GROUP BY doc_id", [ns, touched]).fetchall())
        first = preview(con, "SELECT d.source, c.position, c.section, c.n_tokens, left(c.text, 120) FROM chunks c "
                        "JOIN documents d USING (namespace, doc_id) WHERE c.namespace = ? AND c.doc_id IN (SELECT unnest(?)) "
                        f"ORDER BY d.source, c.position LIMIT {PREVIEW_ROWS}", [ns, touched],
                        ["document", "pos", "section", "tokens", "text"])
    changes = document_changes(before, after, docs.errors, counts)
    for err in docs.errors[:WARNINGS_LOGGED]:
        context.log.warning(f"{err.source}: {err.reason}")
    if len(docs.errors) > WARNINGS_LOGGED:
        context.log.warning(f"... and {len(docs.errors) - WARNINGS_LOGGED} more files or rows could not be read "
                            "(`documents_failed` in the documents asset's metadata)")
    meta = changes_metadata(changes)
    context.log.info(f"{len(after)} documents: " + ", ".join(f"{meta[f'documents_{k}']} {k}" for k in CHANGE_ORDER))
    per_doc = list(counts.values())
    yield dg.MaterializeResult(asset_key="documents", metadata={
        "dagster/row_count": len(after), "namespace": ns, "source": settings.source, **meta,
        **({"chunks_per_changed_document_max": max(per_doc),
            "chunks_per_changed_document_mean": round(sum(per_doc) / len(per_doc), 2)} if per_doc else {})})
    yield dg.MaterializeResult(asset_key="chunks", metadata={
        **chunked.figures(), "dagster/row_count": chunked.chunks, "chunk_size": settings.chunk_size,
        "chunk_overlap": settings.chunk_overlap, "preview": first})
