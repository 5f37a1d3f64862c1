"""Reindex when documents under the source change: the engine (lazyhippo.changes) diffs the folder against the
cursor, file stats first and content hashes of the files that moved; the run key names the change."""

from pathlib import Path

import dagster as dg
import duckdb

from assets._partitions import namespaces
from lazyhippo.changes import SourceState, indexed_state, scan_source
from resources import LazyhippoResource

from .jobs import index_job


@dg.sensor(job=index_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Index the documents added or changed under the source, and drop the removed ones.")
def source_changed(context: dg.SensorEvaluationContext, lazyhippo: LazyhippoResource):
    settings = lazyhippo.settings()
    source = Path(settings.source)  # the folder the index job reads, from the same settings
    if not source.exists():
        return dg.SkipReason(f"source {source} does not exist")
    previous = SourceState.decode(context.cursor)
    if previous is None:
        try:
            previous = indexed_state(settings)
        except duckdb.Error as exc:
            return dg.SkipReason(f"the index of namespace {settings.namespace!r} is busy or unreadable, next tick retries ({exc})")
    state, change = scan_source(source, settings.max_file_bytes, previous)
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
        dynamic_partitions_requests=[namespaces.build_add_request([ns])],  # adding an existing one is a no-op
        cursor=state.encode())
