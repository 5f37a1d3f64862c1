"""Read a namespace's source before a run: what changed since the last look (the source sensor, the nightly
schedule), and whether it yields anything at all (the CLI refuses a source with no readable document)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from lazyhippo.sources.bucket import bucket_source, open_bucket, scan_bucket
from lazyhippo.sources.changes import SourceChange, SourceState, scan_source
from lazyhippo.sources.files import Document, iter_files, read_path, read_source
from lazyhippo.stores.objects import ObjectStoreError
from lazyhippo_dagster.assets._partitions import namespaces
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


def add_namespace_partition(instance: dg.DagsterInstance, namespace: str) -> None:
    if not instance.has_dynamic_partition(namespaces.name, namespace):
        instance.add_dynamic_partitions(namespaces.name, [namespace])


def check_source(settings) -> None:
    """NothingToIndex, naming each file, when the namespace holds nothing yet and its source yields no document."""
    from lazyhippo.sources.changes import indexed_state

    if bucket_source(settings.source) is not None or indexed_state(settings).files:
        return
    source = Path(settings.source).resolve()
    root = source.parent if source.is_file() else source
    for path in iter_files(source):  # the first readable document is enough
        if any(isinstance(item, Document) for item in read_path(path, root, settings.max_file_bytes)):
            return
    raise NothingToIndex(_unreadable(settings))


def _unreadable(settings, shown: int = 10) -> str:
    """Why a source yields no document: one line per file (the first `shown`), as the documents asset reports."""
    head = "no readable document, nothing to index"  # one short first line, with no server path in it
    if bucket_source(settings.source) is not None:
        return head
    errors = read_source(Path(settings.source), settings.max_file_bytes)[1]
    lines = [f"  {e.source}: {e.reason}" for e in errors[:shown]]
    more = [f"  ... and {len(errors) - shown} more"] if len(errors) > shown else []
    return "\n".join([f"{head} ({len(errors)} file(s) failed):", *lines, *more])
