import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS, table
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["relations", "knn_edges"], group_name="graph", kinds=store_kinds("duckdb", "igraph", graph=True), owners=OWNERS,
          description="Leiden/Louvain communities over relations + KNN edges; every entity gets a community_id and a PageRank.")
def communities(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with lazyhippo.warehouse() as con:
        stats = run_stage("communities", settings, con, graph_store.store)
    return dg.MaterializeResult(metadata={
        **stats.figures(), "dagster/row_count": stats.communities, "graph_store": graph_store.resolved_kind,
        "size_distribution": table([(f"{k}+" if k == 50 else str(k), v) for k, v in stats.size_distribution.items()],
                                   ["size", "communities"]),
    })
