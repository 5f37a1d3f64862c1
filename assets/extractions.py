import dagster as dg

from lazyhippo.index import run_stage
from resources import GraphStoreResource, LazyhippoResource, LLMResource

from .metadata import OWNERS, llm_usage, table


@dg.asset(deps=["chunks"], group_name="per_document", kinds={"duckdb", "spacy"}, owners=OWNERS,
          description="Entities, relations and facts per chunk; cached by (chunk hash, extractor, model, prompt version).")
def extractions(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource,
                graph_store: GraphStoreResource, llm: LLMResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    last = [0]

    def progress(stage: str, done: int, total: int) -> None:
        if done - last[0] >= 1000 or done == total:
            last[0] = done
            context.log.info(f"{stage}: {done}/{total} chunks extracted")

    with lazyhippo.warehouse() as con:
        stats = run_stage("extractions", settings, con, graph_store.store, progress=progress, run_id=context.run.run_id,
                          llm=llm.client(settings))
    for cid, reason in list(stats.failures.items())[:20]:
        context.log.warning(f"extraction failed for chunk {cid}: {reason}")
    return dg.MaterializeResult(metadata={
        **stats.figures(), "dagster/row_count": stats.raw_entities,
        "failed_chunks": table(list(stats.failures.items())[:50], ["chunk_id", "reason"]), **llm_usage(stats.llm_usage),
    })
