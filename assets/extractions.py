import dagster as dg

from lazyhippo.index import run_extractions
from resources import LazyhippoResource

from ._meta import md_table, scalars
from ._partitions import namespaces


@dg.asset(partitions_def=namespaces, deps=["chunks"], group_name="per_document",
          description="Entities, relations and facts per chunk; cached by (chunk hash, extractor, model, prompt version).")
def extractions(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    last = [0]

    def progress(stage: str, done: int, total: int) -> None:
        if done - last[0] >= 1000 or done == total:
            last[0] = done
            context.log.info(f"{stage}: {done}/{total} chunks extracted")

    with lazyhippo.warehouse() as con:
        stats = run_extractions(settings, con, progress=progress, run_id=context.run.run_id)
    for cid, reason in list(stats["failures"].items())[:20]:
        context.log.warning(f"extraction failed for chunk {cid}: {reason}")
    return dg.MaterializeResult(metadata={
        **scalars(stats), "dagster/row_count": stats["raw_entities"],
        "failed_chunks": md_table(list(stats["failures"].items())[:50], ["chunk_id", "reason"]),
    })
