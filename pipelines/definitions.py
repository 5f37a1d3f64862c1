"""The one place where assets, checks, jobs, sensors, schedules and resources are put together."""

import dagster as dg

from lazyhippo_dagster import assets
from lazyhippo_dagster.interrupts import restore_interrupts
from lazyhippo_dagster.jobs import index_graph_job, index_job, rebuild_graph_job
from lazyhippo_dagster.query_job import query
from lazyhippo_dagster.resources import default_resources
from lazyhippo_dagster.schedules import nightly_audit, nightly_reindex
from lazyhippo_dagster.executors import index_executor
from lazyhippo_dagster.sensors import graph_after_documents, remove_step_outputs, source_changed

restore_interrupts()  # run workers of a `dagster dev` started in the background

all_assets = dg.load_assets_from_package_module(assets)
all_checks = dg.load_asset_checks_from_package_module(assets)

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    jobs=[index_job, index_graph_job, rebuild_graph_job, query],
    sensors=[source_changed, graph_after_documents, remove_step_outputs],
    schedules=[nightly_reindex, nightly_audit],
    resources=default_resources(),
    executor=index_executor(dg.in_process_executor),  # the runs the asset catalog launches
)


def index_job_def() -> dg.JobDefinition:
    """The resolved index job, importable by path: the multiprocess executor re-imports it in every worker."""
    return defs.resolve_job_def("index")
