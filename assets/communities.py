import dagster as dg

from lazyhippo.index import build_communities
from resources import GraphStoreResource, LazyhippoResource

from ._meta import md_table, scalars
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["relations", "knn_edges"], group_name="graph",
          description="Leiden/Louvain communities over relations + KNN edges; every entity gets a community_id and a PageRank.")
def communities(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with graph_store.session() as store, lazyhippo.warehouse() as con:
        stats = build_communities(settings, con, store)
        store.sync(con, settings.namespace, "communities")
    dist = stats["size_distribution"]
    return dg.MaterializeResult(metadata={
        **scalars(stats), "dagster/row_count": stats["communities"], "graph_store": graph_store.kind,
        "size_distribution": md_table([(f"{k}+" if k == 50 else k, v) for k, v in dist.items()], ["size", "communities"]),
    })
