import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS, llm_usage, table
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource, LLMResource


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["communities"], group_name="graph", kinds=store_kinds("duckdb", graph=True), owners=OWNERS,
          description="Per community: title, summary and hub entities (extractive offline); with an LLM, GraphRAG-style reports\n(rating, cited findings, 3 questions). Embedded.")
def community_summaries(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource,
                        graph_store: GraphStoreResource, llm: LLMResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with lazyhippo.warehouse() as con:
        stats = run_stage("community_summaries", settings, con, graph_store.store, run_id=context.run.run_id,
                          llm=llm.client(settings))
    rows = [(p["community_id"], p["size"], p["title"], p["summary"]) for p in stats.preview]
    return dg.MaterializeResult(metadata={**stats.figures(), "dagster/row_count": stats.summaries,
                                          "largest_communities": table(rows, ["community", "size", "title", "summary"]),
                                          **llm_usage(stats.llm_usage)})
