"""A Dagster deployment past one machine, brought up on loopback by `lazyhippo cluster up`.

Under one root folder:

- `control/`: the Dagster instance (`dagster/dagster.yaml`: PostgreSQL storage, the queued run coordinator, one
  run at a time per namespace), the workspace, the daemon and the webserver;
- `workers/w<i>/`: one Celery worker each, with its own working directory, HOME, TMPDIR, DAGSTER_HOME and
  LAZYHIPPO_HOME. Worker 1 also serves the `warehouse` queue: the DuckDB warehouse lives in its home
  (`workers/w1/lazyhippo/warehouse.duckdb`) and no other process opens it. Every other worker shares nothing
  with it but the servers: PostgreSQL (the instance), Redis (the Celery broker) and MinIO (step outputs,
  extraction batches and parts, published snapshots). Step outputs in the object store expire after
  STEP_OUTPUTS_DAYS (a bucket lifecycle rule set by `up`); a successful run's are removed at once.

The dagster.yaml names the PostgreSQL login by environment variable; the values (from the services credentials)
reach the processes through their environment only (`lazyhippo.settings.cluster_environment`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from lazyhippo.settings import cluster_environment, postgres_environment
from lazyhippo.stores.minio import MinioObjectStore
from lazyhippo.stores.warehouse import process_alive
from lazyhippo_dagster.resources import STEP_OUTPUTS, STEP_OUTPUTS_DAYS

WAREHOUSE_QUEUE = "warehouse"
STEP_QUEUE = "dagster"  # dagster-celery's default queue: the extraction batches
NAMESPACE_LIMIT = 1      # runs at a time per namespace (tag lazyhippo/namespace)

INSTANCE_YAML = """\
storage:
  postgres:
    postgres_db:
      username: {env: LAZYHIPPO_PG_USER}
      password: {env: LAZYHIPPO_PG_PASSWORD}
      hostname: {env: LAZYHIPPO_PG_HOST}
      db_name: {env: LAZYHIPPO_PG_DB}
      port: {env: LAZYHIPPO_PG_PORT}
      scheme: postgresql+psycopg2   # the driver dagster-postgres installs (SQLAlchemy 2.1 defaults to psycopg 3)
run_queue:
  max_concurrent_runs: %(max_runs)d
  dequeue_interval_seconds: 1
  tag_concurrency_limits:
    - key: lazyhippo/namespace
      value: {applyLimitPerUniqueValue: true}
      limit: %(namespace_limit)d
run_monitoring:
  enabled: true
  poll_interval_seconds: 30
  max_resume_run_attempts: 0
# step logs stay with the worker that ran the step, under its own DAGSTER_HOME (Dagster's local compute log
# manager; a shared compute log store, e.g. S3, is the alternative)
telemetry:
  enabled: false
"""


def instance_yaml(max_runs: int = 4) -> str:
    return INSTANCE_YAML % {"max_runs": max_runs, "namespace_limit": NAMESPACE_LIMIT}


WORKSPACE_YAML = """\
load_from:
  - python_module:
      module_name: lazyhippo_dagster.definitions
      location_name: lazyhippo
"""


@dataclass(frozen=True)
class Cluster:
    root: Path

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def dagster_home(self) -> Path:
        return self.control / "dagster"

    def worker_dir(self, i: int) -> Path:
        return self.root / "workers" / f"w{i}"

    @property
    def warehouse_home(self) -> Path:
        """The index home of the worker that serves the warehouse queue: the one place the warehouse lives."""
        return self.worker_dir(1) / "lazyhippo"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}

    def instance(self) -> dg.DagsterInstance:
        """The cluster's instance for a launcher in this process."""
        return postgres_instance(self.dagster_home)


