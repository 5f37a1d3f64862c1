import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import AFTER_DOCUMENTS, WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS, preview
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, automation_condition=AFTER_DOCUMENTS, deps=["embeddings"], group_name="graph", kinds=store_kinds("duckdb", "faiss", graph=True), owners=OWNERS,
          description="SEMANTICALLY_SIMILAR edges: top-k cosine neighbours per entity above a cutoff.")
def knn_edges(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with lazyhippo.warehouse() as con:
        stats = run_stage("knn_edges", settings, con, graph_store.store)
        rows = preview(con, "SELECT a.name, b.name, round(k.score, 3) FROM knn_edges k "
                       "JOIN entities a ON a.namespace = k.namespace AND a.entity_id = k.source_id "
                       "JOIN entities b ON b.namespace = k.namespace AND b.entity_id = k.target_id "
                       "WHERE k.namespace = ? ORDER BY k.score DESC, 1, 2 LIMIT 15", [settings.namespace],
                       ["entity", "similar to", "cosine"])
    return dg.MaterializeResult(metadata={**stats.figures(), "dagster/row_count": stats.edges,
                                          "graph_store": graph_store.resolved_kind, "most_similar": rows})
