import dagster as dg

from lazyhippo.index import ingest_documents
from resources import GraphStoreResource, LazyhippoResource

from ._meta import md_table, preview, scalars
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, group_name="per_document", description="Documents read from the source folder, with stable ids and content hashes.")
def documents(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with graph_store.session() as store, lazyhippo.warehouse() as con:
        stats = ingest_documents(settings, con)
        store.sync(con, settings.namespace, "documents")
        table = preview(con, "SELECT doc_id, title, kind, source, n_chars FROM documents WHERE namespace = ? ORDER BY source LIMIT 20",
                        [settings.namespace], ["doc_id", "title", "kind", "source", "chars"])
    for err in stats["errors"]:
        context.log.warning(f"skipped {err.source}: {err.reason}")
    return dg.MaterializeResult(metadata={
        **scalars(stats), "dagster/row_count": stats["documents"], "namespace": settings.namespace,
        "source": settings.source, "skipped_files": len(stats["errors"]), "preview": table,
        "skipped": md_table([(e.source, e.reason) for e in stats["errors"]], ["file", "reason"]),
    })
