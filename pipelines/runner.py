"""Launch jobs in-process against the persistent Dagster instance, so CLI runs show in the UI."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Callable

import dagster as dg


def instance_for(home: Path) -> dg.DagsterInstance:
    """DAGSTER_HOME defaults to <index home>/dagster: `dagster dev` started from the repo sees the same runs."""
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str((home / "dagster").resolve())))
    dagster_home.mkdir(parents=True, exist_ok=True)
    config = dagster_home / "dagster.yaml"
    if not config.exists() or not config.read_text().strip():
        config.write_text(INSTANCE_CONFIG)
    return dg.DagsterInstance.get()


# Runs launched from the UI: the daemon marks a run whose worker died as failed (run monitoring), and the
# queue starts one index run per home at a time (the CLI's in-process runs wait on the warehouse lock instead).
INSTANCE_CONFIG = """\
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
    from lazyhippo.warehouse import process_alive

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


def add_namespace_partition(instance: dg.DagsterInstance, namespace: str) -> None:
    from assets._partitions import namespaces

    if not instance.has_dynamic_partition(namespaces.name, namespace):
        instance.add_dynamic_partitions(namespaces.name, [namespace])


def execute(job_name: str, home: Path, config: dict, on_step: Callable[[str, str], None] | None = None,
            tags: dict | None = None, namespace: str | None = None, workers: int = 1):
    """Run `job_name` (on the `namespace` partition for the indexing jobs; with `workers` > 1 the index job runs
    on the multiprocess executor); `on_step(step, state)` is called live as steps start and end."""
    from .definitions import defs

    instance = instance_for(home)
    fail_dead_runs(instance)
    job = defs.resolve_job_def(job_name)
    tags = {**(tags or {}), **_process_tags()}
    if namespace is not None:
        add_namespace_partition(instance, namespace)
    result: dict = {}

    def target() -> None:
        try:
            if workers > 1:
                result["value"] = execute_parallel(home, config, workers, namespace or "default", tags)
            else:
                result["value"] = job.execute_in_process(run_config=config, instance=instance, tags=tags,
                                                        raise_on_error=False, partition_key=namespace)
        except BaseException as exc:  # surfaced in the calling thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    cursor: str | None = None
    while True:
        thread.join(0.5)
        run = next(iter(instance.get_runs(dg.RunsFilter(tags=tags), limit=1)), None) if on_step else None
        if run is not None:
            conn = instance.get_records_for_run(run.run_id, cursor=cursor, of_type=set(STEP_EVENTS))
            cursor = conn.cursor
            for rec in conn.records:
                event = rec.event_log_entry.dagster_event
                on_step(event.step_key, STEP_EVENTS[event.event_type])
        if not thread.is_alive():
            break
    if "error" in result:
        raise result["error"]
    return result["value"]


def execute_parallel(home: Path, config: dict, workers: int, namespace: str,
                     tags: dict | None = None) -> dg.ExecuteJobResult:
    """Run the index job with the multiprocess executor (`workers` processes): extraction batches in parallel."""
    from assets._partitions import WAREHOUSE_TAGS

    from .definitions import index_job_def

    instance = instance_for(home)
    add_namespace_partition(instance, namespace)
    # forkserver with the definitions preloaded: each step forks in milliseconds instead of importing everything
    cfg = {**config, "execution": {"config": {"multiprocess": {
        "max_concurrent": workers, "start_method": {"forkserver": {"preload_modules": ["pipelines.definitions", "pipelines.worker_preload"]}},
        "tag_concurrency_limits": [{"key": key, "limit": 1} for key in WAREHOUSE_TAGS]}}}}
    with dg.execute_job(dg.reconstructable(index_job_def), instance, run_config=cfg, raise_on_error=False,
                        tags={**(tags or {}), "dagster/partition": namespace}) as result:
        return result


def launch(job_name: str, home: Path, config: dict, tags: dict | None = None,
           on_done: Callable[[str, bool], None] | None = None, namespace: str | None = None) -> str:
    """Start `job_name` (on the `namespace` partition for the indexing jobs) in a background thread of this
    process and return its run id at once (the HTTP API's `POST /api/kg/create`); `on_done(run_id, success)` is
    called when the run ends."""
    import uuid

    from .definitions import defs

    instance = instance_for(home)
    fail_dead_runs(instance)
    job = defs.resolve_job_def(job_name)
    run_id = str(uuid.uuid4())
    tags = {**(tags or {}), **_process_tags()}
    if namespace is not None:
        add_namespace_partition(instance, namespace)

    def target() -> None:
        ok = False
        try:
            ok = job.execute_in_process(run_config=config, instance=instance, tags=tags, run_id=run_id,
                                        raise_on_error=False, partition_key=namespace).success
        finally:
            if on_done:
                on_done(run_id, ok)

    threading.Thread(target=target, name=f"lazyhippo-run-{run_id[:8]}", daemon=True).start()
    return run_id


def run_status(home: Path, run_id: str) -> dict | None:
    """Status of a run in the Dagster instance (None if the instance has no such run)."""
    run = instance_for(home).get_run_by_id(run_id)
    if run is None:
        return None
    return {"run_id": run.run_id, "job": run.job_name, "status": run.status.value, "tags": dict(run.tags)}
