"""Reindex when documents under the source change: the engine (lazyhippo.sources)
diffs the folder, or the MinIO/S3 bucket prefix (`s3://bucket/prefix`), against the cursor, file stats or object
etags first and content hashes of what moved; the run key names the change.

A change becomes document partitions (added ones added, changed ones moved to the end, removed ones deleted),
one `index_documents` run over the added and changed ones, and then, from `graph_after_documents`, one
`index_graph` run for the namespace; a change that only removes documents asks for the graph run directly."""

from pathlib import Path

import dagster as dg
import duckdb

from lazyhippo.sources.bucket import bucket_source, open_bucket, scan_bucket
from lazyhippo.sources.changes import SourceChange, SourceState, indexed_state, scan_source
from lazyhippo.stores.objects import ObjectStoreError
from lazyhippo_dagster.assets._partitions import NAMESPACE_TAG, RANGE_START, documents, namespaces, partition_changes, range_tags
from lazyhippo_dagster.jobs import index_documents_job, index_graph_job
from lazyhippo_dagster.resources import LazyhippoResource

LAUNCHER_RUNS_GRAPH = "lazyhippo/graph_by_launcher"  # a documents run whose launcher (the CLI, the API) runs the graph itself


def change_tags(change: SourceChange) -> dict[str, str]:
    return {"lazyhippo/change": change.summary(), "lazyhippo/added": str(len(change.added)),
            "lazyhippo/changed": str(len(change.changed)), "lazyhippo/removed": str(len(change.removed))}


def change_plan(instance: dg.DagsterInstance, namespace: str, state: SourceState, change: SourceChange):
    """(partition requests, run request) bringing the namespace up to date with `change`."""
    held = list(instance.get_dynamic_partitions(documents.name))
    doc_ids = {d for f in state.files.values() for d in f.docs}
    delete, add, run = partition_changes(held, namespace, doc_ids, {**change.added, **change.changed})
    requests = ([namespaces.build_add_request([namespace])]  # adding an existing namespace is a no-op
                + ([documents.build_delete_request(delete)] if delete else [])
                + ([documents.build_add_request(add)] if add else []))
    tags = change_tags(change)
    if run:
        return requests, dg.RunRequest(job_name=index_documents_job.name, run_key=state.run_key(change),
                                       tags={**tags, **range_tags(run)})
    return requests, dg.RunRequest(job_name=index_graph_job.name, run_key=state.run_key(change),
                                   partition_key=namespace, tags={**tags, NAMESPACE_TAG: namespace})


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


@dg.sensor(jobs=[index_documents_job, index_graph_job], minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="Index the documents added or changed under the source, and drop the removed ones.")
def source_changed(context: dg.SensorEvaluationContext, lazyhippo: LazyhippoResource):
    settings = lazyhippo.settings()
    previous = SourceState.decode(context.cursor)
    if previous is None:
        try:
            previous = indexed_state(settings)
        except duckdb.Error as exc:
            return dg.SkipReason(f"the index of namespace {settings.namespace!r} is busy or unreadable, next tick retries ({exc})")
    scanned = scan(settings, previous)
    if isinstance(scanned, str):
        return dg.SkipReason(scanned)
    state, change = scanned
    if change.empty:
        n_docs = sum(len(f.docs) for f in state.files.values())
        return dg.SensorResult(skip_reason=f"no change: {n_docs} documents in {len(state.files)} files as indexed",
                               cursor=state.encode())
    context.log.info(change.summary())
    requests, run = change_plan(context.instance, settings.namespace, state, change)
    return dg.SensorResult(run_requests=[run], dynamic_partitions_requests=requests, cursor=state.encode())


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[index_documents_job],
                      request_job=index_graph_job, default_status=dg.DefaultSensorStatus.RUNNING,
                      description="After a run over document partitions, bring the namespace's graph up to date once.")
def graph_after_documents(context: dg.RunStatusSensorContext):
    run = context.dagster_run
    if run.tags.get(LAUNCHER_RUNS_GRAPH):
        return dg.SkipReason(f"run {run.run_id} was launched by a caller that runs the graph itself")
    key = run.tags.get("dagster/partition") or run.tags[RANGE_START]
    namespace = key.split("/", 1)[0]
    return dg.RunRequest(run_key=f"graph-after-{run.run_id}", partition_key=namespace,
                         tags={"lazyhippo/after_run": run.run_id, "lazyhippo/change": run.tags.get("lazyhippo/change", ""),
                               NAMESPACE_TAG: namespace})
