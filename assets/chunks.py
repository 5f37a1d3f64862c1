import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets.documents import IN_RUN, PER_DOCUMENT, run_documents
from lazyhippo_dagster.assets.metadata import PREVIEW_ROWS, by_document, md_table, per_document
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource


@dg.asset(**PER_DOCUMENT, deps=["documents"], kinds=store_kinds("duckdb", graph=True),
          description="Token-aware chunks (tiktoken) with citation metadata.")
def chunks(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.MaterializeResult:
    settings = lazyhippo.settings()
    keys = run_documents(context, lazyhippo)
    only = sorted(set(keys.values()))
    with lazyhippo.warehouse() as con:
        stats = run_stage("chunks", settings, con, graph_store.store, only=frozenset(only))
        counts = dict(con.execute(f"SELECT doc_id, count(*) FROM chunks WHERE {IN_RUN} GROUP BY doc_id",
                                  [settings.namespace, only]).fetchall())
        rows = by_document(con, f"SELECT doc_id, position, section, n_tokens, left(text, 120) FROM chunks WHERE {IN_RUN} "
                           f"QUALIFY row_number() OVER (PARTITION BY doc_id ORDER BY position) <= {PREVIEW_ROWS} "
                           "ORDER BY doc_id, position", [settings.namespace, only])
    context.log.info(f"chunks of {len(keys)} documents: {stats.figures()}")
    per_document(context, keys, lambda d: {"dagster/row_count": counts.get(d, 0),
                                           "preview": md_table(rows.get(d, []), ["pos", "section", "tokens", "text"])})
    return dg.MaterializeResult(metadata={"chunk_size": settings.chunk_size, "chunk_overlap": settings.chunk_overlap})
