"""The Dagster side of the runs the HTTP API and the MCP tool start: read back from the home's instance (the one
the CLI's runs and `dagster dev` use), recorded there when they end before their process executed them, and
canceled there. The server chooses each run's id; its `lazyhippo --run-id ID index | delete | merge` process
executes the Dagster run under that id (`cli._run`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from lazyhippo_dagster.assets._partitions import namespace_tags
from lazyhippo_dagster.runner import DocumentChange, failure_reason, instance_for

OPERATION_TAG = "lazyhippo/operation"        # index | delete | merge
MODE_TAG = "lazyhippo/mode"                  # an index run's replace | add
REMOVED_TAG = "lazyhippo/documents_removed"  # a delete run's documents (removed before its rebuild_graph run)
JOBS = {"index": "index", "delete": "rebuild_graph", "merge": "rebuild_graph"}  # the Dagster job of each operation
ENDED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
EVENTS = {dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.STEP_FAILURE,
          dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED,
          dg.DagsterEventType.RESOURCE_INIT_FAILURE}


@dataclass(frozen=True)
class RunRecord:
    """What the instance holds of one run: its status (a `DagsterRunStatus` name), tags, why it failed or was
    canceled, and the documents it added, changed, removed and failed to read."""

    status: str
    tags: dict[str, str]
    error: str | None
    documents: dict[str, int] | None

    @property
    def ended(self) -> bool:
        return self.status in {s.value for s in ENDED}


class ServedRuns:
    """The runs of one home's instance, by id."""

    def __init__(self, home: Path):
        self.home = home
        self._instance: dg.DagsterInstance | None = None

    @property
    def instance(self) -> dg.DagsterInstance:
        if self._instance is None:
            self._instance = instance_for(self.home)
        return self._instance

    def record(self, run_id: str) -> RunRecord | None:
        run = self.instance.get_run_by_id(run_id)
        if run is None:
            return None
        events = [e.dagster_event for e in self.instance.all_logs(run_id, of_type=EVENTS) if e.dagster_event]
        change = DocumentChange.of_events(events)
        if change is None and REMOVED_TAG in run.tags:
            change = DocumentChange(removed=int(run.tags[REMOVED_TAG]))
        failed = run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
        return RunRecord(run.status.value, dict(run.tags), failure_reason(events) if failed else None,
                         vars(change) if change else None)

    def cancel(self, run_id: str, operation: str, namespace: str, tags: dict[str, str], message: str) -> None:
        """Record the run CANCELED (created so, when its process never started it), unless it ended already."""
        self._end(run_id, operation, namespace, tags, dg.DagsterRunStatus.CANCELED, message)

    def canceling(self, run_id: str, message: str) -> None:
        """Mark a started run CANCELING while its process is being ended."""
        run = self.instance.get_run_by_id(run_id)
        if run is not None and run.status not in ENDED:
            self.instance.report_run_canceling(run, message)

    def fail(self, run_id: str, operation: str, namespace: str, tags: dict[str, str], message: str) -> None:
        """Record the run FAILURE (created so, when its process ended before starting it), unless it ended."""
        self._end(run_id, operation, namespace, tags, dg.DagsterRunStatus.FAILURE, message)

    def _end(self, run_id: str, operation: str, namespace: str, tags: dict[str, str], status: dg.DagsterRunStatus,
             message: str) -> None:
        run = self.instance.get_run_by_id(run_id)
        if run is None:
            record_unexecuted(self.instance, run_id, operation, namespace, tags, status, message)
        elif run.status not in ENDED:
            _report(self.instance, run, status, message)


def record_unexecuted(instance: dg.DagsterInstance, run_id: str, operation: str, namespace: str,
                      tags: dict[str, str], status: dg.DagsterRunStatus, message: str) -> None:
    """A run that ended before it executed (refused input, canceled while waiting) as a run of its job in the
    instance, FAILURE or CANCELED with `message`: the UI and the API show it like any other."""
    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.staging import add_namespace_partition

    add_namespace_partition(instance, namespace)
    job = defs.resolve_job_def(JOBS[operation])
    run = instance.create_run_for_job(job, run_id=run_id, status=dg.DagsterRunStatus.NOT_STARTED,
                                      tags={**job.run_tags, **tags, **namespace_tags(namespace), OPERATION_TAG: operation})
    _report(instance, run, status, message)


def _report(instance: dg.DagsterInstance, run: dg.DagsterRun, status: dg.DagsterRunStatus, message: str) -> None:
    if status == dg.DagsterRunStatus.CANCELED:
        instance.report_run_canceled(run, message)
    else:
        instance.report_run_failed(run, message)
