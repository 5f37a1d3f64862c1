import dagster as dg

from lazyhippo.index import run_stage
from resources import GraphStoreResource, LazyhippoResource

from ._partitions import WAREHOUSE_TAGS, namespaces, sync_document_partitions
from .metadata import OWNERS, preview, table


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, group_name="per_document", kinds={"duckdb", "neo4j"}, owners=OWNERS,
          description="Documents read from the source folder, with stable ids and content hashes.")
def documents(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with lazyhippo.warehouse() as con:
        stats = run_stage("documents", settings, con, graph_store.store)
        rows = preview(con, "SELECT doc_id, title, kind, source, n_chars FROM documents WHERE namespace = ? ORDER BY source LIMIT 20",
                       [settings.namespace], ["doc_id", "title", "kind", "source", "chars"])
        doc_ids = [r[0] for r in con.execute("SELECT doc_id FROM documents WHERE namespace = ?", [settings.namespace]).fetchall()]
    added, deleted = sync_document_partitions(context.instance, settings.namespace, doc_ids)  # the consistency pass too
    for err in stats.errors:
        context.log.warning(f"{err.source}: {err.reason}")
    return dg.MaterializeResult(metadata={
        **stats.figures(), "dagster/row_count": stats.documents, "namespace": settings.namespace,
        "source": settings.source, "input_problems": len(stats.errors), "preview": rows,
        "document_partitions_added": added, "document_partitions_deleted": deleted,
        "input_problems_list": table([(e.source, e.reason) for e in stats.errors],
                                     ["file or row", "problem (skipped or cut)"]),
    })
