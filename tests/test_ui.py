"""The Dagster UI as its users meet it: a real `dagster dev` (webserver and daemon), driven through the GraphQL API
the UI itself calls, over one home holding two namespaces indexed by the CLI, opened from another folder with only
DAGSTER_HOME set."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lazyhippo.settings import SAMPLE_CORPUS

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCATION, REPOSITORY = "lazyhippo_dagster.definitions", "__repository__"
NOTES = [{"id": "harbor-1", "title": "Harbor lights", "text": "Ada Fenwick lit the Eastbridge harbor lights in 1901."},
         {"id": "harbor-2", "title": "Harbor keeper", "text": "Tomas Reyes kept the Eastbridge harbor for Corran Shipping."}]


class UI:
    def __init__(self, port: int, home: Path, elsewhere: Path, notes: Path):
        self.url, self.home, self.elsewhere, self.notes = f"http://127.0.0.1:{port}/graphql", home, elsewhere, notes

    def gql(self, query: str, **variables) -> dict:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            out = json.loads(response.read())
        assert not out.get("errors"), out["errors"]
        return out["data"]

    def launch(self, job: str, tags: dict, run_config: dict | None = None, assets: list[str] | None = None) -> str:
        params = {"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "pipelineName": job,
                               **({"assetSelection": [{"path": [a]} for a in assets]} if assets else {})},
                  "runConfigData": run_config or {}, "mode": "default",
                  "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}
        out = self.gql("""mutation($p: ExecutionParams!) { launchPipelineExecution(executionParams: $p) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
            ... on RunConfigValidationInvalid { errors { message } } } }""", p=params)["launchPipelineExecution"]
        assert out["__typename"] == "LaunchRunSuccess", out
        return out["run"]["runId"]

    def run(self, run_id: str) -> dict:
        return self.gql("""query($id: ID!) { runOrError(runId: $id) { ... on Run { runId status jobName
            tags { key value } } } }""", id=run_id)["runOrError"]

    def wait(self, run_id: str, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
                return run
            time.sleep(2)
        raise AssertionError(f"run {run_id} did not finish within {timeout}s: {self.run(run_id)}")

    def runs(self, tags: dict) -> list[dict]:
        flt = {"tags": [{"key": k, "value": v} for k, v in tags.items()]}
        return self.gql("""query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results { runId status
            jobName tags { key value } } } } }""", f=flt)["runsOrError"]["results"]

    def messages(self, run_id: str) -> list[str]:
        out = self.gql("""query($id: ID!) { logsForRun(runId: $id, limit: 1000) { ... on EventConnection {
            events { __typename ... on MessageEvent { message } ... on EngineEvent { error { ...E } }
            ... on ExecutionStepFailureEvent { error { ...E } } ... on RunFailureEvent { error { ...E } } } } } }
            fragment E on PythonError { message cause { message cause { message } } }""", id=run_id)["logsForRun"]["events"]

        def chain(error: dict | None) -> str:
            return "" if not error else f"{error['message']} {chain(error.get('cause'))}"

        return [f"{e.get('message', '')} {chain(e.get('error'))}" for e in out]

    def checks(self, asset: str, check: str, partition: str | None = None) -> list[dict]:
        return self.gql("""query($a: AssetKeyInput!, $c: String!, $p: String) { assetCheckExecutions(assetKey: $a,
            checkName: $c, partition: $p, limit: 20) { runId status partition evaluation { partition } } }""",
                        a={"path": [asset]}, c=check, p=partition)["assetCheckExecutions"]

    def partitions(self, asset: str) -> list[str]:
        return self.gql("""query($a: AssetKeyInput!) { assetNodeOrError(assetKey: $a) { ... on AssetNode {
            partitionKeys } } }""", a={"path": [asset]})["assetNodeOrError"]["partitionKeys"]

    def sensor_preview(self, name: str) -> dict:
        out = self.gql("""mutation($s: SensorSelector!) { sensorDryRun(selectorData: $s, cursor: null) {
            __typename ... on DryRunInstigationTick { evaluationResult { skipReason error { message }
            runRequests { runKey jobName tags { key value } }
            dynamicPartitionsRequests { partitionKeys partitionsDefName type } } } ... on PythonError { message } } }""",
                       s={"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": name})
        return out["sensorDryRun"]["evaluationResult"]

    def schedule_preview(self, name: str) -> dict:
        out = self.gql("""mutation($s: ScheduleSelector!, $t: Float) { scheduleDryRun(selectorData: $s, timestamp: $t) {
            __typename ... on DryRunInstigationTick { evaluationResult { skipReason error { message }
            runRequests { runKey jobName tags { key value } } } } ... on PythonError { message } } }""",
                       s={"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "scheduleName": name},
                       t=time.time())
        return out["scheduleDryRun"]["evaluationResult"]


def _tags(run: dict) -> dict:
    return {t["key"]: t["value"] for t in run["tags"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    home, wiki, notes = root / "kb", root / "wiki", root / "notes" / "notes.jsonl"
    shutil.copytree(SAMPLE_CORPUS, wiki)
    notes.parent.mkdir()
    notes.write_text("".join(json.dumps(r) + "\n" for r in NOTES))
    env = {k: v for k, v in os.environ.items()
           if k != "DAGSTER_HOME" and (not k.startswith("LAZYHIPPO_") or k == "LAZYHIPPO_SERVICES_DIR")}
    for source, namespace in ((wiki, "wiki"), (notes, "notes")):  # the CLI creates the instance at <home>/dagster
        done = subprocess.run([sys.executable, "-m", "lazyhippo_dagster.cli", "index", str(source), "--home", str(home),
                               "-n", namespace], env=env, cwd=root, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    elsewhere = root / "elsewhere"  # the UI opened from another folder, with only DAGSTER_HOME set
    elsewhere.mkdir()
    shutil.copy(REPO_ROOT / "workspace.yaml", elsewhere / "workspace.yaml")
    port = _free_port()
    log = open(root / "dagster-dev.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1",
                             "-p", str(port)], cwd=elsewhere, env={**env, "DAGSTER_HOME": str(home / "dagster")},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = UI(port, home, elsewhere, notes)
        deadline = time.monotonic() + 240
        while True:
            try:
                status = client.gql("{ workspaceOrError { ... on Workspace { locationEntries { name "
                                    "locationOrLoadError { __typename } } } } }")
                entries = status["workspaceOrError"]["locationEntries"]
                if entries and entries[0]["locationOrLoadError"] and \
                        entries[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation":
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (root / "dagster-dev.log").read_text()[-3000:]
            time.sleep(2)
        yield client
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def test_tick_previews_see_every_namespace_and_change_nothing(ui):
    assert sorted(ui.partitions("documents")) == ["notes", "wiki"]  # one partition per namespace
    idle = ui.sensor_preview("source_changed")
    assert not idle["runRequests"] and "wiki: no change" in idle["skipReason"] and "notes: no change" in idle["skipReason"]
    with ui.notes.open("a") as f:
        f.write(json.dumps({"id": "harbor-3", "title": "Harbor fog", "text": "Fog closed the Eastbridge harbor in 1903."}) + "\n")
    sensed = ui.sensor_preview("source_changed")
    assert [r["jobName"] for r in sensed["runRequests"]] == ["index"]
    tags = _tags(sensed["runRequests"][0])
    assert tags["lazyhippo/namespace"] == tags["dagster/partition"] == "notes" and tags["lazyhippo/added"] == "1"
    nightly = ui.schedule_preview("nightly_reindex")
    assert [(_tags(r)["dagster/partition"], _tags(r)["lazyhippo/namespace"]) for r in nightly["runRequests"]] == [
        ("notes", "notes")]  # the schedule's job: `index`
    audit = ui.schedule_preview("nightly_audit")
    assert sorted(_tags(r)["lazyhippo/namespace"] for r in audit["runRequests"]) == ["notes", "wiki"]
    assert not ui.runs({"lazyhippo/namespace": "notes", "lazyhippo/added": "1"})  # previews launched nothing


def test_a_launchpad_run_acts_on_the_home_and_every_check_result_names_its_namespace(ui):
    run = ui.wait(ui.launch("index_graph", {"dagster/partition": "wiki"}))  # the Launchpad's default: no config
    assert run["status"] == "SUCCESS", ui.messages(run["runId"])[-5:]
    assert _tags(run)["lazyhippo/namespace"] == "wiki"
    assert not (ui.elsewhere / ".lazyhippo").exists()  # nothing written beside the code location
    kinds = ui.gql("""{ assetNodes { assetKey { path } kinds } }""")["assetNodes"]
    assert not {k for n in kinds for k in n["kinds"]} & {"neo4j", "minio"}  # the embedded stores are in use
    assert "duckdb" in next(n["kinds"] for n in kinds if n["assetKey"]["path"] == ["entities"])
    assert "duckdb" in next(n["kinds"] for n in kinds if n["assetKey"]["path"] == ["published_snapshot"])
    assert any('step "published_snapshot"' in m for m in ui.messages(run["runId"]))  # the run's last step publishes
    wiki = ui.checks("entities", "graph_not_empty", "wiki")
    assert run["runId"] in {e["runId"] for e in wiki} and all(e["partition"] == "wiki" for e in wiki)
    assert {e["partition"] for e in ui.checks("entities", "graph_not_empty")} == {"wiki", "notes"}
    # no questions.json beside notes.jsonl: that check did not run, and never shows as passed
    assert {e["status"] for e in ui.checks("community_summaries", "retrieval_quality_check", "notes")} == {"SKIPPED"}
    assert {e["status"] for e in ui.checks("community_summaries", "retrieval_quality_check", "wiki")} <= {"SUCCEEDED", "FAILED"}


def test_a_namespace_the_home_does_not_hold_fails_before_any_step(ui):
    ui.gql("""mutation { addDynamicPartition(repositorySelector: {repositoryLocationName: "%s", repositoryName: "%s"},
        partitionsDefName: "namespaces", partitionKey: "ghost") { __typename } }""" % (LOCATION, REPOSITORY))
    run = ui.wait(ui.launch("index_graph", {"dagster/partition": "ghost"}))
    assert run["status"] == "FAILURE"
    messages = " ".join(ui.messages(run["runId"]))
    assert "'ghost' is not indexed in" in messages and "Finished execution of step" not in messages
    assert not (ui.home / "namespaces" / "ghost.json").exists() and not (ui.elsewhere / ".lazyhippo").exists()


def test_a_catalog_materialization_is_followed_by_its_graph_run(ui):
    """Documents materialized alone from the asset catalog: the sensor `graph_after_documents` requests the
    namespace's graph-wide assets once."""
    before = {r["runId"] for r in ui.runs({"dagster/partition": "wiki"})}
    run_id = ui.launch("__ASSET_JOB", {"dagster/partition": "wiki"}, assets=["documents", "chunks", "extractions"])
    run = ui.wait(run_id)
    assert run["status"] == "SUCCESS" and _tags(run)["lazyhippo/namespace"] == "wiki", ui.messages(run_id)[-5:]
    deadline = time.monotonic() + 240
    while not (follow := [r for r in ui.runs({"dagster/partition": "wiki"}) if r["runId"] not in before | {run_id}]):
        assert time.monotonic() < deadline, "no graph run followed the catalog materialization:\n" + "\n".join(
            line for line in (ui.home.parent / "dagster-dev.log").read_text().splitlines()[-400:] if "graph_after_documents" in line)
        time.sleep(3)
    graph = ui.wait(follow[0]["runId"])
    assert graph["status"] == "SUCCESS", ui.messages(graph["runId"])[-5:]
    assert _tags(graph)["lazyhippo/namespace"] == "wiki" and _tags(graph)["lazyhippo/writer"] == "warehouse"
    assert any('step "published_snapshot"' in m for m in ui.messages(graph["runId"]))
    time.sleep(35)  # another evaluation of the sensor: nothing more is requested
    assert len([r for r in ui.runs({"dagster/partition": "wiki"}) if r["runId"] not in before]) == 2


def test_a_query_run_names_its_namespace_and_shows_its_answer(ui):
    question = "Who lit the Eastbridge harbor lights?"
    run_id = ui.launch("query", {"dagster/partition": "notes"},
                       {"ops": {"answer_question": {"config": {"question": question}}}})
    run = ui.wait(run_id)
    assert run["status"] == "SUCCESS" and _tags(run)["lazyhippo/namespace"] == "notes"
    events = ui.gql("""query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events {
        ... on ExecutionStepOutputEvent { metadataEntries { label ... on MarkdownMetadataEntry { mdStr } } } } } } }""",
                    id=run_id)["logsForRun"]["events"]
    answer = next(m["mdStr"] for e in events for m in e.get("metadataEntries") or [] if m["label"] == "answer")
    assert f"**Question:** {question}" in answer and "**Citations:**" in answer and "notes.jsonl#harbor-" in answer
