import dagster as dg

index_job = dg.define_asset_job(
    "index", selection=dg.AssetSelection.all(), executor_def=dg.in_process_executor,
    description="Index the source into the knowledge graph: documents to communities to Parquet exports.",
)
