"""Two partitions definitions, both dynamic.

- `namespaces`: one per knowledge base. The graph-wide assets (entities onward) are partitioned by it, so one
  knowledge base's runs, checks and history never mix with another's; LazyhippoResource reads the run's
  partition key as its namespace.
- `documents`: one per document, `<namespace>/<doc_id>` (a doc_id is a hash of the document's source path, so
  the key is stable and safe for any file name, and a namespace has no `/`). The per-document assets
  (documents, chunks, extractions) are partitioned by it; a run covers a key range of one namespace.

A run over many partitions is one contiguous key range in the order the keys were added. So a change set is
staged to be one: unless its keys already are, the keys of changed documents are deleted and added again with
the new ones, which puts them together at the end (`partition_changes`); the sensor, the schedule and the CLI
all do this."""

from __future__ import annotations

import dagster as dg

namespaces = dg.DynamicPartitionsDefinition(name="namespaces")
documents = dg.DynamicPartitionsDefinition(name="documents")

# steps that open the DuckDB warehouse: one at a time within a run (the multiprocess executor's
# tag_concurrency_limits), while the extraction batches, which only touch the object store, run side by side;
# on Celery they go to the `warehouse` queue, which the one worker holding the warehouse serves
WAREHOUSE_TAG = "lazyhippo/warehouse"
WAREHOUSE_TAGS = {WAREHOUSE_TAG: "1", "dagster-celery/queue": "warehouse"}
# every run the product launches names its namespace: a cluster's run queue runs one at a time per namespace
NAMESPACE_TAG = "lazyhippo/namespace"
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def on_documents(key: str) -> dg.AssetDep:
    """A graph-wide asset reads all of its namespace's documents: Dagster has no mapping from a `<namespace>/`
    key prefix to the namespace, so it sees every document partition as upstream."""
    return dg.AssetDep(key, partition_mapping=dg.AllPartitionMapping())


def document_key(namespace: str, doc_id: str) -> str:
    return f"{namespace}/{doc_id}"


def document_keys(namespace: str, doc_ids) -> list[str]:
    return [document_key(namespace, d) for d in sorted(doc_ids)]


def split_keys(keys: list[str]) -> tuple[str, frozenset[str]]:
    """(namespace, doc_ids) of a run's document partition keys; one namespace per run."""
    spaces = {k.split("/", 1)[0] for k in keys}
    if len(spaces) != 1:
        raise ValueError(f"a run over document partitions covers one namespace, this one spans {sorted(spaces) or 'none'}")
    return spaces.pop(), frozenset(k.split("/", 1)[1] for k in keys)


def range_tags(keys: list[str]) -> dict[str, str]:
    """Run tags for one run over `keys` (contiguous in partition order, as `partition_changes` leaves them)."""
    return {RANGE_START: keys[0], RANGE_END: keys[-1], NAMESPACE_TAG: split_keys(keys)[0]}


def partition_changes(held: list[str], namespace: str, doc_ids, touched) -> tuple[list[str], list[str], list[str]]:
    """(keys to delete, keys to add in this order, keys to run in partition order) for a namespace whose source
    holds `doc_ids`, of which `touched` were added or changed since the last run; `held` is every key in partition
    order. Keys of documents the source no longer holds go, keys missing for unchanged documents (a new Dagster
    instance) are added, and the touched ones must be one contiguous range: when they are not already (a single
    key always is, and so is a change staged twice), they are deleted and added again last."""
    prefix = document_key(namespace, "")
    position = {k: i for i, k in enumerate(held)}
    run = document_keys(namespace, touched)
    wanted = set(document_keys(namespace, doc_ids)) | set(run)
    stale = sorted(k for k in held if k.startswith(prefix) and k not in wanted)  # other namespaces' keys stay
    spots = sorted(position[k] for k in run if k in position)
    if len(spots) == len(run) and (not run or spots[-1] - spots[0] == len(run) - 1):
        missing = sorted(wanted - set(position))
        return stale, missing, sorted(run, key=position.__getitem__)
    missing = sorted(wanted - set(position) - set(run))
    return stale + sorted(k for k in run if k in position), missing + run, run


def apply_partition_changes(instance: dg.DagsterInstance, namespace: str, doc_ids, touched) -> list[str]:
    """`partition_changes` applied to the instance; the keys to run."""
    held = list(instance.get_dynamic_partitions(documents.name))
    delete, add, run = partition_changes(held, namespace, doc_ids, touched)
    for key in delete:
        instance.delete_dynamic_partition(documents.name, key)
    if add:
        instance.add_dynamic_partitions(documents.name, add)
    return run
