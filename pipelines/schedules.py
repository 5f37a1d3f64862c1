import dagster as dg

from .jobs import index_job

nightly_reindex = dg.ScheduleDefinition(
    name="nightly_reindex",
    job=index_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
    tags={"lazyhippo/pass": "consistency"},
    description="Nightly consistency pass: the whole source is read again, so a change the sensor missed (a failed "
                "run, a file edited with its mtime kept) is indexed and a vanished file's documents are dropped; "
                "unchanged chunks hit the extraction cache, and the blocking completeness audit runs.",
)
