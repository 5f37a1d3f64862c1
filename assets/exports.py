import dagster as dg

from lazyhippo.index import export_parquet
from resources import LazyhippoResource, ObjectStoreResource

from ._meta import md_table
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["documents", "chunks", "entities", "relations", "mentions", "knn_edges", "communities", "community_summaries"],
          group_name="exports", description="Parquet files of every table, written through the object store.")
def exports(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, object_store: ObjectStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    store = object_store.open(settings)
    with lazyhippo.warehouse() as con:
        stats = export_parquet(settings, con, store, context.run.run_id)
    objs = stats["objects"]
    return dg.MaterializeResult(metadata={
        "store": stats["store"], "manifest": stats["run_key"], "dagster/row_count": sum(o["rows"] for o in objs.values()),
        "objects": md_table([(t, o["key"], o["rows"], o["bytes"]) for t, o in objs.items()], ["table", "key", "rows", "bytes"]),
    })
