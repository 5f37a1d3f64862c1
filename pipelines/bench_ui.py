"""`lazyhippo bench ui`: how long the Dagster UI's pages take to load on an index home. Starts a real
`dagster-webserver` on the home's instance and sends, page by page, the GraphQL operations the UI's own code sends
for the asset catalog, an asset's page and a run's page (`ui_pages.graphql`, copied from the webserver's bundled
UI), with the variables the UI uses (batches of 1,000 assets and 1,000 log events). A page's time is the sum of its
operations, one after the other: the browser sends some side by side, so the figure is an upper bound."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import dagster as dg
import httpx

QUERIES = Path(__file__).with_name("ui_pages.graphql")
BATCH = 1000          # the UI's batch of assets (catalog) and of events (run logs)
RECENT_EVENTS = 100   # events the asset page lists
PAGE_TARGET_S = 2.0


@dataclass
class Page:
    """One page load: seconds, the webserver's CPU seconds (its process tree: the webserver and its code server)
    and response bytes per operation (an operation sent several times, as the run page's log batches are, adds
    up). On a shared machine the CPU seconds are what the page costs; the wall seconds add the wait for a core."""

    name: str
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    response_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def total_cpu(self) -> float:
        return sum(self.cpu_seconds.values())


def tree_cpu_seconds(root: int) -> float:
    """User and system CPU seconds of `root` and its descendants so far."""
    from lazyhippo_dagster.bench_process import process_tree

    return sum(int(p["stat"][11]) + int(p["stat"][12]) for p in process_tree(root).values()) / os.sysconf("SC_CLK_TCK")


class UiClient:
    """The webserver's GraphQL endpoint, sending the UI's operations by name and timing each."""

    def __init__(self, url: str, server_pid: int, timeout: float = 600.0):
        self.url, self.document, self.server_pid = f"{url}/graphql", QUERIES.read_text(), server_pid
        self.http = httpx.Client(timeout=timeout)
        self.page: Page | None = None

    def op(self, operation: str, **variables) -> dict:
        cpu0, t0 = tree_cpu_seconds(self.server_pid), time.perf_counter()
        response = self.http.post(self.url, json={"query": self.document, "operationName": operation,
                                                  "variables": variables})
        seconds, cpu = time.perf_counter() - t0, tree_cpu_seconds(self.server_pid) - cpu0
        response.raise_for_status()
        body = response.json()
        if body.get("errors"):
            raise RuntimeError(f"{operation}: {body['errors'][0].get('message')}")
        errors = _python_errors(body["data"])
        if errors:
            raise RuntimeError(f"{operation}: {errors[0]}")
        if self.page is not None:
            self.page.seconds[operation] = self.page.seconds.get(operation, 0.0) + seconds
            self.page.cpu_seconds[operation] = self.page.cpu_seconds.get(operation, 0.0) + cpu
            self.page.response_bytes[operation] = self.page.response_bytes.get(operation, 0) + len(response.content)
        return body["data"]

    def load(self, name: str, page: Callable[["UiClient"], None]) -> Page:
        self.page = Page(name)
        try:
            page(self)
            return self.page
        finally:
            self.page = None


def _python_errors(data) -> list[str]:
    """The messages of PythonError results anywhere in a response (GraphQL reports those as data)."""
    if isinstance(data, dict):
        if data.get("__typename") == "PythonError":
            return [data.get("message", "PythonError")]
        return [m for v in data.values() for m in _python_errors(v)]
    if isinstance(data, list):
        return [m for v in data for m in _python_errors(v)]
    return []


def catalog_page(ui: UiClient) -> list[dict]:
    """The asset catalog: every asset in batches, then their live data and health. Returns the asset keys."""
    keys, cursor = [], None
    while True:
        batch = ui.op("AssetCatalogTableQuery", cursor=cursor, limit=BATCH)["assetsOrError"]
        keys += [{"path": node["key"]["path"]} for node in batch["nodes"]]
        cursor = batch["cursor"]
        if len(batch["nodes"]) < BATCH or not cursor:
            break
    ui.op("AssetGraphLiveQuery", assetKeys=keys)
    ui.op("AssetHealthQuery", assetKeys=keys)
    return keys


def asset_page(asset: str) -> Callable[[UiClient], None]:
    """An asset's page: its definition, live data, health, partitions, its latest materialization's metadata
    and its recent events."""
    key = {"path": asset.split("/")}

    def load(ui: UiClient) -> None:
        ui.op("AssetViewDefinitionQuery", assetKey=key)
        ui.op("AssetGraphLiveQuery", assetKeys=[key])
        ui.op("AssetHealthQuery", assetKeys=[key])
        ui.op("PartitionHealthQuery", assetKey=key)
        ui.op("AssetOverviewMetadataEventsQuery", assetKey=key)
        ui.op("RecentAssetEventsQuery", assetKey=key, limit=RECENT_EVENTS,
              eventTypeSelectors=["MATERIALIZATION", "OBSERVATION", "FAILED_TO_MATERIALIZE"])
    return load


def run_page(run_id: str) -> Callable[[UiClient], None]:
    """A run's page: the run, every log event in the UI's batches, its assets, checks and step stats."""

    def load(ui: UiClient) -> None:
        ui.op("RunRootQuery", runId=run_id)
        cursor = None
        while True:
            logs = ui.op("RunLogsQuery", runId=run_id, cursor=cursor, limit=BATCH)["logsForRun"]
            cursor = logs["cursor"]
            if len(logs["events"]) < BATCH:
                break
        ui.op("RunAssetsQuery", runId=run_id)
        ui.op("RunAssetChecksQuery", runId=run_id)
        ui.op("RunStepStatsQuery", runId=run_id)
    return load


def longest_index_run(instance: dg.DagsterInstance) -> str:
    """The successful `index` run that took longest: a home's full index, not its later updates."""
    records = instance.get_run_records(dg.RunsFilter(job_name="index", statuses=[dg.DagsterRunStatus.SUCCESS]))
    timed = [r for r in records if r.start_time and r.end_time]
    if not timed:
        raise ValueError("no successful `index` run in this instance: index the home first (or pass --run-id)")
    return max(timed, key=lambda r: r.end_time - r.start_time).dagster_run.run_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_postgres(dagster_home: Path) -> bool:
    import yaml

    return "postgres" in (yaml.safe_load((dagster_home / "dagster.yaml").read_text()) or {}).get("storage", {})


