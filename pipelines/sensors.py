"""Keep every namespace of the home current, and the graph behind its documents.

`source_changed` watches the source each namespace was indexed from (a folder, or a MinIO/S3 bucket prefix
`s3://bucket/prefix`): the engine (lazyhippo.sources) diffs it against the cursor, file stats or object etags
first and content hashes of what moved; the run key names the namespace and the change. A change becomes
document partitions (added ones added, changed ones moved to the end, removed ones deleted), returned as
requests, and one `index_documents` run per namespace over the added and changed ones; a change that only
removes documents asks for the graph run directly. An evaluation only reads: a preview changes nothing.

`graph_after_documents` follows every successful run that materialized document partitions (the CLI's, a
sensor's, a backfill's, one launched from the asset catalog) with one `index_graph` run of its namespace;
`documents_after_staging` follows a `reindex` run (the nightly schedule's) with the documents run it staged;
`remove_step_outputs` removes what a successful run's steps handed each other through the object store."""

import dagster as dg
import duckdb

from lazyhippo.sources.changes import SourceChange, SourceState, indexed_state
from lazyhippo_dagster.assets._partitions import (NAMESPACE_TAG, RANGE_END, RANGE_START, documents, namespaces,
                                                  partition_changes, range_tags)
from lazyhippo_dagster.jobs import STAGED_END, STAGED_START, index_documents_job, index_graph_job, reindex_job
from lazyhippo_dagster.resources import LazyhippoResource, ObjectStoreResource, lazyhippo_config, remove_run_outputs
from lazyhippo_dagster.staging import change_names, scan

LAUNCHER_RUNS_GRAPH = "lazyhippo/graph_by_launcher"  # a documents run whose launcher (the CLI, the API) runs the graph itself
PER_DOCUMENT_ASSETS = {dg.AssetKey(k) for k in ("documents", "chunks", "extractions")}


def change_tags(namespace: str, change: SourceChange) -> dict[str, str]:
    return {NAMESPACE_TAG: namespace, "lazyhippo/change": change.summary(), "lazyhippo/added": str(len(change.added)),
            "lazyhippo/changed": str(len(change.changed)), "lazyhippo/removed": str(len(change.removed))}


def change_plan(instance: dg.DagsterInstance, settings, state: SourceState, change: SourceChange,
                run_config: dict | None = None):
    """(partition requests, run request with `run_config`) bringing the namespace of `settings` up to date with
    `change`."""
    namespace = settings.namespace
    held = list(instance.get_dynamic_partitions(documents.name))
    delete, add, run = partition_changes(held, namespace, *change_names(settings, state, change))
    requests = ([namespaces.build_add_request([namespace])]  # adding an existing namespace is a no-op
                + ([documents.build_delete_request(delete)] if delete else [])
                + ([documents.build_add_request(add)] if add else []))
    tags = change_tags(namespace, change)
    run_key = f"{namespace}-{state.run_key(change)}"
    if run:
        return requests, dg.RunRequest(job_name=index_documents_job.name, run_key=run_key, run_config=run_config,
                                       tags={**tags, **range_tags(run)})
    return requests, dg.RunRequest(job_name=index_graph_job.name, run_key=run_key, partition_key=namespace,
                                   run_config=run_config, tags=tags)


def _cursors(cursor: str | None) -> dict[str, str]:
    """The sensor's cursor: one source state per namespace, as `ns=state` lines."""
    return dict(line.split("=", 1) for line in (cursor or "").splitlines() if "=" in line)


@dg.sensor(jobs=[index_documents_job, index_graph_job], minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="For every namespace of the home: index the documents added or changed under its source, "
                       "and drop the removed ones (one run per namespace with a change).")
