import dagster as dg

from lazyhippo.index import build_knn_edges
from resources import GraphStoreResource, LazyhippoResource

from ._meta import preview, scalars
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["embeddings"], group_name="graph",
          description="SEMANTICALLY_SIMILAR edges: top-k cosine neighbours per entity above a cutoff.")
def knn_edges(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with graph_store.session() as store, lazyhippo.warehouse() as con:
        stats = build_knn_edges(settings, con, store)
        store.sync(con, settings.namespace, "knn_edges")
        table = preview(con, "SELECT a.name, b.name, round(k.score, 3) FROM knn_edges k "
                        "JOIN entities a ON a.namespace = k.namespace AND a.entity_id = k.source_id "
                        "JOIN entities b ON b.namespace = k.namespace AND b.entity_id = k.target_id "
                        "WHERE k.namespace = ? ORDER BY k.score DESC, 1, 2 LIMIT 15", [settings.namespace],
                        ["entity", "similar to", "cosine"])
    return dg.MaterializeResult(metadata={**scalars(stats), "dagster/row_count": stats["edges"],
                                          "graph_store": graph_store.kind, "most_similar": table})
