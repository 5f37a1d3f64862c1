"""`lazyhippo bench partitions`: what one run over many document partitions costs Dagster on a local
(SQLite) instance like the one `lazyhippo index` uses, with assets that do nothing: the figure that keeps the
indexing assets partitioned by namespace (docs/scale-out.md, "Document partitions")."""

from __future__ import annotations

import tempfile
import time

import dagster as dg

ASSETS = 2            # probe assets partitioned by document
EVENTS_PER_PARTITION = 2  # a planned and a materialization event per asset and partition
INDEX_ASSETS = 3      # documents, chunks, extractions


def run_partition_bench(documents: int, project_documents: int) -> dict:
    """One run over a range of `documents` dynamic partitions of two no-op assets; the per-event cost, and what it
    projects for a full index of `project_documents` documents with three document-partitioned assets."""
    parts = dg.DynamicPartitionsDefinition(name="bench_documents")

    @dg.asset(partitions_def=parts)
    def probe_a() -> None:
        return None

    @dg.asset(partitions_def=parts, deps=[probe_a])
    def probe_b() -> None:
        return None

    keys = [f"bench/d_{i:08d}" for i in range(documents)]
    with tempfile.TemporaryDirectory() as tmp, dg.instance_for_test(temp_dir=tmp) as instance:
        instance.add_dynamic_partitions(parts.name, keys)
        t0 = time.perf_counter()
        result = dg.materialize([probe_a, probe_b], instance=instance, tags={
            "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
        seconds = time.perf_counter() - t0
        recorded = len(instance.get_materialized_partitions(probe_b.key))
    if not result.success or recorded != documents:
        raise RuntimeError(f"bench partitions run failed ({recorded} of {documents} partitions recorded)")
    events = documents * ASSETS * EVENTS_PER_PARTITION
    per_event = seconds / events
    return {"documents": documents, "seconds": round(seconds, 2), "events": events,
            "ms_per_event": round(per_event * 1000, 2), "project_documents": project_documents,
            "projected_index_event_seconds": round(per_event * project_documents * INDEX_ASSETS * EVENTS_PER_PARTITION, 1)}
