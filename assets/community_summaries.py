import dagster as dg

from lazyhippo.index import build_community_summaries
from resources import GraphStoreResource, LazyhippoResource, LLMResource

from ._meta import llm_usage, md_table, scalars


@dg.asset(deps=["communities"], group_name="graph",
          description="Per community: title, summary and hub entities (extractive offline); with an LLM, GraphRAG-style reports (rating, cited findings, 3 questions). Embedded.")
def community_summaries(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource,
                        graph_store: GraphStoreResource, llm: LLMResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    with graph_store.session() as store, lazyhippo.warehouse() as con:
        stats = build_community_summaries(settings, con, context.run.run_id, llm.client(settings))
        store.sync(con, settings.namespace, "community_summaries")
    rows = [(p["community_id"], p["size"], p["title"], p["summary"]) for p in stats["preview"]]
    return dg.MaterializeResult(metadata={**scalars(stats), "dagster/row_count": stats["summaries"],
                                          "largest_communities": md_table(rows, ["community", "size", "title", "summary"]),
                                          **llm_usage(stats.get("llm_usage", []))})
