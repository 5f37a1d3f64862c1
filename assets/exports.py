import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS, table
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource, ObjectStoreResource


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["documents", "chunks", "entities", "relations", "mentions", "knn_edges", "communities", "community_summaries"],
          group_name="exports", kinds=store_kinds("parquet", objects=True), owners=OWNERS,
          description="Parquet files of every table, written through the object store.")
def exports(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource,
            object_store: ObjectStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with lazyhippo.warehouse() as con:
        stats = run_stage("exports", settings, con, graph_store.store, object_store.open(settings), run_id=context.run.run_id)
    objs = stats.objects
    return dg.MaterializeResult(metadata={
        "store": stats.store, "manifest": stats.run_key, "tables_written": len(stats.written),
        "dagster/row_count": sum(o["rows"] for o in objs.values()),
        "objects": table([(t, o["key"], o["rows"], o["bytes"]) for t, o in objs.items()], ["table", "key", "rows", "bytes"]),
    })
