"""Keep every namespace of the home current.

`source_changed` watches the source each namespace was indexed from (a folder, or a MinIO/S3 bucket prefix
`s3://bucket/prefix`): the engine (lazyhippo.sources) diffs it against the cursor, file stats or object etags
first and content hashes of what moved; the run key names the namespace and the change. A change becomes one
`index` run of its namespace (its partition), which reads again only the documents whose content changed and
drops the removed ones. An evaluation only reads: a preview changes nothing.

`graph_after_documents`: a namespace whose documents, chunks or extractions were materialized after its published
snapshot (from the asset catalog, a run that failed after them) and that no run is working on gets one
`index_graph` run; the run key and the cursor name the materialization it follows, so it is requested once. An
`index` run publishes after its documents, so it asks for nothing more. The comparison is of event-log storage
ids, which order events whatever the clocks and the daemon's timing.

`remove_step_outputs` removes what a successful run's steps handed each other through the object store."""

import dagster as dg
import duckdb

from lazyhippo.sources.changes import SourceChange, SourceState, indexed_state
from lazyhippo_dagster.assets._partitions import NAMESPACE_TAG, namespace_tags, namespaces
from lazyhippo_dagster.jobs import index_graph_job, index_job
from lazyhippo_dagster.resources import LazyhippoResource, ObjectStoreResource, remove_run_outputs
from lazyhippo_dagster.staging import scan


def change_tags(namespace: str, change: SourceChange) -> dict[str, str]:
    return {NAMESPACE_TAG: namespace, "lazyhippo/change": change.summary(), "lazyhippo/added": str(len(change.added)),
            "lazyhippo/changed": str(len(change.changed)), "lazyhippo/removed": str(len(change.removed))}


def change_request(settings, state: SourceState, change: SourceChange, run_config: dict | None = None) -> dg.RunRequest:
    """The `index` run bringing the namespace of `settings` up to date with `change`, with `run_config`."""
    namespace = settings.namespace
    return dg.RunRequest(job_name=index_job.name, run_key=f"{namespace}-{state.run_key(change)}", partition_key=namespace,
                         run_config=run_config, tags={**change_tags(namespace, change), **namespace_tags(namespace)})


def _cursors(cursor: str | None) -> dict[str, str]:
    """The sensor's cursor: one source state per namespace, as `ns=state` lines."""
    return dict(line.split("=", 1) for line in (cursor or "").splitlines() if "=" in line)


@dg.sensor(job=index_job, minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="For every namespace of the home: index the documents added or changed under its source, "
                       "and drop the removed ones (one run per namespace with a change).")
def source_changed(context: dg.SensorEvaluationContext, lazyhippo: LazyhippoResource):
    cursors = _cursors(context.cursor)
    runs, reasons = [], []
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
        runs.append(change_request(settings, state, change, lazyhippo.run_config(settings)))
    cursor = "\n".join(f"{ns}={state}" for ns, state in sorted(cursors.items()))
    reason = "; ".join(reasons) or "no namespace indexed in this home yet"
    if not runs:
        return dg.SensorResult(skip_reason=reason, cursor=cursor)
    new = sorted({r.partition_key for r in runs} - set(context.instance.get_dynamic_partitions(namespaces.name)))
    return dg.SensorResult(run_requests=runs, cursor=cursor,
                           dynamic_partitions_requests=[namespaces.build_add_request(new)] if new else [])


DOCUMENT_ASSETS = ("documents", "chunks", "extractions")
ACTIVE = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
          dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def _latest(instance: dg.DagsterInstance, asset: str, namespace: str) -> int:
    """The storage id of the asset's latest materialization in the namespace (0: none)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[namespace]), limit=1).records
    return records[0].storage_id if records else 0


@dg.sensor(job=index_graph_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="When a namespace's documents were materialized without its graph (the asset catalog, a run "
                       "that failed after them), bring its graph-wide assets up to date once.")
def graph_after_documents(context: dg.SensorEvaluationContext):
    handled = {ns: int(sid) for ns, sid in _cursors(context.cursor).items()}
    busy = {r.tags.get(NAMESPACE_TAG) for r in context.instance.get_runs(dg.RunsFilter(statuses=ACTIVE))}
    runs, reasons = [], []
    for ns in context.instance.get_dynamic_partitions(namespaces.name):
        documents = max(_latest(context.instance, a, ns) for a in DOCUMENT_ASSETS)
        if documents <= max(handled.get(ns, 0), _latest(context.instance, "published_snapshot", ns)):
            continue
        if ns in busy:
            reasons.append(f"{ns}: a run is in progress")
            continue
        handled[ns] = documents
        runs.append(dg.RunRequest(run_key=f"{ns}-graph-{documents}", partition_key=ns, tags=namespace_tags(ns)))
    cursor = "\n".join(f"{ns}={sid}" for ns, sid in sorted(handled.items()))
    if not runs:
        return dg.SensorResult(skip_reason="; ".join(reasons) or "every namespace's graph follows its documents",
                               cursor=cursor)
    return dg.SensorResult(run_requests=runs, cursor=cursor)


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, default_status=dg.DefaultSensorStatus.RUNNING,
                      minimum_interval_seconds=10,
                      description="After any run succeeded, remove the step outputs it handed between its steps "
                                  "(`dagster/<run_id>/` in a shared object store, else the instance's pickles); a failed "
                                  "run keeps its own for its re-execution from failure (in a bucket, until its expiry rule).")
def remove_step_outputs(context: dg.RunStatusSensorContext, object_store: ObjectStoreResource):
    run_id = context.dagster_run.run_id
    removed = remove_run_outputs(context.instance, run_id, object_store)
    context.log.info(f"run {run_id}: {removed} step output(s) removed")
