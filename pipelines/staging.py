"""Compare a namespace's source with what it holds and stage its document partitions: shared by the CLI's runs,
the source sensor (as requests) and the `reindex` job (in its step)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from lazyhippo.sources.bucket import bucket_source, open_bucket, scan_bucket
from lazyhippo.sources.changes import SourceChange, SourceState, indexed_state, scan_source
from lazyhippo.sources.files import read_source
from lazyhippo.stores.objects import ObjectStoreError
from lazyhippo_dagster.assets._partitions import apply_partition_changes, document_name, namespaces, single_jsonl
from lazyhippo_dagster.options import NothingToIndex


def scan(settings, previous: SourceState) -> tuple[SourceState, SourceChange] | str:
    """The source's new state and change, or why it cannot be read now."""
    bucket = bucket_source(settings.source)  # the folder or bucket prefix the index job reads, same settings
    if bucket is None:
        source = Path(settings.source)
        return scan_source(source, settings.max_file_bytes, previous) if source.exists() else f"source {source} does not exist"
    try:
        return scan_bucket(open_bucket(bucket[0]), bucket[1], settings.max_file_bytes, previous)
    except ObjectStoreError as exc:
        return f"source {settings.source} cannot be listed, next tick retries ({exc})"


def change_names(settings, state: SourceState, change: SourceChange) -> tuple[set[str], set[str]]:
    """(partition names of every document of the source, of the added and changed ones)."""
    single = single_jsonl(settings)
    held = {document_name(s, single) for f in state.files.values() for s in f.docs}
    return held, {document_name(s, single) for s in {**change.added, **change.changed}}


def add_namespace_partition(instance: dg.DagsterInstance, namespace: str) -> None:
    if not instance.has_dynamic_partition(namespaces.name, namespace):
        instance.add_dynamic_partitions(namespaces.name, [namespace])


def stage_documents(instance: dg.DagsterInstance, settings) -> tuple[list[str], SourceChange]:
    """Compare the source with what the namespace holds (content hashes) and stage the document partitions:
    the keys of the added and changed documents, one contiguous range for one run; and the change itself."""
    previous = indexed_state(settings)
    scanned = scan(settings, previous)
    if isinstance(scanned, str):
        raise ValueError(scanned)
    if not previous.files and not any(f.docs for f in scanned[0].files.values()):
        raise NothingToIndex(_unreadable(settings))
    add_namespace_partition(instance, settings.namespace)
    return apply_partition_changes(instance, settings.namespace, *change_names(settings, *scanned)), scanned[1]


def _unreadable(settings, shown: int = 10) -> str:
    """Why a source yields no document: one line per file (the first `shown`), as the documents asset reports."""
    head = "no readable document, nothing to index"  # one short first line, with no server path in it
    if bucket_source(settings.source) is not None:
        return head
    errors = read_source(Path(settings.source), settings.max_file_bytes)[1]
    lines = [f"  {e.source}: {e.reason}" for e in errors[:shown]]
    more = [f"  ... and {len(errors) - shown} more"] if len(errors) > shown else []
    return "\n".join([f"{head} ({len(errors)} file(s) failed):", *lines, *more])