def postgres_instance(dagster_home: Path) -> dg.DagsterInstance:
    """The instance whose dagster.yaml (on PostgreSQL) is in `dagster_home`. The yaml names the login by
    environment variable; they are set only while the instance is built (its storage reads them then), so no
    process this one starts later inherits them."""
    env = {"DAGSTER_HOME": str(dagster_home), **postgres_environment()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return dg.DagsterInstance.get()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _home_env(base: dict, folder: Path, **extra: str) -> dict:
    """A process of its own: working dir, HOME, TMPDIR, Dagster and lazyhippo homes all under `folder`."""
    for sub in ("home", "tmp", "dagster", "lazyhippo"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "dagster" / "dagster.yaml").write_text(instance_yaml())
    env = {**base, "HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp"), "DAGSTER_HOME": str(folder / "dagster"),
           "LAZYHIPPO_HOME": str(folder / "lazyhippo"), **extra}
    env.pop("LAZYHIPPO_SERVICES_DIR", None)  # everything a process needs is in its environment
    return env


def _spawn(name: str, args: list[str], cwd: Path, env: dict) -> int:
    log = open(cwd / f"{name}.log", "ab")
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: `down` ends it with its children
    return proc.pid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_queues(i: int) -> list[str]:
    return [WAREHOUSE_QUEUE, STEP_QUEUE] if i == 1 else [STEP_QUEUE]


