"""Two partitions definitions, both dynamic.

- `namespaces`: one per knowledge base. The graph-wide assets (entities onward) are partitioned by it, so one
  knowledge base's runs, checks and history never mix with another's; LazyhippoResource reads the run's
  partition key as its namespace.
- `documents`: one per document, `<namespace>/<name>`, the name being the document's path relative to the source
  or its JSONL row id (`document_name`), so a user finds a file by name in the partition picker and the catalog;
  a namespace has no `/`. The per-document assets
  (documents, chunks, extractions) are partitioned by it; a run covers a key range of one namespace.

A run over many partitions is one contiguous key range in the order the keys were added. So a change set is
staged to be one: unless its keys already are, the keys of changed documents are deleted and added again with
the new ones, which puts them together at the end (`partition_changes`); the sensor, the schedule and the CLI
all do this."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from lazyhippo.sources.bucket import bucket_source
from lazyhippo.sources.files import doc_id_for

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


NAME_MAX = 160  # characters of a document's name kept in its key
_HASHED = re.compile(r"~([0-9a-f]{16})$")  # a name cut or cleaned: the doc_id's hash makes it unique
_REFUSED = re.compile(r"\.\.\.|[\x00-\x1f]")  # what Dagster refuses in a partition key (and control characters)


def single_jsonl(settings) -> str | None:
    """The file name when the namespace's source is one JSONL file: its rows are named by their ids alone."""
    if bucket_source(settings.source) is not None:
        return None
    path = Path(settings.source)
    return path.name if path.suffix == ".jsonl" and path.is_file() else None


def document_name(source: str, single: str | None = None) -> str:
    """A document's partition name: its path relative to the source (`notes/harbor_lights.txt`), the row id of a
    JSONL row when the source is that one file, else `file.jsonl#id`. A name Dagster refuses or too long is cut
    and cleaned, with the doc_id's hash after `~` keeping it unique."""
    name = source[len(single) + 1:] if single and source.startswith(single + "#") else source
    clean = _REFUSED.sub("_", name)
    if clean == name and len(name) <= NAME_MAX and not _HASHED.search(name):
        return name
    return f"{clean[:NAME_MAX]}~{doc_id_for(source)[2:]}"


def document_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def document_keys(namespace: str, names) -> list[str]:
    return [document_key(namespace, n) for n in sorted(names)]


def source_keys(settings, sources) -> list[str]:
    """The partition keys of the documents with these sources in the namespace of `settings`."""
    single = single_jsonl(settings)
    return document_keys(settings.namespace, {document_name(s, single) for s in sources})


def split_keys(keys: list[str]) -> tuple[str, frozenset[str]]:
    """(namespace, document names) of a run's document partition keys; one namespace per run."""
    spaces = {k.split("/", 1)[0] for k in keys}
    if len(spaces) != 1:
        raise ValueError(f"a run over document partitions covers one namespace, this one spans {sorted(spaces) or 'none'}")
    return spaces.pop(), frozenset(k.split("/", 1)[1] for k in keys)


def key_doc_ids(keys: list[str], settings) -> dict[str, str]:
    """partition key -> doc_id, for a run over `keys` of the namespace of `settings` (whose source names them)."""
    single = single_jsonl(settings)

    def doc_id(name: str) -> str:
        hashed = _HASHED.search(name)
        return "d_" + hashed.group(1) if hashed else doc_id_for(f"{single}#{name}" if single else name)

    split_keys(keys)  # one namespace per run, else a clear error
    return {k: doc_id(k.split("/", 1)[1]) for k in keys}


def range_tags(keys: list[str]) -> dict[str, str]:
    """Run tags for one run over `keys` (contiguous in partition order, as `partition_changes` leaves them)."""
    return {RANGE_START: keys[0], RANGE_END: keys[-1], NAMESPACE_TAG: split_keys(keys)[0]}


def partition_changes(held: list[str], namespace: str, names, touched) -> tuple[list[str], list[str], list[str]]:
    """(keys to delete, keys to add in this order, keys to run in partition order) for a namespace whose source
    holds the documents `names`, of which `touched` were added or changed since the last run; `held` is every key in partition
    order. Keys of documents the source no longer holds go, keys missing for unchanged documents (a new Dagster
    instance) are added, and the touched ones must be one contiguous range: when they are not already (a single
    key always is, and so is a change staged twice), they are deleted and added again last."""
    prefix = document_key(namespace, "")
    position = {k: i for i, k in enumerate(held)}
    run = document_keys(namespace, touched)
    wanted = set(document_keys(namespace, names)) | set(run)
    stale = sorted(k for k in held if k.startswith(prefix) and k not in wanted)  # other namespaces' keys stay
    spots = sorted(position[k] for k in run if k in position)
    if len(spots) == len(run) and (not run or spots[-1] - spots[0] == len(run) - 1):
        missing = sorted(wanted - set(position))
        return stale, missing, sorted(run, key=position.__getitem__)
    missing = sorted(wanted - set(position) - set(run))
    return stale + sorted(k for k in run if k in position), missing + run, run


def apply_partition_changes(instance: dg.DagsterInstance, namespace: str, names, touched) -> list[str]:
    """`partition_changes` applied to the instance; the keys to run."""
    held = list(instance.get_dynamic_partitions(documents.name))
    delete, add, run = partition_changes(held, namespace, names, touched)
    for key in delete:
        instance.delete_dynamic_partition(documents.name, key)
    if add:
        instance.add_dynamic_partitions(documents.name, add)
    return run
