"""The source sensor diffs documents against its cursor and names each change in its run key."""

from __future__ import annotations

import os
import shutil

import dagster as dg
import pytest

from lazyhippo.index import run_index
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.sources.files import read_source
from lazyhippo.stores.warehouse import connect
from lazyhippo_dagster.assets._partitions import RANGE_END, RANGE_START, partition_changes
from lazyhippo_dagster.resources import LazyhippoResource
from lazyhippo_dagster.sensors import source_changed


class Ticks:
    """Evaluates the sensor tick after tick, carrying the cursor like the daemon does."""

    def __init__(self, settings: Settings):
        self.resource = LazyhippoResource(home=str(settings.home), source=settings.source, namespace=settings.namespace)
        self.cursor: str | None = None
        self.keys: list[str] = []
        self.instance = dg.DagsterInstance.ephemeral()

    def tick(self):
        """The run request, or the skip reason; partitions requested are added to the instance."""
        with dg.build_sensor_context(cursor=self.cursor, resources={"lazyhippo": self.resource},
                                     instance=self.instance) as ctx:
            out = source_changed(ctx)
        self.cursor = out.cursor
        for req in out.dynamic_partitions_requests or []:  # applied as the sensor daemon does
            if isinstance(req, dg.DeleteDynamicPartitionsRequest):
                for key in req.partition_keys:
                    self.instance.delete_dynamic_partition(req.partitions_def_name, key)
            else:
                self.instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        if out.run_requests:
            self.keys += [r.run_key for r in out.run_requests]
            return out.run_requests[0]
        return out.skip_reason

    def documents(self) -> set[str]:
        return set(self.order())

    def order(self) -> list[str]:
        return list(self.instance.get_dynamic_partitions("documents"))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("sensor")
    shutil.copytree(SAMPLE_CORPUS, root / "c")
    settings = Settings(home=root / "h", source=str(root / "c"))
    run_index(settings)
    return settings


def test_an_unchanged_indexed_folder_requests_nothing(indexed):
    ticks = Ticks(indexed)
    first = ticks.tick()
    assert isinstance(first, dg.SkipReason) and "no change: 8 documents in 7 files" in first.skip_message
    assert not ticks.instance.get_dynamic_partitions("namespaces")
    os.utime(next((indexed.home.parent / "c").glob("*.txt")))  # a touch is no change of content
    assert isinstance(ticks.tick(), dg.SkipReason)


def test_add_delete_re_add_change_each_get_their_own_run_key(indexed, tmp_path):
    ticks = Ticks(indexed)
    assert isinstance(ticks.tick(), dg.SkipReason)
    new = indexed.home.parent / "c" / "harbour_light.txt"
    new.write_text("The Harbour Light stands above Eastbridge. Ada Fenwick painted it in 1901.\n")
    added = ticks.tick()
    assert isinstance(added, dg.RunRequest) and added.tags["lazyhippo/added"] == "1"
    assert "harbour_light.txt" in added.tags["lazyhippo/change"]
    doc_key = "default/harbour_light.txt"  # the key names the file
    # one run over the new document's partition; the indexed documents got their missing partitions too
    assert added.job_name == "index_documents" and added.tags[RANGE_START] == added.tags[RANGE_END] == doc_key
    indexed_keys = ticks.documents() - {doc_key}
    assert len(indexed_keys) == 8 and ticks.order()[-1] == doc_key
    assert isinstance(ticks.tick(), dg.SkipReason)  # nothing twice
    new.unlink()
    removed = ticks.tick()
    assert isinstance(removed, dg.RunRequest) and removed.tags["lazyhippo/removed"] == "1"
    assert removed.job_name == "index_graph" and removed.partition_key == "default"  # the graph run drops it
    assert ticks.documents() == indexed_keys  # ... and the partition went with the file
    new.write_text("The Harbour Light stands above Eastbridge. Ada Fenwick painted it in 1901.\n")
    again = ticks.tick()
    assert isinstance(again, dg.RunRequest) and again.tags["lazyhippo/added"] == "1"
    assert ticks.documents() == indexed_keys | {doc_key}
    rows = indexed.home.parent / "c" / "river_sell.jsonl"
    rows.write_text(rows.read_text().replace("flows", "runs", 1))
    changed = ticks.tick()
    assert isinstance(changed, dg.RunRequest) and changed.tags["lazyhippo/changed"] == "1"
    assert changed.tags["lazyhippo/added"] == changed.tags["lazyhippo/removed"] == "0"
    assert ticks.documents() == indexed_keys | {doc_key}  # a changed document keeps its partition, in place
    assert changed.tags[RANGE_START] == changed.tags[RANGE_END] in indexed_keys
    assert len(ticks.keys) == len(set(ticks.keys)) == 4
    rows.write_text(rows.read_text().replace("runs", "flows", 1))
    new.unlink()


def test_a_change_set_is_one_contiguous_range_at_the_end_of_the_partitions():
    held = ["kb/d_a", "kb/d_b", "other/d_x", "kb/d_c", "kb/d_gone"]
    docs = {"d_a", "d_b", "d_c", "d_d", "d_new"}
    delete, add, run = partition_changes(held, "kb", docs, {"d_b", "d_new"})
    assert run == ["kb/d_b", "kb/d_new"] and add[-2:] == run  # changed d_b is deleted and added again after
    assert set(delete) == {"kb/d_b", "kb/d_gone"}  # ... and a key of a document the source lost goes
    assert add == ["kb/d_d", "kb/d_b", "kb/d_new"]  # a missing unchanged document's key comes first
    assert "other/d_x" not in delete  # other namespaces are left alone
    # keys already contiguous (one key, or the same change staged again) stay where they are, in their order
    assert partition_changes(held, "kb", docs, {"d_c"}) == (["kb/d_gone"], ["kb/d_d", "kb/d_new"], ["kb/d_c"])
    staged = ["kb/d_a", "kb/d_c", "kb/d_d", "kb/d_b", "kb/d_new"]
    assert partition_changes(staged, "kb", docs, {"d_b", "d_new"}) == ([], [], ["kb/d_b", "kb/d_new"])
    assert partition_changes(held, "kb", docs, {"d_a", "d_c"})[2] == ["kb/d_a", "kb/d_c"]  # d_x between: moved


