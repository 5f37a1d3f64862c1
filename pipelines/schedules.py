import dagster as dg

from assets._partitions import namespaces
from resources import LazyhippoResource

from .jobs import index_job


@dg.schedule(job=index_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Nightly consistency pass over the configured namespace: the whole source is read again, so a "
                         "change the sensor missed (a failed run, a file edited with its mtime kept) is indexed and a "
                         "vanished file's documents are dropped; unchanged chunks hit the extraction cache, and the "
                         "blocking completeness audit runs.")
def nightly_reindex(context: dg.ScheduleEvaluationContext, lazyhippo: LazyhippoResource):
    namespace = lazyhippo.settings().namespace
    if not context.instance.has_dynamic_partition(namespaces.name, namespace):
        return dg.SkipReason(f"namespace {namespace!r} is not indexed yet (index it, or turn the source sensor on)")
    return dg.RunRequest(partition_key=namespace, tags={"lazyhippo/pass": "consistency"})
