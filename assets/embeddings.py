import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["chunks", "entities", "facts"], group_name="graph", kinds={"duckdb", "numpy"}, owners=OWNERS,
          description="Chunk, entity and fact vectors; only new or changed items are embedded again.")
def embeddings(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    with lazyhippo.warehouse() as con:
        stats = run_stage("embeddings", lazyhippo.settings(), con, graph_store.store)
    return dg.MaterializeResult(metadata={**stats.figures(), "dagster/row_count": stats.chunks + stats.entities + stats.facts})
