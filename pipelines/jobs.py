import dagster as dg

from lazyhippo_dagster.assets.checks_quality import context_quality_check, retrieval_quality_check, theme_coverage_check
from lazyhippo_dagster.executors import index_executor

WRITER_TAGS = {"lazyhippo/writer": "warehouse"}  # the run queue starts one writing run at a time (runner.INSTANCE_CONFIG)

# one run per namespace: read, chunk and extract what changed, then the graph, checks, exports and the snapshot.
# Multiprocess unless configured otherwise, so extraction batches run in parallel (the warehouse steps one at a
# time, by their op tag); `lazyhippo index` runs it in-process unless given --workers; in a cluster, Celery
index_job = dg.define_asset_job(
    "index", selection=dg.AssetSelection.groups("per_document", "graph", "exports"),
    executor_def=index_executor(dg.multi_or_in_process_executor), tags=WRITER_TAGS,
    description="Bring a namespace (its partition) up to date with its source: the documents added or changed "
                "(by content hash) are read, chunked and extracted, removed ones dropped, then the graph, its checks, "
                "the Parquet exports and the published snapshot.",
)

index_graph_job = dg.define_asset_job(
    "index_graph", selection=dg.AssetSelection.groups("graph", "exports"),
    executor_def=index_executor(dg.in_process_executor), tags=WRITER_TAGS,
    description="Bring the namespace's graph up to date with the documents it holds (documents whose file "
                "vanished are dropped), with every asset check: the nightly audit.",
)

# the query-quality checks read questions beside the source, which a rebuild does not know: the audit runs alone
rebuild_graph_job = dg.define_asset_job(
    "rebuild_graph", executor_def=index_executor(dg.in_process_executor), tags=WRITER_TAGS,
    selection=dg.AssetSelection.groups("graph", "exports")
    - dg.AssetSelection.checks(context_quality_check, theme_coverage_check, retrieval_quality_check),
    description="Rebuild the graph-wide assets (entities onward) from the per-document tables: after `lazyhippo delete`.",
)
