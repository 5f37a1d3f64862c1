import dagster as dg

from lazyhippo.index import run_stage
from resources import GraphStoreResource, LazyhippoResource

from ._partitions import WAREHOUSE_TAGS, namespaces
from .metadata import OWNERS, preview


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["documents"], group_name="per_document", kinds={"duckdb", "neo4j"}, owners=OWNERS,
          description="Token-aware chunks (tiktoken) with citation metadata.")
def chunks(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with lazyhippo.warehouse() as con:
        stats = run_stage("chunks", settings, con, graph_store.store)
        rows = preview(con, "SELECT chunk_id, title, section, position, n_tokens, text FROM chunks WHERE namespace = ? "
                       "ORDER BY doc_id, position LIMIT 15", [settings.namespace],
                       ["chunk_id", "title", "section", "pos", "tokens", "text"])
    return dg.MaterializeResult(metadata={**stats.figures(), "dagster/row_count": stats.chunks,
                                          "chunk_size": settings.chunk_size, "chunk_overlap": settings.chunk_overlap,
                                          "preview": rows})
