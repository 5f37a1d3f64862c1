"""Reindex when documents under the source change: the engine (lazyhippo.changes, lazyhippo.bucket_source)
diffs the folder, or the MinIO/S3 bucket prefix (`s3://bucket/prefix`), against the cursor, file stats or object
etags first and content hashes of what moved; the run key names the change."""

from pathlib import Path

import dagster as dg
import duckdb

from assets._partitions import document_keys, documents, namespaces
from lazyhippo.bucket_source import bucket_source, open_bucket, scan_bucket
from lazyhippo.changes import SourceState, indexed_state, scan_source
from lazyhippo.objectstore import ObjectStoreError
from resources import LazyhippoResource

from .jobs import index_job


@dg.sensor(job=index_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Index the documents added or changed under the source, and drop the removed ones.")
def source_changed(context: dg.SensorEvaluationContext, lazyhippo: LazyhippoResource):
    settings = lazyhippo.settings()
    bucket = bucket_source(settings.source)  # the folder or bucket prefix the index job reads, same settings
    source = Path(settings.source)
    if bucket is None and not source.exists():
        return dg.SkipReason(f"source {source} does not exist")
    previous = SourceState.decode(context.cursor)
    if previous is None:
        try:
            previous = indexed_state(settings)
        except duckdb.Error as exc:
            return dg.SkipReason(f"the index of namespace {settings.namespace!r} is busy or unreadable, next tick retries ({exc})")
    if bucket is None:
        state, change = scan_source(source, settings.max_file_bytes, previous)
    else:
        try:
            state, change = scan_bucket(open_bucket(bucket[0]), bucket[1], settings.max_file_bytes, previous)
        except ObjectStoreError as exc:
            return dg.SkipReason(f"source {settings.source} cannot be listed, next tick retries ({exc})")
    if change.empty:
        n_docs = sum(len(f.docs) for f in state.files.values())
        return dg.SensorResult(skip_reason=f"no change: {n_docs} documents in {len(state.files)} files as indexed",
                               cursor=state.encode())
    context.log.info(change.summary())
    ns = settings.namespace
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=state.run_key(change), partition_key=ns, tags={
            "lazyhippo/change": change.summary(), "lazyhippo/added": str(len(change.added)),
            "lazyhippo/changed": str(len(change.changed)), "lazyhippo/removed": str(len(change.removed))})],
        # a document partition per added file's document, none left for a removed one (the run's documents
        # step reconciles them again); adding an existing namespace is a no-op
        dynamic_partitions_requests=[namespaces.build_add_request([ns])]
        + ([documents.build_add_request(document_keys(ns, change.added))] if change.added else [])
        + ([documents.build_delete_request(document_keys(ns, change.removed))] if change.removed else []),
        cursor=state.encode())
