"""Extractions fan out: at most a fixed number of mapped steps, even in chunks, over the out-of-date documents,
each writing per-document Parquet parts through the object store, so the multiprocess (or a Kubernetes/Celery)
executor extracts in parallel, no worker needs a file local to another (lazyhippo/parts.py), and a run records
the same few events for any corpus."""

import dagster as dg

from lazyhippo.stages.extractions import BATCH_CHUNKS, BATCHES, Batch, collect_parts, extract_batch, plan_batches
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS, figures, preview
from lazyhippo_dagster.resources import LazyhippoResource, ObjectStoreResource


class ExtractionBatchConfig(dg.Config):
    batches: int = BATCHES  # most mapped steps a run fans out to, whatever its documents: a few per worker
    batch_chunks: int = BATCH_CHUNKS  # chunks a step holds at a time, the fewest in a batch: smaller spreads wider


@dg.op(tags=WAREHOUSE_TAGS, ins={"start": dg.In(dg.Nothing)}, out=dg.DynamicOut(dict), description="Documents whose extraction is missing or stale, in batches (objects).")
def plan_extraction_batches(context: dg.OpExecutionContext, config: ExtractionBatchConfig,
                            lazyhippo: LazyhippoResource, object_store: ObjectStoreResource):
    if config.batches < 1 or config.batch_chunks < 1:
        raise dg.Failure(f"plan_extraction_batches: batches {config.batches}, batch_chunks {config.batch_chunks}: "
                         "need at least 1 each")
    settings = lazyhippo.settings()
    with lazyhippo.warehouse() as con:
        batches, figures = plan_batches(settings, con, object_store.open(settings), context.run_id,
                                        config.batches, config.batch_chunks)
    context.log.info(f"{figures['documents_to_extract']} of {figures['documents']} documents to extract "
                     f"in {figures['batches']} batches")
    for b in batches or [Batch((), "none", ())]:  # one (empty) step keeps the collect step running
        yield dg.DynamicOutput({"keys": list(b.keys), "name": b.name, "doc_ids": list(b.doc_ids)}, mapping_key=b.name)


@dg.op(description="Extract one batch; one Parquet part per document through the object store.")
def extract_documents(context: dg.OpExecutionContext, batch: dict, lazyhippo: LazyhippoResource,
                      object_store: ObjectStoreResource) -> dict:
    if not batch["keys"]:
        return {}
    settings = lazyhippo.settings()
    stats = extract_batch(settings, object_store.open(settings), batch["keys"])
    context.log.info(f"batch {batch['name']}: {stats['documents']} documents, {stats['computed']} chunks extracted, "
                     f"{stats['cached']} cached, {stats['parts_kept']} parts kept")
    return {**stats, "batch": batch}


FAILURES_SHOWN = 200  # rows of the failed-chunks table: the count beside it is complete


@dg.op(tags=WAREHOUSE_TAGS, out=dg.Out(dg.Nothing), description="Load the new parts into the warehouse's extracted_* tables.")
def load_extraction_parts(context: dg.OpExecutionContext, stats: list[dict], lazyhippo: LazyhippoResource,
                          object_store: ObjectStoreResource) -> None:
    settings = lazyhippo.settings()
    ns = [settings.namespace]
    batches = [Batch(tuple(s["batch"]["keys"]), s["batch"]["name"], tuple(s["batch"]["doc_ids"])) for s in stats if s]
    with lazyhippo.warehouse() as con:
        out = collect_parts(settings, con, object_store.open(settings), batches, stats, context.run_id)
        rows = con.execute("SELECT count(*) FROM extracted_entities WHERE namespace = ?", ns).fetchone()[0]
        failed = con.execute("SELECT count(*) FROM extraction_failures WHERE namespace = ?", ns).fetchone()[0]
        failures = preview(con, "SELECT d.source, c.position, f.reason FROM extraction_failures f "
                           "JOIN chunks c ON c.namespace = f.namespace AND c.chunk_id = f.chunk_id "
                           "JOIN documents d ON d.namespace = c.namespace AND d.doc_id = c.doc_id "
                           f"WHERE f.namespace = ? ORDER BY d.source, c.position LIMIT {FAILURES_SHOWN}", ns,
                           ["document", "chunk position", "reason"])
    context.log.info(f"extractions: {len(batches)} batches: {figures(out)}")  # each batch logged its own figures
    context.add_output_metadata({**figures(out), "dagster/row_count": rows, "batches": len(batches),  # the asset's
                                 "chunks_failed": failed, **({"failed_chunks": failures} if failed else {})})


@dg.graph_asset(partitions_def=namespaces, group_name="per_document", kinds=store_kinds("duckdb", "spacy", "parquet", objects=True), owners=OWNERS, ins={"chunks": dg.AssetIn(dagster_type=dg.Nothing)},
                description="Entities, relations and facts per chunk, extracted in at most a fixed number of parallel "
                            "batches; per-document parts in the object store; cached by (chunk hash, extractor, "
                            "model, prompt version).")
def extractions(chunks):
    return load_extraction_parts(plan_extraction_batches(start=chunks).map(extract_documents).collect())
