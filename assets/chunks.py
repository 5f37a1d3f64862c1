import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets.documents import PER_DOCUMENT, run_documents
from lazyhippo_dagster.assets.metadata import per_partition, preview
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource


@dg.asset(**PER_DOCUMENT, deps=["documents"], kinds={"duckdb", "neo4j"},
          description="Token-aware chunks (tiktoken) with citation metadata.")
def chunks(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    only = run_documents(context)
    with lazyhippo.warehouse() as con:
        stats = run_stage("chunks", settings, con, graph_store.store, only=only)
        rows = preview(con, "SELECT chunk_id, title, section, position, n_tokens, text FROM chunks WHERE namespace = ? "
                       "AND doc_id IN (SELECT unnest(?)) ORDER BY doc_id, position LIMIT 15", [settings.namespace, sorted(only)],
                       ["chunk_id", "title", "section", "pos", "tokens", "text"])
    return dg.MaterializeResult(metadata=per_partition(len(only), {
        **stats.figures(), "dagster/row_count": stats.chunks, "chunk_size": settings.chunk_size,
        "chunk_overlap": settings.chunk_overlap, "preview": rows}))
