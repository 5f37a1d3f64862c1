import dagster as dg

from .jobs import index_job

nightly_reindex = dg.ScheduleDefinition(
    name="nightly_reindex",
    job=index_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Nightly full reindex; unchanged chunks hit the extraction cache, so it is cheap.",
)