def test_a_new_namespace_requests_every_document(tmp_path):
    settings = Settings(home=tmp_path / "h", source=str(SAMPLE_CORPUS), namespace="fresh")
    ticks = Ticks(settings)
    out = ticks.tick()
    assert isinstance(out, dg.RunRequest) and out.tags["lazyhippo/added"] == "8" and out.job_name == "index_documents"
    assert out.tags[RANGE_START].startswith("fresh/") and out.tags[RANGE_END].startswith("fresh/")
    assert ticks.instance.get_dynamic_partitions("namespaces") == ["fresh"]
    docs, _ = read_source(SAMPLE_CORPUS, settings.max_file_bytes)
    assert ticks.documents() == {f"fresh/{d.source}" for d in docs}  # each named by its file (or JSONL row)


def test_the_run_key_names_the_change_not_the_folder(tmp_path):
    from lazyhippo.sources.changes import SourceChange, SourceState

    a = SourceChange(added={"d_1": "h1"}, files=("x.txt",))
    b = SourceChange(removed={"d_1": "h1"}, files=("x.txt",))
    state = SourceState(requested=3)
    assert state.run_key(a) != state.run_key(b) and state.run_key(a) != SourceState(requested=4).run_key(a)
    assert SourceState.decode(SourceState({}, 7).encode()).requested == 7


def test_an_index_run_reconciles_the_namespace_document_partitions(tmp_path, monkeypatch):
    """The nightly consistency pass (an index run) re-adds a lost partition and drops a stale one, and leaves
    other namespaces' partitions alone."""
    from lazyhippo_dagster.runner import execute, instance_for, run_config

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    home = tmp_path / "idx"
    instance = instance_for(home)
    instance.add_dynamic_partitions("documents", ["kb/d_gone", "other/d_kept"])
    cfg = run_config({"lazyhippo": {"home": str(home), "source": str(SAMPLE_CORPUS)},
                      "object_store": {"kind": "local", "root": str(tmp_path / "shared")}})
    assert execute("index", home, cfg, namespace="kb").success
    with connect(Settings(home=home, namespace="kb")) as con:
        ids = {f"kb/{s}" for (s,) in con.execute("SELECT source FROM documents WHERE namespace = 'kb'").fetchall()}
    assert len(ids) == 8 and set(instance.get_dynamic_partitions("documents")) == ids | {"other/d_kept"}
    lost = sorted(ids)[0]
    instance.delete_dynamic_partition("documents", lost)
    assert execute("index", home, cfg, namespace="kb").success
    assert set(instance.get_dynamic_partitions("documents")) == ids | {"other/d_kept"}


def test_after_a_documents_run_the_graph_runs_once_for_its_namespace(tmp_path):
    """A run that materialized document partitions (the sensor's, the schedule's, the asset catalog's) is followed
    by its namespace's graph run; one whose launcher (the CLI, the API) runs the graph itself is not, nor a run of
    the graph, nor a second one while a graph run of the namespace waits in the queue."""
    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.sensors import LAUNCHER_RUNS_GRAPH, graph_after_documents

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("documents", ["kb/a.txt", "kb/b.txt", "kb2/a.txt"])
    documents_job, catalog_job = defs.resolve_job_def("index_documents"), defs.resolve_implicit_global_asset_job_def()

    def follow(job, tags, selection=None):
        run = instance.create_run_for_job(job, tags=tags, status=dg.DagsterRunStatus.SUCCESS, asset_selection=selection)
        context = dg.build_run_status_sensor_context(sensor_name=graph_after_documents.name, dagster_instance=instance,
                                                     dagster_run=run, dagster_event=dg.DagsterEvent(
                                                         event_type_value="PIPELINE_SUCCESS", job_name=job.name))
        return run, graph_after_documents(context)

    for job, tags, selection, wanted in (
            (documents_job, {RANGE_START: "kb/a.txt", RANGE_END: "kb/b.txt"}, None, "kb"),
            (catalog_job, {"dagster/partition": "kb2/a.txt"}, frozenset({dg.AssetKey("chunks")}), "kb2"),
            (documents_job, {RANGE_START: "kb/a.txt", RANGE_END: "kb/b.txt", LAUNCHER_RUNS_GRAPH: "1"}, None, None),
            (defs.resolve_job_def("index_graph"), {"dagster/partition": "kb"}, None, None)):
        run, out = follow(job, tags, selection)
        if wanted is None:
            assert isinstance(out, dg.SkipReason)
        else:
            assert out.partition_key == wanted and out.run_key == f"graph-after-{run.run_id}"
            assert out.tags["lazyhippo/namespace"] == wanted
    instance.create_run_for_job(defs.resolve_job_def("index_graph"), tags={"dagster/partition": "kb"},
                                status=dg.DagsterRunStatus.NOT_STARTED)
    _, out = follow(documents_job, {RANGE_START: "kb/a.txt", RANGE_END: "kb/b.txt"})
    assert isinstance(out, dg.SkipReason) and "already waiting" in out.skip_message