def up(root: Path, workers: int = 2, port: int | None = None, snapshots: str | None = None,
       timeout: float = 120.0) -> Cluster:
    """Start the daemon, the webserver and `workers` Celery workers (one process each, concurrency 1) and wait
    until the webserver answers and every worker replies to a ping. With `snapshots` (s3://bucket/prefix) every
    publish also uploads the namespace's snapshot there, for `lazyhippo serve --snapshots` replicas."""
    if workers < 1:
        raise ValueError(f"--workers {workers}: at least 1 (worker 1 serves the warehouse queue)")
    cluster = Cluster(Path(root).resolve())
    if alive(cluster):
        raise RuntimeError(f"a cluster already runs from {cluster.root} (`lazyhippo cluster down` first)")
    base = {**os.environ, **cluster_environment(), **({"LAZYHIPPO_SNAPSHOTS": snapshots} if snapshots else {})}
    bucket = base["MINIO_BUCKET"]
    step_outputs(bucket).expire(STEP_OUTPUTS, STEP_OUTPUTS_DAYS)  # a failed run's; a successful run's go at once
    bin_dir = Path(sys.executable).parent
    cluster.control.mkdir(parents=True, exist_ok=True)
    (cluster.control / "workspace.yaml").write_text(WORKSPACE_YAML)
    control = _home_env(base, cluster.control)
    port = port or _free_port()
    pids = {"daemon": _spawn("daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                             cluster.control, control),
            "webserver": _spawn("webserver", [str(bin_dir / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port),
                                              "-w", "workspace.yaml"], cluster.control, control)}
    for i in range(1, workers + 1):
        folder = cluster.worker_dir(i)
        folder.mkdir(parents=True, exist_ok=True)
        pids[f"w{i}"] = _spawn("worker", [sys.executable, "-m", "celery", "-A", "lazyhippo_dagster.celery_app", "worker",
                                          "-Q", ",".join(worker_queues(i)), "-n", f"w{i}@%h", "--concurrency", "1",
                                          "--prefetch-multiplier", "1", "-l", "INFO", "--without-gossip",
                                          "--without-mingle"], folder, _home_env(base, folder))
    cluster.state_file.write_text(json.dumps({"pids": pids, "port": port, "workers": workers, "bucket": bucket}))
    try:
        _wait_ready(cluster, timeout)
    except Exception:
        down(cluster.root)
        raise
    return cluster


def step_outputs(bucket: str) -> MinioObjectStore:
    """The bucket of the cluster's step outputs (MINIO_* of the services credentials)."""
    return MinioObjectStore.from_env(bucket=bucket)


def _wait_ready(cluster: Cluster, timeout: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    port = cluster.state()["port"]
    while True:
        dead = [name for name, pid in cluster.state()["pids"].items() if not _pid_alive(pid)]
        if dead:
            raise RuntimeError(f"cluster processes exited at start: {', '.join(dead)} (see their .log files under "
                               f"{cluster.root})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
                pass
            if len(ping_workers()) >= cluster.state()["workers"]:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster under {cluster.root} was not ready within {timeout:.0f}s")
        time.sleep(1)


def ping_workers(timeout: float = 1.0) -> list[str]:
    """Names of the Celery workers that answer on the broker."""
    from celery import Celery

    env = cluster_environment()
    app = Celery("lazyhippo-ping", broker=env["LAZYHIPPO_CELERY_BROKER"], backend=env["LAZYHIPPO_CELERY_BACKEND"])
    try:
        return sorted(name for reply in app.control.ping(timeout=timeout) for name in reply)
    finally:
        app.close()


def _pid_alive(pid: int) -> bool:
    if not process_alive(pid, socket.gethostname()):
        return False
    try:  # a zombie child of this process counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def alive(cluster: Cluster) -> dict[str, bool]:
    return {name: _pid_alive(pid) for name, pid in cluster.state().get("pids", {}).items()}


def down(root: Path, timeout: float = 30.0) -> list[str]:
    """Stop every process the cluster started (their process groups: the daemon's code servers and run workers,
    the workers' pool processes), politely first."""
    cluster = Cluster(Path(root).resolve())
    pids = cluster.state().get("pids", {})
    for pid in pids.values():
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(_pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.3)
    for pid in pids.values():
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cluster.state_file.unlink(missing_ok=True)
    return sorted(pids)


def status(root: Path) -> dict:
    cluster = Cluster(Path(root).resolve())
    state = cluster.state()
    if not state:
        return {"running": False, "root": str(cluster.root)}
    processes = alive(cluster)
    return {"running": all(processes.values()), "root": str(cluster.root), "processes": processes,
            "webserver": f"http://127.0.0.1:{state['port']}", "workers": ping_workers() if any(processes.values()) else [],
            "warehouse": str(cluster.warehouse_home / "warehouse.duckdb"),
            "step_outputs": {"store": f"s3://{state['bucket']}/{STEP_OUTPUTS}",
                             "expire_days": step_outputs(state["bucket"]).expiry_days(STEP_OUTPUTS)}}


# ---- launching index runs through the run queue ----

def submit(cluster: Cluster, job: str, run_config: dict, tags: dict) -> str:
    """Queue a run through the webserver's GraphQL API: the daemon starts it when the namespace's limit allows."""
    from dagster_graphql import DagsterGraphQLClient

    client = DagsterGraphQLClient("127.0.0.1", port_number=cluster.state()["port"])
    return client.submit_job_execution(job, run_config=run_config, tags=tags)


def wait(cluster: Cluster, run_id: str, timeout: float = 1800.0, instance: dg.DagsterInstance | None = None) -> dg.DagsterRun:
    instance = instance or cluster.instance()
    deadline = time.monotonic() + timeout
    while True:
        run = instance.get_run_by_id(run_id)
        if run.is_finished:
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run.status.value} after {timeout:.0f}s")
        time.sleep(1)


def index(cluster: Cluster, namespace: str, source: str, resources: dict | None = None, ops: dict | None = None,
          timeout: float = 1800.0) -> list[dg.DagsterRun]:
    """One `index` run of the namespace through the run queue. The warehouse steps skip what is unchanged
    (content hashes, extraction signatures)."""
    from lazyhippo_dagster.assets._partitions import namespace_tags
    from lazyhippo_dagster.runner import add_namespace_partition

    config = {"resources": {"lazyhippo": {"config": {**(resources or {}), "namespace": namespace, "source": source}}},
              **({"ops": ops} if ops else {})}  # op config of the extraction steps
    instance = cluster.instance()
    add_namespace_partition(instance, namespace)
    run_id = submit(cluster, "index", config, namespace_tags(namespace))
    return [wait(cluster, run_id, timeout, instance)]