def _instance(dagster_home: Path) -> dg.DagsterInstance:
    """The instance in `dagster_home`; one on PostgreSQL gets its login as `lazyhippo cluster` gives it."""
    from lazyhippo_dagster.cluster import postgres_instance

    if _on_postgres(dagster_home):
        return postgres_instance(dagster_home)
    return dg.DagsterInstance.from_config(str(dagster_home))


def start_webserver(dagster_home: Path, port: int, log) -> subprocess.Popen:
    from lazyhippo.settings import postgres_environment

    env = {**os.environ, "DAGSTER_HOME": str(dagster_home),
           **(postgres_environment() if _on_postgres(dagster_home) else {})}
    return subprocess.Popen([sys.executable, "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(port),
                             "-m", "lazyhippo_dagster.definitions"], env=env, stdout=log, stderr=log)


LOCATIONS = ("{ locationStatusesOrError { __typename ... on WorkspaceLocationStatusEntries "
             "{ entries { name loadStatus } } } }")


def wait_ready(url: str, server: subprocess.Popen, log_name: str, timeout: float = 300.0) -> None:
    """Until the webserver answers and its code location has loaded."""
    deadline = time.time() + timeout
    while True:
        if server.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the Dagster webserver did not come up; its log: {log_name}")
        try:
            data = httpx.post(f"{url}/graphql", json={"query": LOCATIONS}, timeout=5).json()["data"]
            entries = data["locationStatusesOrError"].get("entries") or []
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                return
        except (httpx.TransportError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.5)


def run_ui_bench(dagster_home: Path, run_id: str | None = None, asset: str = "documents", repeat: int = 3,
                 progress: Callable[[str], None] = print) -> dict:
    """First load and median of `repeat` further loads of each page, per operation and in total."""
    instance = _instance(dagster_home)
    run_id = run_id or longest_index_run(instance)
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise ValueError(f"--run-id {run_id}: no such run in the instance at {dagster_home}")
    event_rows = len(instance.all_logs(run_id))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="lazyhippo-webserver-", suffix=".log", delete=False)
    server = start_webserver(dagster_home, port, log)
    try:
        progress(f"waiting for the webserver on {url}")
        wait_ready(url, server, log.name)
        ui = UiClient(url, server.pid)
        pages = {"asset catalog": catalog_page, f"asset {asset}": asset_page(asset), "run": run_page(run_id)}
        out: dict = {"run_id": run_id, "run_event_rows": event_rows, "pages": {}}
        for name, load in pages.items():
            progress(f"{name} page: {1 + repeat} loads")
            loads = [ui.load(name, load) for _ in range(1 + repeat)]
            warm = loads[1:] or loads
            out["pages"][name] = {
                "first_s": loads[0].total, "median_s": statistics.median(p.total for p in warm),
                "first_cpu_s": loads[0].total_cpu, "median_cpu_s": statistics.median(p.total_cpu for p in warm),
                "operations": {op: {"first_s": loads[0].seconds[op],
                                    "median_s": statistics.median(p.seconds[op] for p in warm),
                                    "first_cpu_s": loads[0].cpu_seconds[op],
                                    "median_cpu_s": statistics.median(p.cpu_seconds[op] for p in warm),
                                    "kb": loads[0].response_bytes[op] / 1000} for op in loads[0].seconds}}
        out["slowest_page_s"] = max(max(p["first_s"], p["median_s"]) for p in out["pages"].values())
        out["slowest_page_cpu_s"] = max(max(p["first_cpu_s"], p["median_cpu_s"]) for p in out["pages"].values())
        out["load_average"] = os.getloadavg()
        out["meets_target"] = out["slowest_page_s"] <= PAGE_TARGET_S
        return out
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
