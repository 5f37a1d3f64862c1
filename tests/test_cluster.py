"""A Dagster deployment past one machine, on loopback: PostgreSQL instance and run queue, Celery workers on Redis
in separate folders (own HOME, TMPDIR, homes), step outputs and snapshots through MinIO."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

from lazyhippo.index import run_index
from lazyhippo.query import answer_question
from lazyhippo.settings import Settings, environment
from lazyhippo.stores.warehouse import connect
from tests.services_fixtures import minio_store, namespaces, unavailable  # noqa: F401 - fixtures
from tests.test_lifecycle import graph_difference, graph_snapshot
from tests.test_scale_out import extracted

pytestmark = pytest.mark.services
CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "2wikimultihopqa" / "corpus.jsonl"
PASSAGES = 160
QUESTIONS = ["Who was the wife of Lothair II?", "Which bishop of Elmham is mentioned?", "Where was the film director born?"]
SMALL_BATCHES = {"extractions": {"ops": {"plan_extraction_batches": {"config": {"batch_chunks": 40}}}}}


def _reachable(port: str) -> None:
    with socket.create_connection(("127.0.0.1", int(port)), timeout=3):
        pass


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    if not CORPUS.exists():
        pytest.skip(f"shared 2WikiMultiHopQA corpus not found at {CORPUS}")
    folder = tmp_path_factory.mktemp("wiki")
    with CORPUS.open() as f:
        (folder / "corpus.jsonl").write_text("".join(next(f) for _ in range(PASSAGES)))
    return folder


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, minio_store):  # noqa: F811
    from lazyhippo.settings import MissingCredentials, cluster_environment
    from lazyhippo_dagster import cluster as clusters

    try:
        env = cluster_environment()
        _reachable(env["LAZYHIPPO_PG_PORT"])
        _reachable(env["LAZYHIPPO_CELERY_BROKER"].rsplit(":", 1)[1].split("/")[0])
    except (MissingCredentials, OSError) as exc:
        unavailable(f"PostgreSQL / Redis not usable (`scripts/services.sh start postgres redis`): {exc}")
    root = tmp_path_factory.mktemp("cluster")
    prefix = f"snapshots-{root.name}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIO_BUCKET", minio_store.bucket)  # the test bucket, cleaned per namespace at the end
        c = clusters.up(root, workers=3, snapshots=f"s3://{minio_store.bucket}/{prefix}")
    yield c, prefix
    clusters.down(root)
    for key in minio_store.list(f"{prefix}/"):
        minio_store.delete(key)


def _index(c, namespace: str, source: Path, ops: dict | None = SMALL_BATCHES):
    from lazyhippo_dagster import cluster as clusters

    return clusters.index(c, namespace, str(source), ops=ops, timeout=600)


def _workers_of(instance, run_id: str) -> dict[str, str]:
    """step key -> Celery worker that ran it (dagster-celery's engine event)."""
    out = {}
    for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        md = e.dagster_event.engine_event_data.metadata
        if "Celery worker" in md:
            out[e.step_key] = md["Celery worker"].value
    return out


def _top8(url: str, namespace: str, question: str) -> list[str]:
    r = httpx.post(f"{url}/api/query", json={"question": question, "namespace": namespace, "route": "local",
                                             "top_k": 8}, timeout=60)
    r.raise_for_status()
    return [c["chunk_id"] for c in r.json()["context"]]


def _local_top8(settings: Settings, question: str) -> list[str]:
    return [c["chunk_id"] for c in answer_question(settings, question, route="local", top_k=8, llm=None).to_dict()["context"]]


def _versions(store, prefix: str, namespace: str) -> list[str]:
    return [k for k in store.list(f"{prefix}/{namespace}/") if k.endswith(".duckdb")]


def _until(get, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (value := get()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(1)
    return value


def test_cluster_indexes_like_one_process_survives_a_killed_worker_and_serves_replicas(
        cluster, corpus, tmp_path, namespaces, minio_store):  # noqa: F811
    from lazyhippo_dagster import cluster as clusters
    from lazyhippo_dagster.resources import STEP_OUTPUTS_DAYS

    c, prefix = cluster
    instance = c.instance()
    ns = namespaces("cluster")

    # one namespace through the run queue, a worker process killed with -9 in the middle of an extraction batch
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("runs", _index(c, ns, corpus)))
    thread.start()
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and thread.is_alive() and time.monotonic() < deadline:
        runs = instance.get_runs(dg.RunsFilter(tags={"lazyhippo/namespace": ns}, job_name="index"), limit=1)
        if runs:
            starts = instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_START)
            batch = [e for e in starts if "extract_documents[" in e.step_key]
            if batch:
                killed = (batch[0].step_key, batch[0].dagster_event.pid)
                os.kill(killed[1], signal.SIGKILL)
        time.sleep(0.2)
    thread.join(600)
    [docs_run] = result["runs"]  # one index run: documents, extraction, graph, snapshot
    assert docs_run.is_success
    assert killed is not None, "no extraction batch started"
    starts = [e.step_key for e in instance.all_logs(docs_run.run_id, of_type=dg.DagsterEventType.STEP_START)]
    assert starts.count(killed[0]) == 2  # the killed step ran again elsewhere: a retry, not a failed run

    # one publish per run on Celery too (each step sets its resources up on its worker): one snapshot version
    assert len(_versions(minio_store, prefix, ns)) == 1
    # the daemon removes a successful run's step outputs from the object store; the rest expire there
    _until(lambda: not minio_store.list(f"dagster/{docs_run.run_id}/"))
    assert clusters.status(c.root)["step_outputs"]["expire_days"] == STEP_OUTPUTS_DAYS

    workers = _workers_of(instance, docs_run.run_id)
    batch_workers = {w for step, w in workers.items() if "extract_documents[" in step}
    assert len(batch_workers) >= 2, workers
    warehouse_steps = {w for step, w in workers.items() if "extract_documents[" not in step}
    assert warehouse_steps == {"w1@" + socket.gethostname()}  # one worker writes the warehouse
    for i in (2, 3):  # the other workers hold no warehouse, no snapshot
        assert not list((c.worker_dir(i) / "lazyhippo").glob("**/*.duckdb"))

    # the same rows as the in-process library path
    reference = Settings(home=tmp_path / "ref", namespace=ns, source=str(corpus))
    run_index(reference)
    ours = Settings(home=c.warehouse_home, namespace=ns)
    assert extracted(ours) == extracted(reference)
    assert not graph_difference(graph_snapshot(ours), graph_snapshot(reference))

    # a serving replica in its own folder, fed from the object store only
    replica = tmp_path / "replica"
    for sub in ("home", "tmp", "index"):
        (replica / sub).mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LAZYHIPPO_HOME", "DAGSTER_HOME"))}
    env.update(HOME=str(replica / "home"), TMPDIR=str(replica / "tmp"), DAGSTER_HOME=str(replica / "dagster"),
               LAZYHIPPO_MODEL_CACHE=str(environment().model_cache))  # prepared once per host by scripts/setup.sh
    proc = subprocess.Popen([sys.executable, "-c", "from lazyhippo_dagster.cli import app; app()", "serve", "--home", str(replica / "index"),
                             "--port", str(port), "--snapshots", f"s3://{minio_store.bucket}/{prefix}"],
                            cwd=replica, env=env, stdout=open(replica / "serve.log", "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        health = _wait_for(lambda: _health(url), lambda h: h and ns in h["namespaces"], proc, replica)
        assert health["snapshots"]["reachable"] and ns in health["snapshots"]["versions"]
        for q in QUESTIONS:
            assert _top8(url, ns, q) == _local_top8(reference, q)

        # a re-index (a third of the passages gone) reaches the running replica without a restart
        lines = (corpus / "corpus.jsonl").read_text().splitlines(keepends=True)
        smaller = tmp_path / "smaller"
        smaller.mkdir()
        (smaller / "corpus.jsonl").write_text("".join(lines[: 2 * PASSAGES // 3]))
        version = health["snapshots"]["versions"][ns]
        assert all(r.is_success for r in _index(c, ns, smaller, ops=None))
        assert len(_versions(minio_store, prefix, ns)) == 2
        _wait_for(lambda: _health(url), lambda h: h and h["snapshots"]["versions"].get(ns) != version, proc, replica)
        reindexed = Settings(home=c.warehouse_home, namespace=ns)  # the in-process engine on the new snapshot
        for q in QUESTIONS:
            _wait_for(lambda: _top8(url, ns, q), lambda top: top == _local_top8(reindexed, q), proc, replica)
        assert _health(url)["warm"][ns]["chunks"] < health["warm"][ns]["chunks"]  # the smaller index, swapped in
    finally:
        proc.terminate()
        proc.wait(20)


def test_two_namespaces_index_side_by_side_through_the_queue(cluster, corpus, tmp_path, namespaces):
    c, _ = cluster
    small = tmp_path / "small"
    small.mkdir()
    small.joinpath("corpus.jsonl").write_text("".join((corpus / "corpus.jsonl").read_text().splitlines(True)[:30]))
    spaces = [namespaces("side"), namespaces("side")]
    results: dict = {}
    threads = [threading.Thread(target=lambda n=n: results.setdefault(n, _index(c, n, small))) for n in spaces]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert all(r.is_success for n in spaces for r in results[n])
    runs = [r for n in spaces for r in results[n]]
    assert {r.tags["lazyhippo/namespace"] for r in runs} == set(spaces)  # the queue's limit key
    stats = {r.run_id: c.instance().get_run_stats(r.run_id) for r in runs}
    a, b = (stats[r.run_id] for r in runs)
    assert a.start_time < b.end_time and b.start_time < a.end_time  # the two namespaces' runs overlapped

    # two runs of one namespace, queued together, run one after the other (index runs with nothing new to
    # extract: the cheapest real runs)
    from lazyhippo_dagster import cluster as clusters
    from lazyhippo_dagster.assets._partitions import namespace_tags

    config = {"resources": {"lazyhippo": {"config": {"namespace": spaces[0], "source": str(small)}}}}
    ids = [clusters.submit(c, "index", config, namespace_tags(spaces[0])) for _ in range(2)]
    done = [clusters.wait(c, run_id, 600) for run_id in ids]
    assert all(r.is_success for r in done)
    a, b = (c.instance().get_run_stats(run_id) for run_id in ids)
    assert a.end_time <= b.start_time or b.end_time <= a.start_time


def _health(url: str) -> dict | None:
    try:
        return httpx.get(f"{url}/health", timeout=5).json()
    except httpx.TransportError:
        return None


def _wait_for(get, ok, proc, folder: Path, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if ok(value):
            return value
        assert proc.poll() is None, (folder / "serve.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"timed out; last: {json.dumps(value)[:2000]}"
        time.sleep(1)


def test_a_sensor_tick_on_the_cluster_indexes_a_new_namespace_from_shared_state(
        cluster, corpus, tmp_path, namespaces, minio_store, monkeypatch):  # noqa: F811
    """The source sensor, evaluated as the cluster's daemon does (its home holds no warehouse), against the
    cluster's instance: it requests the namespace's index run with its settings, which succeeds on the workers;
    the graph-wide assets, updated in that run, are requested by no automation afterwards."""
    from lazyhippo_dagster import cluster as clusters
    from lazyhippo_dagster.resources import LazyhippoResource
    from lazyhippo_dagster.sensors import source_changed

    c, prefix = cluster
    ns = namespaces("sensed")
    source = tmp_path / "watched"
    source.mkdir()
    source.joinpath("corpus.jsonl").write_text("".join((corpus / "corpus.jsonl").read_text().splitlines(True)[:20]))
    monkeypatch.setenv("LAZYHIPPO_EXECUTOR", "celery")  # the daemon's environment (cluster_environment)
    monkeypatch.setenv("LAZYHIPPO_HOME", str(tmp_path / "daemon"))
    instance = c.instance()
    with dg.build_sensor_context(instance=instance,
                                 resources={"lazyhippo": LazyhippoResource(namespace=ns, source=str(source))}) as context:
        result = source_changed(context)
    request = next(r for r in result.run_requests if r.tags["lazyhippo/namespace"] == ns)
    assert request.job_name == "index" and request.partition_key == ns and request.tags["lazyhippo/added"] == "20"
    assert request.run_config["resources"]["lazyhippo"]["config"] == {"namespace": ns, "source": str(source)}
    for partitions in result.dynamic_partitions_requests:  # as the daemon applies them; only this namespace's: the
        keys = [k for k in partitions.partition_keys if k == ns]  # instance is shared
        instance.add_dynamic_partitions(partitions.partitions_def_name, keys)
    run = clusters.wait(c, clusters.submit(c, request.job_name, request.run_config, request.tags), 600, instance)
    assert run.is_success and run.run_config["resources"]["lazyhippo"]["config"]["source"] == str(source)
    time.sleep(40)  # an evaluation of graph_after_documents: the graph was updated in the same run
    assert [r.run_id for r in instance.get_runs(dg.RunsFilter(tags={"dagster/partition": ns}))] == [run.run_id]
    assert len(_versions(minio_store, prefix, ns)) == 1  # published once, for the replicas
    with connect(Settings(home=c.warehouse_home, namespace=ns), read_only=True) as con:  # what readers open
        assert con.execute("SELECT count(*) FROM documents WHERE namespace = ?", [ns]).fetchone()[0] == 20
