"""The nightly consistency pass over every namespace of the home: `nightly_reindex` re-reads every file and asks
for an `index` run where something the source sensor missed changed, then `nightly_audit` brings each graph up
to date (dropping vanished documents) and runs the blocking audit. An evaluation only reads: previewing a tick changes nothing. On a cluster
the namespaces and their settings come from the instance (`LazyhippoResource.watched`), and each run request
carries the settings as run config for the workers."""

import dagster as dg
import duckdb

from lazyhippo.sources.changes import indexed_state
from lazyhippo_dagster.assets._partitions import namespace_tags
from lazyhippo_dagster.jobs import index_graph_job, index_job
from lazyhippo_dagster.resources import LazyhippoResource
from lazyhippo_dagster.sensors import change_tags
from lazyhippo_dagster.staging import scan


def _tick(context: dg.ScheduleEvaluationContext) -> str:
    when = context.scheduled_execution_time
    return when.strftime("%Y%m%dT%H%M") if when else "now"


def _result(runs: list[dg.RunRequest], reasons: list[str]):
    return runs or dg.SkipReason("; ".join(reasons) or "no namespace indexed in this home yet")


@dg.schedule(job=index_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Nightly, for every namespace: every file of its source is read again and compared by content "
                         "hash with what the namespace holds, so a change the sensor missed (a failed run, a file edited "
                         "with its mtime kept) is indexed; unchanged chunks hit the extraction cache.")
def nightly_reindex(context: dg.ScheduleEvaluationContext, lazyhippo: LazyhippoResource):
    runs, reasons = [], []
    for settings in lazyhippo.watched(context.instance):
        ns = settings.namespace
        try:
            scanned = scan(settings, indexed_state(settings))  # no file stats: every file is hashed again
        except duckdb.Error as exc:
            scanned = f"the index is busy or unreadable ({exc})"
        if isinstance(scanned, str):
            reasons.append(f"{ns}: {scanned}")
            continue
        change = scanned[1]
        if not (change.added or change.changed):
            reasons.append(f"{ns}: every document as indexed ({len(change.removed)} removed: nightly_audit drops them)")
            continue
        runs.append(dg.RunRequest(run_key=f"reindex-{ns}-{_tick(context)}", partition_key=ns,
                                  run_config=lazyhippo.run_config(settings),
                                  tags={**change_tags(ns, change), **namespace_tags(ns), "lazyhippo/pass": "consistency"}))
    return _result(runs, reasons)


@dg.schedule(job=index_graph_job, cron_schedule="30 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Nightly, after nightly_reindex, for every namespace: its graph brought up to date (documents "
                         "whose file vanished are dropped) and the blocking completeness audit run.")
def nightly_audit(context: dg.ScheduleEvaluationContext, lazyhippo: LazyhippoResource):
    runs = [dg.RunRequest(run_key=f"audit-{s.namespace}-{_tick(context)}", partition_key=s.namespace,
                          run_config=lazyhippo.run_config(s),
                          tags={**namespace_tags(s.namespace), "lazyhippo/pass": "consistency"})
            for s in lazyhippo.watched(context.instance)]
    return _result(runs, [])
