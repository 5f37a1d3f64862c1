import dagster as dg

from lazyhippo.index import build_chunks
from resources import GraphStoreResource, LazyhippoResource

from ._meta import preview, scalars
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["documents"], group_name="per_document", description="Token-aware chunks (tiktoken) with citation metadata.")
def chunks(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with graph_store.session() as store, lazyhippo.warehouse() as con:
        stats = build_chunks(settings, con)
        store.sync(con, settings.namespace, "chunks")
        table = preview(con, "SELECT chunk_id, title, section, position, n_tokens, text FROM chunks WHERE namespace = ? "
                        "ORDER BY doc_id, position LIMIT 15", [settings.namespace],
                        ["chunk_id", "title", "section", "pos", "tokens", "text"])
    return dg.MaterializeResult(metadata={**scalars(stats), "dagster/row_count": stats["chunks"],
                                          "chunk_size": settings.chunk_size, "chunk_overlap": settings.chunk_overlap,
                                          "preview": table})
