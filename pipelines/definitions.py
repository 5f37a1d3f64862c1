"""The one place where assets, checks, jobs, sensors, schedules and resources are put together."""

import dagster as dg

import assets
from resources import default_resources

from .jobs import index_job, query, rebuild_graph_job
from .schedules import nightly_reindex
from .sensors import source_changed

all_assets = dg.load_assets_from_package_module(assets)
all_checks = dg.load_asset_checks_from_package_module(assets)

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    jobs=[index_job, rebuild_graph_job, query],
    sensors=[source_changed],
    schedules=[nightly_reindex],
    resources=default_resources(),
    executor=dg.in_process_executor,
)


def index_job_def() -> dg.JobDefinition:
    """The resolved index job, importable by path: the multiprocess executor re-imports it in every worker."""
    return defs.resolve_job_def("index")
