"""One partitions definition: `namespaces`, dynamic, one partition per knowledge base.

Every asset is partitioned by it, so one knowledge base's runs, checks and history never mix with another's;
LazyhippoResource reads the run's partition key as its namespace. Documents are not partitions: a namespace
holds up to hundreds of thousands of them, past what Dagster's partitions are built for, and the engine's
content hashes and stage inputs already decide which documents a run reads, chunks and extracts again. Each
run's `documents` materialization lists the documents it added, changed, removed and failed to read."""

from __future__ import annotations

import dagster as dg

namespaces = dg.DynamicPartitionsDefinition(name="namespaces")

# steps that open the DuckDB warehouse: one at a time within a run (the multiprocess executor's
# tag_concurrency_limits), while the extraction batches, which only touch the object store, run side by side;
# on Celery they go to the `warehouse` queue, which the one worker holding the warehouse serves
WAREHOUSE_TAG = "lazyhippo/warehouse"
WAREHOUSE_TAGS = {WAREHOUSE_TAG: "1", "dagster-celery/queue": "warehouse"}
# every run the product launches names its namespace: a cluster's run queue runs one at a time per namespace
NAMESPACE_TAG = "lazyhippo/namespace"
PARTITION_TAG = "dagster/partition"


def namespace_tags(namespace: str) -> dict[str, str]:
    """Tags of a run over one namespace: its partition, and the namespace the run queue limits by."""
    return {PARTITION_TAG: namespace, NAMESPACE_TAG: namespace}
