import dagster as dg

from lazyhippo.settings import environment
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS
from lazyhippo_dagster.resources import LazyhippoResource

# every graph-wide asset: the snapshot is taken once they all succeeded, never between two of them
GRAPH_ASSETS = ["entities", "relations", "mentions", "facts", "embeddings", "knn_edges", "communities",
                "community_summaries", "exports"]


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=GRAPH_ASSETS, group_name="exports",
          kinds={"duckdb"}, owners=OWNERS,
          description="The snapshot queries read (`published/<namespace>.duckdb`; with LAZYHIPPO_SNAPSHOTS also a new "
                      "version in the object store for `serve --snapshots` replicas): taken once per run, after "
                      "every other step succeeded, so readers never see a half-rebuilt graph. A failed run "
                      "publishes nothing.")
def published_snapshot(lazyhippo: LazyhippoResource) -> dg.MaterializeResult:
    path = lazyhippo.publish()
    snapshots = environment().snapshots
    return dg.MaterializeResult(metadata={"path": dg.MetadataValue.path(str(path)), "bytes": path.stat().st_size,
                                          **({"object_store": snapshots} if snapshots else {})})