def source_changed(context: dg.SensorEvaluationContext, lazyhippo: LazyhippoResource):
    cursors = _cursors(context.cursor)
    runs, requests, reasons = [], [], []
    for settings in lazyhippo.watched(context.instance):
        ns = settings.namespace
        previous = SourceState.decode(cursors.get(ns))
        if previous is None:
            try:
                previous = indexed_state(settings)
            except duckdb.Error as exc:
                reasons.append(f"{ns}: the index is busy or unreadable, next tick retries ({exc})")
                continue
        scanned = scan(settings, previous)
        if isinstance(scanned, str):
            reasons.append(f"{ns}: {scanned}")
            continue
        state, change = scanned
        cursors[ns] = state.encode()
        if change.empty:
            n_docs = sum(len(f.docs) for f in state.files.values())
            reasons.append(f"{ns}: no change: {n_docs} documents in {len(state.files)} files as indexed")
            continue
        context.log.info(f"{ns}: {change.summary()}")
        partition_requests, run = change_plan(context.instance, settings, state, change, lazyhippo.run_config(settings))
        requests += partition_requests
        runs.append(run)
    cursor = "\n".join(f"{ns}={state}" for ns, state in sorted(cursors.items()))
    reason = "; ".join(reasons) or "no namespace indexed in this home yet"
    if not runs:
        return dg.SensorResult(skip_reason=reason, cursor=cursor)
    return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=requests, cursor=cursor)


def _same_settings(run: dg.DagsterRun) -> dict:
    """Run config giving a follow-up run the `lazyhippo` settings `run` was launched with (on a cluster, the
    only place its workers learn them)."""
    config = lazyhippo_config(run)
    return {"resources": {"lazyhippo": {"config": config}}} if config else {}


def _materialized_documents(run: dg.DagsterRun) -> str | None:
    """The namespace whose document partitions `run` materialized, or None."""
    if run.job_name != index_documents_job.name and not PER_DOCUMENT_ASSETS & set(run.asset_selection or ()):
        return None
    key = run.tags.get("dagster/partition") or run.tags.get(RANGE_START)
    return key.split("/", 1)[0] if key and "/" in key else None


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, request_job=index_graph_job,
                      default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=10,
                      description="After any run that materialized document partitions (a job, a sensor, a backfill, "
                                  "the asset catalog), bring the namespace's graph up to date once.")
def graph_after_documents(context: dg.RunStatusSensorContext):
    run = context.dagster_run
    namespace = _materialized_documents(run)
    if namespace is None:
        return dg.SkipReason(f"run {run.run_id} ({run.job_name}) materialized no document partition")
    if run.tags.get(LAUNCHER_RUNS_GRAPH):
        return dg.SkipReason(f"run {run.run_id} was launched by a caller that runs the graph itself")
    waiting = context.instance.get_runs(dg.RunsFilter(
        job_name=index_graph_job.name, tags={"dagster/partition": namespace},
        statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]), limit=1)
    if waiting:
        return dg.SkipReason(f"graph run {waiting[0].run_id} of {namespace!r} is already waiting to start")
    return dg.RunRequest(run_key=f"graph-after-{run.run_id}", partition_key=namespace, run_config=_same_settings(run),
                         tags={NAMESPACE_TAG: namespace, "lazyhippo/after_run": run.run_id,
                               "lazyhippo/change": run.tags.get("lazyhippo/change", "")})


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[reindex_job],
                      request_job=index_documents_job, default_status=dg.DefaultSensorStatus.RUNNING,
                      minimum_interval_seconds=10,
                      description="After a `reindex` run staged document partitions, index them (one run).")
def documents_after_staging(context: dg.RunStatusSensorContext):
    run = context.dagster_run
    if STAGED_START not in run.tags:
        return dg.SkipReason(f"run {run.run_id} found nothing added or changed")
    return dg.RunRequest(run_key=f"documents-after-{run.run_id}", run_config=_same_settings(run), tags={
        NAMESPACE_TAG: run.tags[NAMESPACE_TAG], "lazyhippo/after_run": run.run_id, "lazyhippo/pass": "consistency",
        RANGE_START: run.tags[STAGED_START], RANGE_END: run.tags[STAGED_END]})


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, default_status=dg.DefaultSensorStatus.RUNNING,
                      minimum_interval_seconds=10,
                      description="After any run succeeded, remove the step outputs it handed between its steps "
                                  "(`dagster/<run_id>/` in a shared object store, else the instance's pickles); a failed "
                                  "run keeps its own for its re-execution from failure (in a bucket, until its expiry rule).")
def remove_step_outputs(context: dg.RunStatusSensorContext, object_store: ObjectStoreResource):
    run_id = context.dagster_run.run_id
    removed = remove_run_outputs(context.instance, run_id, object_store)
    context.log.info(f"run {run_id}: {removed} step output(s) removed")
