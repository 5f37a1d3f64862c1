"""Launch jobs in-process against the persistent Dagster instance, so CLI runs show in the UI."""

from __future__ import annotations

import functools
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import dagster as dg

from lazyhippo_dagster.assets._partitions import NAMESPACE_TAG, namespace_tags
from lazyhippo_dagster.resources import HOME_FILE
from lazyhippo_dagster.staging import add_namespace_partition, check_source


def instance_for(home: Path) -> dg.DagsterInstance:
    """DAGSTER_HOME defaults to <index home>/dagster: `dagster dev` started from the repo sees the same runs."""
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str((home / "dagster").resolve())))
    dagster_home.mkdir(parents=True, exist_ok=True)
    marker = dagster_home / HOME_FILE  # runs launched from the UI act on this home (resources.instance_home)
    if not marker.exists() and dagster_home.resolve() != (home / "dagster").resolve():
        marker.write_text(str(home.resolve()))
    config = dagster_home / "dagster.yaml"
    text = config.read_text() if config.exists() else ""
    if text.strip() == "" or (text.startswith(INSTANCE_CONFIG) and text != INSTANCE_CONFIG):  # new, or an older one of ours
        config.write_text(INSTANCE_CONFIG)  # Dagster's own storage: SQLite, its event log sharded by run
    if _KEPT is None:
        return dg.DagsterInstance.get()
    key = dagster_home.resolve()
    if key not in _KEPT:
        _KEPT[key] = dg.DagsterInstance.get()
    return _KEPT[key]


_KEPT: dict[Path, dg.DagsterInstance] | None = None  # with keep_instances: the instances opened, by DAGSTER_HOME


def keep_instances() -> None:
    """This process launches many runs (the query daemon): open each instance once, not once per run (opening
    one checks the migrations of its SQLite storage, a third of a small run's cost)."""
    global _KEPT
    if _KEPT is None:
        _KEPT = {}


# Offline by design: no usage statistics (nor the first-run notice about them). Runs launched from the UI: the
# daemon marks a run whose worker died as failed (run monitoring), and the queue starts one index run per home
# at a time (the CLI's in-process runs wait on the warehouse lock instead).
INSTANCE_CONFIG = """\
telemetry:
  enabled: false
run_monitoring:
  enabled: true
  poll_interval_seconds: 30
  max_resume_run_attempts: 0
concurrency:
  runs:
    tag_concurrency_limits:
      - key: lazyhippo/writer
        limit: 1
"""
STEP_EVENTS = {dg.DagsterEventType.STEP_START: "started", dg.DagsterEventType.STEP_SUCCESS: "done",
               dg.DagsterEventType.STEP_FAILURE: "failed", dg.DagsterEventType.STEP_SKIPPED: "skipped"}


def fail_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """CLI runs whose process is gone (kill -9) but still show STARTED: mark them failed, at the next launch."""
    from lazyhippo.stores.warehouse import process_alive

    dead = []
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING],
                                               tags={"lazyhippo/host": socket.gethostname()})):
        pid = int(run.tags.get("lazyhippo/pid", "0") or 0)
        if pid and not process_alive(pid, run.tags["lazyhippo/host"]):
            instance.report_run_failed(run, f"process {pid} that ran it is gone (killed?): marked failed at the next launch")
            dead.append(run.run_id)
    return dead


def _process_tags() -> dict[str, str]:
    """Which process runs an in-process run: `fail_dead_runs` checks it is still alive."""
    return {"lazyhippo/pid": str(os.getpid()), "lazyhippo/host": socket.gethostname()}


