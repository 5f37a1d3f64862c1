"""The nightly consistency pass: `nightly_reindex` re-reads every file and indexes what the source sensor missed,
then `nightly_audit` brings the graph up to date (dropping vanished documents) and runs the blocking audit."""

import dagster as dg

from lazyhippo.sources.changes import indexed_state
from lazyhippo_dagster.assets._partitions import NAMESPACE_TAG, namespaces
from lazyhippo_dagster.jobs import index_documents_job, index_graph_job
from lazyhippo_dagster.resources import LazyhippoResource
from lazyhippo_dagster.sensors import change_plan, scan


def _indexed(context: dg.ScheduleEvaluationContext, namespace: str) -> bool:
    return context.instance.has_dynamic_partition(namespaces.name, namespace)


@dg.schedule(job=index_documents_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Nightly: every file of the source is read again and compared by content hash with what the "
                         "namespace holds, so a change the sensor missed (a failed run, a file edited with its mtime kept) "
                         "is indexed; unchanged chunks hit the extraction cache.")
def nightly_reindex(context: dg.ScheduleEvaluationContext, lazyhippo: LazyhippoResource):
    settings = lazyhippo.settings()
    if not _indexed(context, settings.namespace):
        return dg.SkipReason(f"namespace {settings.namespace!r} is not indexed yet (index it, or turn the source sensor on)")
    scanned = scan(settings, indexed_state(settings))  # no file stats: every file is hashed again
    if isinstance(scanned, str):
        return dg.SkipReason(scanned)
    state, change = scanned
    if not (change.added or change.changed):
        return dg.SkipReason(f"every document as indexed ({len(change.removed)} removed: nightly_audit drops them)")
    requests, run = change_plan(context.instance, settings.namespace, state, change)
    for request in requests:  # a schedule cannot return partition requests: applied here, before its run
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            context.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        else:
            for key in request.partition_keys:
                context.instance.delete_dynamic_partition(request.partitions_def_name, key)
    return dg.RunRequest(tags={**run.tags, "lazyhippo/pass": "consistency"})


@dg.schedule(job=index_graph_job, cron_schedule="30 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Nightly, after nightly_reindex: the namespace's graph brought up to date (documents whose file "
                         "vanished are dropped) and the blocking completeness audit run.")
def nightly_audit(context: dg.ScheduleEvaluationContext, lazyhippo: LazyhippoResource):
    namespace = lazyhippo.settings().namespace
    if not _indexed(context, namespace):
        return dg.SkipReason(f"namespace {namespace!r} is not indexed yet (index it, or turn the source sensor on)")
    return dg.RunRequest(partition_key=namespace, tags={"lazyhippo/pass": "consistency", NAMESPACE_TAG: namespace})
