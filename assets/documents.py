import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, split_keys
from lazyhippo_dagster.assets._partitions import documents as document_partitions
from lazyhippo_dagster.assets.metadata import OWNERS, per_partition, preview, table
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource

PER_DOCUMENT = dict(partitions_def=document_partitions, backfill_policy=dg.BackfillPolicy.single_run(),
                    op_tags=WAREHOUSE_TAGS, group_name="per_document", owners=OWNERS)


def run_documents(context: dg.AssetExecutionContext) -> frozenset[str]:
    """The doc_ids of the run's document partitions (one namespace: the resource's)."""
    return split_keys(context.partition_keys)[1]


@dg.asset(**PER_DOCUMENT, kinds={"duckdb", "neo4j"},
          description="Documents read from the source folder, with stable ids and content hashes: one partition each.")
def documents(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    only = run_documents(context)
    with lazyhippo.warehouse() as con:
        stats = run_stage("documents", settings, con, graph_store.store, only=only)
        rows = preview(con, "SELECT doc_id, title, kind, source, n_chars FROM documents WHERE namespace = ? "
                       "AND doc_id IN (SELECT unnest(?)) ORDER BY source LIMIT 20",
                       [settings.namespace, sorted(only)], ["doc_id", "title", "kind", "source", "chars"])
    for err in stats.errors:
        context.log.warning(f"{err.source}: {err.reason}")
    return dg.MaterializeResult(metadata=per_partition(len(only), {
        **stats.figures(), "dagster/row_count": stats.documents, "namespace": settings.namespace,
        "source": settings.source, "run_documents": len(only), "input_problems": len(stats.errors), "preview": rows,
        "input_problems_list": table([(e.source, e.reason) for e in stats.errors],
                                     ["file or row", "problem (skipped or cut)"]),
    }))
