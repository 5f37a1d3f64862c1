"""The parts of the cluster deployment that need no server: the instance config, the executor choice, the
namespace tag on launched runs, and snapshots published through an object store and pulled by a replica."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.minio import MinioObjectStore
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.snapshots import SnapshotSync, parse_uri, upload


def test_the_cluster_instance_is_postgres_with_one_run_per_namespace_and_names_its_secrets_only(tmp_path, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config

    from lazyhippo_dagster.cluster import instance_yaml

    monkeypatch.setenv("LAZYHIPPO_PG_PASSWORD", "s3cret-value")
    (tmp_path / "dagster.yaml").write_text(instance_yaml())
    config, _ = dagster_instance_config(str(tmp_path))  # valid for Dagster
    assert "s3cret-value" not in (tmp_path / "dagster.yaml").read_text()
    assert config["storage"]["postgres"]["postgres_db"]["password"] == {"env": "LAZYHIPPO_PG_PASSWORD"}
    assert "module" not in (tmp_path / "dagster.yaml").read_text()  # Dagster's own classes, by their config keys
    assert config["run_queue"]["tag_concurrency_limits"] == [
        {"key": "lazyhippo/namespace", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]


def test_index_jobs_run_on_celery_in_a_cluster_process_and_stay_local_elsewhere(monkeypatch):
    import dagster as dg

    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.executors import index_executor

    monkeypatch.delenv("LAZYHIPPO_EXECUTOR", raising=False)  # the definitions loaded outside a cluster
    assert defs.resolve_job_def("index").executor_def is dg.multi_or_in_process_executor
    assert defs.resolve_job_def("index_graph").executor_def is dg.in_process_executor
    assert index_executor(dg.in_process_executor) is dg.in_process_executor
    monkeypatch.setenv("LAZYHIPPO_EXECUTOR", "celery")  # a cluster's process: dagster-celery's own executor
    celery = index_executor(dg.in_process_executor)
    assert celery.name == "lazyhippo_celery" and celery.get_requirements({})  # distributed: persistent storage


def test_the_celery_app_needs_the_broker_from_the_environment(monkeypatch):
    from lazyhippo_dagster.executors import celery_app_args

    monkeypatch.delenv("LAZYHIPPO_CELERY_BROKER", raising=False)
    with pytest.raises(ValueError, match="LAZYHIPPO_CELERY_BROKER"):
        celery_app_args()
    monkeypatch.setenv("LAZYHIPPO_CELERY_BROKER", "redis://:pw@127.0.0.1:1/0")
    monkeypatch.setenv("LAZYHIPPO_CELERY_BACKEND", "redis://:pw@127.0.0.1:1/1")
    args = celery_app_args("warehouse")
    assert args["config_source"]["task_default_queue"] == "warehouse"
    assert args["config_source"]["task_acks_late"] and args["config_source"]["task_reject_on_worker_lost"]


def test_warehouse_steps_go_to_the_warehouse_queue_and_extraction_batches_do_not():
    from lazyhippo_dagster.definitions import defs

    job = defs.resolve_job_def("index")
    queues = {node.name: node.tags.get("dagster-celery/queue") for node in job.graph.node_dict["extractions"].definition.nodes}
    assert queues == {"plan_extraction_batches": "warehouse", "extract_documents": None, "load_extraction_parts": "warehouse"}
    assert job.graph.node_named("documents").tags["dagster-celery/queue"] == "warehouse"


def test_runs_the_product_launches_carry_their_namespace():
    import dagster as dg

    from lazyhippo.sources.changes import SourceChange, SourceState, scan_source
    from lazyhippo_dagster.sensors import change_request

    state, change = scan_source(Path(SAMPLE_CORPUS), 20_000_000, SourceState())
    kb = Settings(namespace="kb", source=str(SAMPLE_CORPUS))
    for request in (change_request(kb, state, SourceChange(removed={"gone.txt": "x"})), change_request(kb, state, change)):
        assert request.tags["lazyhippo/namespace"] == request.partition_key == "kb" and request.job_name == "index"


def test_on_a_cluster_sensors_watch_the_instance_namespaces_with_the_settings_of_their_runs(tmp_path, monkeypatch):
    """The daemon's home holds no warehouse: the namespaces and their sources come from the instance, the baseline
    is empty, and the run request carries the settings for the workers."""
    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRun, make_new_run_id

    from lazyhippo_dagster.resources import LazyhippoResource
    from lazyhippo_dagster.schedules import nightly_audit, nightly_reindex
    from lazyhippo_dagster.sensors import source_changed

    monkeypatch.setenv("LAZYHIPPO_EXECUTOR", "celery")  # a cluster process (cluster_environment)
    monkeypatch.setenv("LAZYHIPPO_HOME", str(tmp_path / "daemon"))
    config = {"namespace": "kb", "source": str(SAMPLE_CORPUS), "chunk_size": 300}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("namespaces", ["kb", "never_ran"])
        instance.add_run(DagsterRun(job_name="index_graph", run_id=make_new_run_id(), tags={"lazyhippo/namespace": "kb"},
                                    run_config={"resources": {"lazyhippo": {"config": config}}}))
        watched = LazyhippoResource().watched(instance)
        assert [(s.namespace, s.source, s.chunk_size, s.home) for s in watched] == [
            ("kb", str(SAMPLE_CORPUS), 300, (tmp_path / "daemon").resolve())]
        with dg.build_sensor_context(instance=instance, resources={"lazyhippo": LazyhippoResource()}) as context:
            result = source_changed(context)
        with dg.build_schedule_context(instance=instance, resources={"lazyhippo": LazyhippoResource()},
                                       scheduled_execution_time=datetime(2026, 1, 1, 3)) as context:
            nightly = nightly_reindex(context) + nightly_audit(context)
    [request] = result.run_requests
    assert request.job_name == "index" and request.tags["lazyhippo/added"] == "8"  # every document
    assert request.run_config == {"resources": {"lazyhippo": {"config": config}}}
    assert [(r.partition_key, r.run_config) for r in nightly] == [("kb", request.run_config)] * 2


def test_a_replica_pulls_the_newest_snapshot_when_its_manifest_changes_and_keeps_it_when_the_store_is_gone(tmp_path):
    store = LocalObjectStore(tmp_path / "bucket")
    snapshot = tmp_path / "kb.duckdb"
    snapshot.write_bytes(b"first")
    first = upload(store, "snaps", "kb", snapshot)
    local = tmp_path / "replica" / "published"
    sync = SnapshotSync("s3://bucket/snaps", lambda ns: local / f"{ns}.duckdb", store=store)
    assert sync.pull() == ["kb"] and (local / "kb.duckdb").read_bytes() == b"first"
    assert sync.pull() == []  # same manifest: nothing fetched
    snapshot.write_bytes(b"second")
    second = upload(store, "snaps", "kb", snapshot)
    manifest = json.loads(store.get("snaps/kb/manifest.json"))
    assert manifest["version"] == second["version"] != first["version"] and store.get(manifest["key"]) == b"second"
    assert sync.pull() == ["kb"] and (local / "kb.duckdb").read_bytes() == b"second"
    assert sync.status()["reachable"] and sync.status()["versions"] == {"kb": second["version"]}

    sync.store = MinioObjectStore("127.0.0.1:1", "bucket", "user", "password", timeout=1, retries=0)  # nothing listens
    assert sync.pull() == []
    status = sync.status()
    assert status["reachable"] is False and "unreachable" in status["state"] and status["error"]
    assert (local / "kb.duckdb").read_bytes() == b"second" and status["versions"] == {"kb": second["version"]}


def test_a_snapshot_whose_content_does_not_match_its_manifest_is_not_swapped_in(tmp_path):
    store = LocalObjectStore(tmp_path / "bucket")
    (tmp_path / "kb.duckdb").write_bytes(b"good")
    manifest = upload(store, "", "kb", tmp_path / "kb.duckdb")
    store.put(manifest["key"], b"tampered")
    sync = SnapshotSync("s3://bucket", lambda ns: tmp_path / "out" / f"{ns}.duckdb", store=store)
    assert sync.pull() == [] and not (tmp_path / "out" / "kb.duckdb").exists()
    assert "md5" in sync.status()["error"]


@pytest.mark.parametrize("uri", ["bucket/prefix", "s3://", "http://host/x"])
def test_a_snapshot_uri_that_is_not_s3_is_refused_by_name(uri):
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        parse_uri(uri)


def test_cluster_up_refuses_zero_workers(tmp_path):
    from lazyhippo_dagster.cluster import up

    with pytest.raises(ValueError, match="--workers 0"):
        up(tmp_path, workers=0)


def test_a_celery_pool_process_extracts_in_itself(monkeypatch):
    """Celery's pool processes are daemonic: starting the per-core extraction processes there would fail."""
    import multiprocessing

    from lazyhippo.models.extractors import extract_processes

    monkeypatch.setenv("LAZYHIPPO_THREADS", "2")
    assert extract_processes() == 2
    monkeypatch.setitem(multiprocessing.current_process()._config, "daemon", True)
    assert extract_processes() == 1
