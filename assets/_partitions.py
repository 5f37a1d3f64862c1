"""Every indexing asset is partitioned by namespace (a dynamic partition per knowledge base), so one knowledge
base's runs, checks and history never mix with another's. LazyhippoResource reads the run's partition key
as its namespace; the CLI, the sensor and the schedule add the partition before they launch a run.

Documents are listed as their own dynamic partitions too (`<namespace>/<doc_id>`; a doc_id is a hash of the
document's source path, so the key is stable and safe for any file name): the source sensor adds and deletes
them as files come and go, and every `documents` run (CLI, sensor, schedule, UI) reconciles them with the
namespace's documents. No asset is partitioned by them: docs/scale-out.md says why (one run record event per
document partition costs minutes at 6,000 documents on the embedded instance)."""

from __future__ import annotations

import dagster as dg

namespaces = dg.DynamicPartitionsDefinition(name="namespaces")
documents = dg.DynamicPartitionsDefinition(name="documents")

# steps that open the DuckDB warehouse: one at a time within a run (the multiprocess executor's
# tag_concurrency_limits), while the extraction batches, which only touch the object store, run side by side
WAREHOUSE_TAGS = {"lazyhippo/warehouse": "1"}


def document_key(namespace: str, doc_id: str) -> str:
    return f"{namespace}/{doc_id}"


def document_keys(namespace: str, doc_ids) -> list[str]:
    return [document_key(namespace, d) for d in sorted(doc_ids)]


def sync_document_partitions(instance: dg.DagsterInstance, namespace: str, doc_ids) -> tuple[int, int]:
    """Make the namespace's document partitions exactly `doc_ids`: (added, deleted)."""
    prefix = document_key(namespace, "")
    held = {k for k in instance.get_dynamic_partitions(documents.name) if k.startswith(prefix)}
    want = set(document_keys(namespace, doc_ids))
    new = sorted(want - held)
    if new:
        instance.add_dynamic_partitions(documents.name, new)
    gone = sorted(held - want)
    for key in gone:
        instance.delete_dynamic_partition(documents.name, key)
    return len(new), len(gone)
