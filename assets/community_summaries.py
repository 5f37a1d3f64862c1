import dagster as dg

from lazyhippo.index import build_community_summaries
from resources import GraphStoreResource, LazyhippoResource

from ._meta import md_table, scalars
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["communities"], group_name="graph",
          description="Per community: title, summary and hub entities (extractive offline, LLM when configured), embedded.")
def community_summaries(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource,
                        graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with graph_store.session() as store, lazyhippo.warehouse() as con:
        stats = build_community_summaries(settings, con, context.run.run_id)
        store.sync(con, settings.namespace, "community_summaries")
    rows = [(p["community_id"], p["size"], p["title"], p["summary"]) for p in stats["preview"]]
    return dg.MaterializeResult(metadata={**scalars(stats), "dagster/row_count": stats["summaries"],
                                          "largest_communities": md_table(rows, ["community", "size", "title", "summary"])})
