import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, key_doc_ids
from lazyhippo_dagster.assets._partitions import documents as document_partitions
from lazyhippo_dagster.assets.metadata import OWNERS, by_document, md_table, per_document
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource

PER_DOCUMENT = dict(partitions_def=document_partitions, backfill_policy=dg.BackfillPolicy.single_run(),
                    op_tags=WAREHOUSE_TAGS, group_name="per_document", owners=OWNERS)
IN_RUN = "namespace = ? AND doc_id IN (SELECT unnest(?))"  # the run's documents


def run_documents(context, lazyhippo: LazyhippoResource) -> dict[str, str]:
    """partition key -> doc_id of the run's document partitions (one namespace: the resource's)."""
    return key_doc_ids(context.partition_keys, lazyhippo.settings())


@dg.asset(**PER_DOCUMENT, kinds=store_kinds("duckdb", graph=True),
          description="Documents read from the source folder, with stable ids and content hashes: one partition each.")
def documents(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    keys = run_documents(context, lazyhippo)
    only = sorted(set(keys.values()))
    with lazyhippo.warehouse() as con:
        stats = run_stage("documents", settings, con, graph_store.store, only=frozenset(only))
        read = by_document(con, f"SELECT doc_id, title, kind, source, n_chars FROM documents WHERE {IN_RUN}",
                           [settings.namespace, only])
    context.log.info(f"{len(read)} of {len(keys)} documents read: {stats.figures()}")
    for err in stats.errors:
        context.log.warning(f"{err.source}: {err.reason}")

    def values(doc_id: str) -> dict:
        found = read.get(doc_id, [])
        title, kind, source, chars = found[0] if found else (None, None, None, 0)
        problems = [(e.source, e.reason) for e in stats.errors if source and e.source in (source, source.split("#")[0])]
        return {"dagster/row_count": len(found), "doc_id": doc_id, "title": title or "(not read)", "kind": kind or "",
                "source": source or "", "chars": chars, "input_problems": len(problems),
                **({"input_problems_list": md_table(problems, ["file or row", "problem (skipped or cut)"])} if problems else {})}

    per_document(context, keys, values)
    return dg.MaterializeResult(metadata={"namespace": settings.namespace, "source": settings.source})