def run_config(resources: dict[str, dict], ops: dict | None = None) -> dict:
    cfg: dict = {"resources": {name: {"config": {k: v for k, v in values.items() if v is not None}}
                               for name, values in resources.items() if any(v is not None for v in values.values())},
                 "loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    if ops:
        cfg["ops"] = ops
    return cfg


@dataclass(frozen=True)
class DocumentChange:
    """What an index run did to the namespace's documents (its `documents` materialization's counts)."""

    added: int = 0
    changed: int = 0
    removed: int = 0
    failed: int = 0

    @classmethod
    def of_events(cls, events) -> "DocumentChange | None":
        """The counts of the run whose Dagster events these are (None: it materialized no `documents`)."""
        for event in events:
            if event.event_type != dg.DagsterEventType.ASSET_MATERIALIZATION:
                continue
            materialization = event.event_specific_data.materialization
            if materialization.asset_key == dg.AssetKey("documents"):
                return cls(**{k: materialization.metadata[f"documents_{k}"].value for k in cls.__dataclass_fields__})
        return None


def failure_reason(events) -> str | None:
    """Why a run stopped, from its first failure event (step or resource init): the innermost lazyhippo error
    of its cause chain (it names the endpoint, file or option), else the innermost cause; for a run failed or
    canceled from outside (no error), that event's message."""
    for event in events:
        error = getattr(event.event_specific_data, "error", None)
        if error is None:
            continue
        chain = [error]
        while chain[-1].cause is not None:  # Dagster wraps the exception that stopped the run
            chain.append(chain[-1].cause)
        ours = [e for e in chain if e.message.startswith("lazyhippo.")]
        return (ours[-1] if ours else chain[-1]).message.strip().split("\n")[0]
    ended = [e for e in events if e.event_type in (dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED)]
    return ended[-1].message if ended and ended[-1].message else None


@dataclass
class IndexRun:
    """The `index` run of one request, and the document changes it made."""

    result: object
    change: DocumentChange

    @property
    def success(self) -> bool:
        return self.result.success

    @property
    def run_id(self) -> str:
        return self.result.run_id

    @property
    def run_ids(self) -> list[str]:
        return [self.result.run_id]

    @property
    def dagster_run(self) -> dg.DagsterRun:
        return self.result.dagster_run

    @property
    def all_events(self) -> list:
        return self.result.all_events

    def get_asset_materialization_events(self) -> list:
        return self.result.get_asset_materialization_events()


def settings_of(config: dict, namespace: str | None):
    """The Settings a run with this run config will use (the resource's, filled the same way)."""
    from lazyhippo_dagster.resources import LazyhippoResource

    fields = config.get("resources", {}).get("lazyhippo", {}).get("config", {})
    return LazyhippoResource(**{**fields, **({"namespace": namespace} if namespace else {})}).settings()


def execute(job_name: str, home: Path, config: dict, on_step: Callable[[str, str], None] | None = None,
            tags: dict | None = None, namespace: str | None = None, workers: int = 1, run_id: str | None = None):
    """Run `job_name` on the `namespace` partition (`index`: see `index_run`); `on_step(step, state)` is called
    live as steps start and end. `run_id`: the id the run gets (the server's runs choose it up front)."""
    instance = instance_for(home)
    fail_dead_runs(instance)
    tags = {**(tags or {}), **_process_tags()}
    if job_name == "index":  # adds its namespace's partition itself
        return index_run(instance, home, config, tags, namespace, workers if workers > 1 else None, on_step, run_id)
    if namespace is not None:
        add_namespace_partition(instance, namespace)
        tags[NAMESPACE_TAG] = namespace
    job = job_def(job_name)
    return _watched(instance, tags, on_step, lambda: job.execute_in_process(
        run_config=config, instance=instance, tags=tags, raise_on_error=False, partition_key=namespace, run_id=run_id))


def job_def(job_name: str) -> dg.JobDefinition:
    """The resolved job; `query` alone with the resources, since importing every asset, check and sensor cost a
    query a tenth of its wall time."""
    if job_name == "query":
        return _query_job()
    from lazyhippo_dagster.definitions import defs

    return defs.resolve_job_def(job_name)


@functools.cache
def _query_job() -> dg.JobDefinition:
    """Built once per process (the query daemon runs many)."""
    from lazyhippo_dagster.query_job import query
    from lazyhippo_dagster.resources import default_resources

    return dg.Definitions(jobs=[query], resources=default_resources()).resolve_job_def("query")


def index_run(instance: dg.DagsterInstance, home: Path, config: dict, tags: dict, namespace: str | None,
              processes: int | None = None, on_step: Callable[[str, str], None] | None = None,
              run_id: str | None = None) -> IndexRun:
    """One `index` run of the namespace: the documents added or changed since the last run (by content hash) are
    read, chunked and extracted, then the graph. With `processes` it uses the multiprocess executor."""
    from lazyhippo_dagster.definitions import defs

    settings = settings_of(config, namespace)
    namespace = settings.namespace
    tags = {**tags, **namespace_tags(namespace)}
    check_source(settings)
    add_namespace_partition(instance, namespace)
    job = defs.resolve_job_def("index")
    result = _watched(instance, tags, on_step, lambda: (
        execute_parallel(home, config, processes, tags) if processes else
        job.execute_in_process(run_config=config, instance=instance, tags=tags, raise_on_error=False,
                               partition_key=namespace, run_id=run_id)))
    return IndexRun(result, DocumentChange.of_events(result.all_events) or DocumentChange())


def _watched(instance: dg.DagsterInstance, tags: dict, on_step: Callable[[str, str], None] | None,
             run: Callable[[], dg.ExecuteInProcessResult]):
    """`run()` in a thread while this one reports its steps to `on_step` as they start and end."""
    result: dict = {}

    def target() -> None:
        try:
            result["value"] = run()
        except BaseException as exc:  # surfaced in the calling thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    seen = {r.run_id for r in instance.get_runs(dg.RunsFilter(tags=tags))} if on_step else set()
    cursor: str | None = None
    while True:
        thread.join(0.5)
        run_ = next(iter(instance.get_runs(dg.RunsFilter(tags=tags), limit=1)), None) if on_step else None
        if run_ is not None and run_.run_id not in seen:
            conn = instance.get_records_for_run(run_.run_id, cursor=cursor, of_type=set(STEP_EVENTS))
            cursor = conn.cursor
            for rec in conn.records:
                event = rec.event_log_entry.dagster_event
                on_step(event.step_key, STEP_EVENTS[event.event_type])
        if not thread.is_alive():
            break
    if "error" in result:
        raise result["error"]
    value = result["value"]
    if value.success:  # no daemon follows a CLI run: its step outputs go here (sensors.remove_step_outputs otherwise)
        from lazyhippo_dagster.resources import ObjectStoreResource, remove_run_outputs

        store = value.dagster_run.run_config.get("resources", {}).get("object_store", {}).get("config", {})
        remove_run_outputs(instance, value.run_id, ObjectStoreResource(**store))
    return value


def execute_parallel(home: Path, config: dict, workers: int, tags: dict) -> dg.ExecuteJobResult:
    """Run the index job with the multiprocess executor (`workers` processes): extraction batches in parallel,
    the warehouse steps one at a time. `tags` name its namespace partition."""
    from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAG
    from lazyhippo_dagster.definitions import index_job_def

    instance = instance_for(home)
    # forkserver with the definitions preloaded: each step forks in milliseconds instead of importing everything
    cfg = {**config, "execution": {"config": {"multiprocess": {
        "max_concurrent": workers, "start_method": {"forkserver": {"preload_modules": ["lazyhippo_dagster.definitions", "lazyhippo_dagster.worker_preload"]}},
        "tag_concurrency_limits": [{"key": WAREHOUSE_TAG, "limit": 1}]}}}}
    with dg.execute_job(dg.reconstructable(index_job_def), instance, run_config=cfg, raise_on_error=False,
                        tags=tags) as result:
        return result
