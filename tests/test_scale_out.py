"""Extraction fans out in batches over worker processes, through per-document parts in the object store."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from lazyhippo.index import run_index
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stages.chunks import build_chunks
from lazyhippo.stages.documents import ingest_documents
from lazyhippo.stages.extractions import collect_parts, extract_batch, plan_batches
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import IndexIncomplete, connect, index_notice, snapshot_path
from lazyhippo_dagster.runner import index_run, instance_for, run_config
from tests.services_fixtures import minio_store, namespaces  # noqa: F401 - fixtures
from tests.test_lifecycle import CountingExtractor, graph_difference, graph_snapshot

EXTRACTED = ("extracted_entities", "extracted_relations", "extracted_facts")


def extracted(settings: Settings) -> dict[str, list]:
    with connect(settings) as con:
        return {t: sorted(con.execute(f"SELECT * EXCLUDE (namespace) FROM {t} WHERE namespace = ?",
                                      [settings.namespace]).fetchall(), key=repr) for t in EXTRACTED}


@pytest.fixture(scope="module")
def library_index(tmp_path_factory):
    settings = Settings(home=tmp_path_factory.mktemp("library"), source=str(SAMPLE_CORPUS))
    run_index(settings)
    return settings


def test_multiprocess_index_extracts_batches_in_parallel_processes(tmp_path, monkeypatch, library_index):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    home = tmp_path / "idx"
    cfg = run_config({"lazyhippo": {"home": str(home), "source": str(SAMPLE_CORPUS)},
                      "object_store": {"kind": "local", "root": str(tmp_path / "shared")}})
    cfg["ops"] = {"extractions": {"ops": {"plan_extraction_batches": {"config": {"batch_chunks": 3}}}}}
    instance = instance_for(home)
    run = index_run(instance, home, cfg, {}, "kb", processes=2)
    assert run.success and run.dagster_run.job_name == "index"
    starts = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
    batch_steps = {e.dagster_event.step_key: e.dagster_event.pid for e in starts if "extract_documents[" in e.dagster_event.step_key}
    assert len(batch_steps) >= 3 and len(set(batch_steps.values())) >= 2  # every step in its own process
    kb = Settings(home=home, namespace="kb")
    assert extracted(kb) == extracted(library_index)  # the same rows as the in-process library path
    assert not graph_difference(graph_snapshot(kb), graph_snapshot(library_index))
    assert not list((tmp_path / "shared" / "kb").glob("parts/extractions/*.parquet"))  # loaded, then deleted
    assert not list((tmp_path / "shared" / "kb").glob("work/*/*.parquet"))  # batch objects cleaned up
    kept = Path(instance.storage_directory()) / run.run_id  # the run succeeded: the steps' pickles are gone
    assert kept.is_dir() and {p.name for p in kept.iterdir() if p.is_dir()} <= {"compute_logs"}
    runs = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": "kb"}))
    assert runs and runs[0].status == dg.DagsterRunStatus.SUCCESS


def _graph_assets() -> list[dg.AssetKey]:
    from lazyhippo_dagster.definitions import defs

    return sorted(defs.resolve_job_def("index_graph").asset_layer.executable_asset_keys)


def test_a_graph_run_on_processes_publishes_only_after_its_last_step(tmp_path, monkeypatch, library_index):
    """Each step of the multiprocess executor sets its resources up in its own process: still, readers see the
    graph only when the whole run succeeded, and a failed run's re-execution publishes it."""
    from lazyhippo_dagster.definitions import defs, index_job_def
    from lazyhippo_dagster.staging import add_namespace_partition

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    home = tmp_path / "idx"
    settings = Settings(home=home, namespace="kb", source=str(SAMPLE_CORPUS))
    resources = {"lazyhippo": {"home": str(home), "source": str(SAMPLE_CORPUS)},
                 "object_store": {"kind": "local", "root": str(tmp_path / "shared")}}
    instance = instance_for(home)
    add_namespace_partition(instance, "kb")
    docs = defs.resolve_job_def("index").execute_in_process(
        run_config=run_config(resources), instance=instance, partition_key="kb",
        asset_selection=[dg.AssetKey(k) for k in ("documents", "chunks", "extractions")])
    assert docs.success and not snapshot_path(settings).exists()  # new documents wait for their graph run

    not_a_folder = tmp_path / "not_a_folder"
    not_a_folder.write_text("")  # the exports step, the last table step, fails writing under it
    processes = {"execution": {"config": {"multiprocess": {"max_concurrent": 2, "start_method": {
        "forkserver": {"preload_modules": ["lazyhippo_dagster.definitions"]}}}}}}
    failing = {**run_config({**resources, "object_store": {"kind": "local", "root": str(not_a_folder)}}), **processes}
    job = dg.reconstructable(index_job_def)  # its graph-wide assets, one process per step
    with dg.execute_job(job, instance, run_config=failing, tags={"dagster/partition": "kb"}, raise_on_error=False,
                        asset_selection=_graph_assets()) as failed:
        assert not failed.success
        failures = {e.step_key for e in failed.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE}
        succeeded = {e.step_key for e in failed.all_events if e.event_type == dg.DagsterEventType.STEP_SUCCESS}
    assert failures == {"exports"} and {"entity_graph_tables", "communities", "community_summaries"} <= succeeded
    assert not snapshot_path(settings).exists()  # every graph table was written, none published
    with pytest.raises(IndexIncomplete):
        index_notice(settings)

    with dg.execute_job(job, instance, run_config={**run_config(resources), **processes}, tags={"dagster/partition": "kb"},
                        reexecution_options=dg.ReexecutionOptions.from_failure(failed.run_id, instance)) as again:
        assert again.success
        published = [e for e in again.get_asset_materialization_events()
                     if e.asset_key == dg.AssetKey("published_snapshot")]
    assert len(published) == 1 and index_notice(settings) is None
    assert not graph_difference(graph_snapshot(settings), graph_snapshot(library_index))  # what readers open: the whole graph


class ReadCountingStore(LocalObjectStore):
    def __init__(self, root):
        super().__init__(root)
        self.reads: list[str] = []

    def get(self, key: str) -> bytes:
        self.reads.append(key)
        return super().get(key)


def planned(settings: Settings, objects, run_id: str, batch_chunks: int = 3):
    """The documents and chunks of `settings`' source in its warehouse, and the extraction batches planned."""
    with connect(settings) as con:
        ingest_documents(settings, con)
        build_chunks(settings, con)
        return plan_batches(settings, con, objects, run_id, batch_chunks=batch_chunks)


def test_a_run_killed_mid_way_loses_nothing_and_re_extracts_nothing_done(tmp_path, library_index):
    corpus = shutil.copytree(SAMPLE_CORPUS, tmp_path / "c")
    settings = Settings(home=tmp_path / "h", source=str(corpus))
    objects = ReadCountingStore(tmp_path / "shared")
    batches, figures = planned(settings, objects, "run1")
    assert figures["documents_to_extract"] == 8 and len(batches) >= 3
    first = CountingExtractor()
    extract_batch(settings, objects, batches[0].keys, first)  # ... and the run dies here
    done = set(first.seen)
    shutil.rmtree(settings.cache_dir)  # the next run lands on another machine: no local cache to help
    again = CountingExtractor()
    with connect(settings) as con:
        batches2, _ = plan_batches(settings, con, objects, "run2", batch_chunks=3)
        objects.reads.clear()
        stats = [extract_batch(settings, objects, b.keys, again) for b in batches2]
        out = collect_parts(settings, con, objects, batches2, stats)
    assert done and not done & set(again.seen)  # the finished batch's parts were kept
    # only the parts the planner listed are read: a document without one costs no request
    assert len([k for k in objects.reads if "/parts/extractions/" in k]) == len(batches[0].doc_ids)
    assert out["documents_extracted"] == 8 and sum(s["parts_kept"] for s in stats) == len(batches[0].doc_ids)
    assert extracted(settings) == extracted(library_index)
    assert not objects.list("default/parts/")  # loaded into the warehouse: the parts are no longer kept
    with connect(settings) as con:
        batches3, figures3 = plan_batches(settings, con, objects, "run3")
    assert not batches3 and figures3["documents_unchanged"] == 8


def test_collecting_reads_one_bundle_per_object_of_a_batch_not_one_object_per_document(tmp_path, library_index):
    settings = Settings(home=tmp_path / "h", source=str(SAMPLE_CORPUS))
    objects = ReadCountingStore(tmp_path / "shared")
    batches, _ = planned(settings, objects, "r")
    stats = [extract_batch(settings, objects, b.keys) for b in batches]
    objects.reads.clear()
    with connect(settings) as con:
        out = collect_parts(settings, con, objects, batches, stats)
    assert out["documents_extracted"] == 8
    assert sorted(objects.reads) == sorted(k for s in stats for k, _ in s["bundles"])  # each read once
    assert len(objects.reads) == sum(len(b.keys) for b in batches) < 8
    assert extracted(settings) == extracted(library_index)
    assert not objects.list("default/work/")  # the batches' objects and bundles go once loaded
    # results without bundles (a step output of another version): the parts are read from the store instead
    again = Settings(home=tmp_path / "h2", source=str(SAMPLE_CORPUS))
    batches, _ = planned(again, objects, "r2")
    stats = [{k: v for k, v in extract_batch(again, objects, b.keys).items() if k != "bundles"} for b in batches]
    objects.reads.clear()
    with connect(again) as con:
        collect_parts(again, con, objects, batches, stats)
    assert len([k for k in objects.reads if "/parts/extractions/" in k]) == 8
    assert extracted(again) == extracted(library_index)


def test_batches_stay_few_and_even_and_a_step_holds_one_object_of_its_batch_at_a_time(tmp_path, library_index):
    """However many chunks a batch holds, its step extracts, writes and hands on one object of about
    `batch_chunks` chunks at a time."""
    settings = Settings(home=tmp_path / "h", source=str(SAMPLE_CORPUS))
    objects = LocalObjectStore(tmp_path / "shared")
    with connect(settings) as con:
        ingest_documents(settings, con)
        build_chunks(settings, con)
        sizes = dict(con.execute("SELECT doc_id, count(*) FROM chunks GROUP BY doc_id").fetchall())
        batches, figures = plan_batches(settings, con, objects, "r", batches=2, batch_chunks=2)
    assert figures["batches"] == len(batches) == 2 and all(len(b.keys) > 1 for b in batches)
    per_batch = [sum(sizes[d] for d in b.doc_ids) for b in batches]
    assert abs(per_batch[0] - per_batch[1]) <= max(sizes.values())  # even, to one document
    seen = CountingExtractor()
    calls = []
    seen.submit_json = lambda chunks: calls.append(len(chunks)) or CountingExtractor.submit_json(seen, chunks)
    stats = [extract_batch(settings, objects, b.keys, seen) for b in batches]
    assert len(calls) == sum(len(b.keys) for b in batches) and max(calls) < max(per_batch)
    assert max(calls) <= 2 - 1 + max(sizes.values())  # an object closes once it holds batch_chunks
    assert [len(s["bundles"]) for s in stats] == [len(b.keys) for b in batches]
    with connect(settings) as con:
        collect_parts(settings, con, objects, batches, stats)
    assert extracted(settings) == extracted(library_index)


def test_a_step_submits_its_next_object_before_it_writes_the_parts_of_one(tmp_path):
    """The workers extract the next object while the step writes one's parts: they never wait on those writes."""
    settings = Settings(home=tmp_path / "h", source=str(SAMPLE_CORPUS))
    with connect(settings) as con:
        ingest_documents(settings, con)
        build_chunks(settings, con)
        (batch,), _ = plan_batches(settings, con, LocalObjectStore(tmp_path / "shared"), "r", batches=1,
                                   batch_chunks=2)
    events = []

    class Recorded(LocalObjectStore):
        def put(self, key, data):
            events.append("part" if "/parts/" in key else "object")
            return super().put(key, data)

    seen = CountingExtractor()
    seen.submit_json = lambda chunks: events.append("submit") or CountingExtractor.submit_json(seen, chunks)
    stats = extract_batch(settings, Recorded(tmp_path / "shared"), batch.keys, seen)
    assert len(batch.keys) > 2 and events.count("submit") == len(batch.keys)
    assert events[:events.index("part")] == ["submit", "submit"]
    assert events[-1] == "object" and events[-2] == "part"  # the last object's parts, then its bundle
    assert stats["computed"] == len(seen.seen)


def test_parts_a_home_kept_from_before_go_once_their_documents_are_loaded(tmp_path):
    from lazyhippo.stages.extractions import part_key

    settings = Settings(home=tmp_path / "h", source=str(SAMPLE_CORPUS))
    objects = LocalObjectStore(tmp_path / "shared")
    batches, _ = planned(settings, objects, "r")
    with connect(settings) as con:
        collect_parts(settings, con, objects, batches, [extract_batch(settings, objects, b.keys) for b in batches])
        loaded = con.execute("SELECT doc_id FROM extraction_parts").fetchall()[0][0]
    objects.put(part_key("default", loaded), b"kept by an older version")
    objects.put(part_key("default", "never-loaded"), b"a killed run's part")
    with connect(settings) as con:
        batches, _ = plan_batches(settings, con, objects, "r2")
        collect_parts(settings, con, objects, batches, [])
    assert not batches and objects.list("default/parts/") == [part_key("default", "never-loaded")]


def test_delete_drops_the_extraction_part_so_a_re_added_document_is_extracted_again(tmp_path):
    from lazyhippo.stages.extractions import part_key
    from lazyhippo.stages.lifecycle import delete_documents
    from lazyhippo.stores.graphs import EmbeddedGraphStore

    settings = Settings(home=tmp_path / "h", source=str(shutil.copytree(SAMPLE_CORPUS, tmp_path / "c")))
    objects = LocalObjectStore(tmp_path / "shared")

    def index_by_parts() -> dict:
        with connect(settings) as con:
            ingest_documents(settings, con)
            build_chunks(settings, con)
            batches, _ = plan_batches(settings, con, objects, "r")
            return collect_parts(settings, con, objects, batches, [extract_batch(settings, objects, b.keys) for b in batches])

    index_by_parts()
    with connect(settings) as con:
        doc = con.execute("SELECT doc_id FROM documents WHERE source = 'tomas_reyes.txt'").fetchone()[0]
        delete_documents(settings, con, [doc], EmbeddedGraphStore(), objects)
    assert not (tmp_path / "shared" / part_key("default", doc)).exists()
    with connect(settings) as con:
        con.execute("DELETE FROM deleted_documents")  # forget the deletion: the next ingest reads the file again
    out = index_by_parts()
    assert out["documents_extracted"] == 1
    with connect(settings) as con:
        assert con.execute("SELECT count(*) FROM extracted_entities WHERE chunk_id IN "
                           "(SELECT chunk_id FROM chunks WHERE doc_id = ?)", [doc]).fetchone()[0] > 0


@pytest.mark.services
def test_parts_through_minio_give_the_same_rows(tmp_path, minio_store, namespaces, library_index):  # noqa: F811
    ns = namespaces("parts")
    settings = Settings(home=tmp_path / "h", namespace=ns, source=str(SAMPLE_CORPUS))
    with connect(settings) as con:
        ingest_documents(settings, con)
        build_chunks(settings, con)
        batches, _ = plan_batches(settings, con, minio_store, "r1", batch_chunks=4)
        stats = [extract_batch(settings, minio_store, b.keys) for b in batches]
        assert len(minio_store.list(f"{ns}/parts/extractions/")) == 8
        collect_parts(settings, con, minio_store, batches, stats)
    # the warehouse holds the parts' rows: they go, with the batches' work lists
    assert not minio_store.list(f"{ns}/parts/extractions/") and not minio_store.list(f"{ns}/work/")
    ours, theirs = extracted(settings), extracted(library_index)
    assert ours == theirs


@pytest.mark.services
def test_step_outputs_in_minio_go_with_a_successful_run_and_stay_with_a_failed_one(tmp_path, monkeypatch, minio_store,  # noqa: F811
                                                                                    namespaces):  # noqa: F811
    from lazyhippo_dagster.definitions import defs, index_job_def
    from lazyhippo_dagster.resources import ObjectStoreResource
    from lazyhippo_dagster.sensors import remove_step_outputs
    from lazyhippo_dagster.staging import add_namespace_partition

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.setenv("LAZYHIPPO_OBJECT_STORE", "minio")  # as on a cluster: every process's environment
    monkeypatch.setenv("MINIO_BUCKET", minio_store.bucket)
    ns, home = namespaces("outputs"), tmp_path / "idx"
    cfg = {**run_config({"lazyhippo": {"home": str(home), "source": str(SAMPLE_CORPUS)}}),
           "execution": {"config": {"in_process": {}}}}
    instance = instance_for(home)
    add_namespace_partition(instance, ns)
    tags = {"dagster/partition": ns}
    job = dg.reconstructable(index_job_def)

    def outputs(run_id: str) -> list[str]:
        return minio_store.list(f"dagster/{run_id}/")

    def sensed(run_id: str) -> None:
        """One evaluation of the sensor on a run's success, as the daemon does it."""
        event = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_SUCCESS)[0].dagster_event
        remove_step_outputs(dg.build_run_status_sensor_context(
            sensor_name=remove_step_outputs.name, dagster_instance=instance, dagster_run=instance.get_run_by_id(run_id),
            dagster_event=event, resources={"object_store": ObjectStoreResource()}))

    with dg.execute_job(job, instance, run_config=cfg, tags=tags) as done:
        assert done.success and any(".plan_extraction_batches/" in k for k in outputs(done.run_id))
    sensed(done.run_id)
    assert not outputs(done.run_id)

    def broken(*args, **kwargs):
        raise RuntimeError("the warehouse went away")

    with monkeypatch.context() as m:  # the last step fails after the batches were planned and extracted
        m.setattr("lazyhippo_dagster.assets.extractions.collect_parts", broken)
        failed = defs.resolve_job_def("index").execute_in_process(
            run_config=cfg, instance=instance, partition_key=ns, raise_on_error=False)
    assert not failed.success
    kept = outputs(failed.run_id)
    assert kept  # what the re-execution from failure loads
    with dg.execute_job(job, instance, run_config=cfg, tags=tags,
                        reexecution_options=dg.ReexecutionOptions.from_failure(failed.run_id, instance)) as again:
        assert again.success
    assert outputs(failed.run_id) == kept  # until the bucket's expiry rule (set by `lazyhippo cluster up`)
    minio_store.delete_prefix(f"dagster/{failed.run_id}/")


def test_collecting_holds_a_bounded_group_of_extractions_and_no_chunk_text(tmp_path, monkeypatch, library_index):
    """The collecting step decodes and inserts the extractions of about STORE_BATCH chunks at a time, and knows
    the corpus's chunks by ids and hashes only: none of their texts is read."""
    import lazyhippo.stages.extractions as ex

    settings = Settings(home=tmp_path / "h", source=str(SAMPLE_CORPUS))
    objects = LocalObjectStore(tmp_path / "shared")
    batches, _ = planned(settings, objects, "r")
    stats = [extract_batch(settings, objects, b.keys) for b in batches]
    with connect(settings) as con:
        sizes = dict(con.execute("SELECT doc_id, count(*) FROM chunks GROUP BY doc_id").fetchall())
    groups: list[int] = []
    insert = ex._insert_parts
    monkeypatch.setattr(ex, "STORE_BATCH", 2)
    monkeypatch.setattr(ex, "_insert_parts", lambda con, ns, rows: groups.append(len(rows)) or insert(con, ns, rows))
    monkeypatch.setattr(ex, "load_chunks", lambda *a, **k: pytest.fail("the collecting step read the chunks' texts"))
    with connect(settings) as con:
        collect_parts(settings, con, objects, batches, stats)
    assert sum(groups) == sum(sizes.values()) and len(groups) > 2
    assert max(groups) <= 2 - 1 + max(sizes.values())  # a group closes once it holds STORE_BATCH chunks
    assert extracted(settings) == extracted(library_index)


def test_rows_inserted_in_one_transaction_are_not_held_until_it_commits(tmp_path):
    """DuckDB keeps a registered Arrow table alive until the transaction commits; `insert_rows` hands it a reader
    of batches instead, so a loop of inserts in one transaction holds one table's rows at a time."""
    import pyarrow as pa

    from lazyhippo.stores.warehouse import insert_rows, transaction

    settings = Settings(home=tmp_path / "h")
    n = 20_000
    with connect(settings) as con, transaction(con):
        before = pa.total_allocated_bytes()
        for i in range(4):
            insert_rows(con, "extraction_failures", pa.table({
                "namespace": ["default"] * n, "chunk_id": [f"c{i}-{j}" for j in range(n)], "reason": ["x" * 100] * n}))
            assert pa.total_allocated_bytes() - before < n * 50  # not one table's 2 MB of reasons, let alone four
        assert con.execute("SELECT count(*) FROM extraction_failures").fetchone()[0] == 4 * n


def test_extracted_rows_are_the_extractions_values_in_their_order(tmp_path):
    """The rows DuckDB unnests from the extractions' JSON are the Python values, row for row and in order: text
    beyond the basic plane, quotes and escapes, floats that JSON round-trips, a relation with and without a type,
    empty lists, a failed chunk. A description that is the start of one of its chunk's facts (the first such fact)
    is stored as the fact's index, any other as text; a name among that fact's names as its place there, any other
    as text; all read back as the extraction gave them. A fact's text is stored as its place in its chunk's text
    (in characters), one not found there whole, and both read back as given."""
    from lazyhippo.models.extractors import Extraction, encode
    from lazyhippo.stages.extractions import _figures, _insert_extractions
    from lazyhippo.stores.warehouse import described, fact_texts

    odd = 'Zoë "quoted" \\ back\tslash 𝔘 😀 — ✓'
    results = {
        "c1": Extraction(entities=[{"name": odd, "type": "PERSON", "description": (odd * 40)[:300]},
                                   {"name": "B", "type": None, "description": ""},
                                   {"name": "D", "type": "ORG", "description": "two"}],
                         relations=[{"source": odd, "target": "B", "description": "d", "weight": 0.1 + 0.2},
                                    {"source": "B", "target": odd, "description": "", "weight": 2.5,
                                     "type": "PART_OF"},
                                    {"source": "B", "target": "D", "description": "one", "weight": 1.0}],
                         facts=[{"text": "one", "names": [odd, "B"]}, {"text": "two", "names": []},
                                {"text": "two", "names": ["D"]}, {"text": odd * 40, "names": [odd]}]),
        "c2": Extraction(),
        "c3": Extraction(entities=[{"name": "C", "type": "ORG", "description": "one"}],
                         facts=[{"text": "t", "names": ["C"]}]),
    }
    sources = {"c1": f"𝔘 two. {odd * 40} one", "c2": "", "c3": "NO SUCH SENTENCE"}
    settings = Settings(home=tmp_path / "h")
    with connect(settings) as con:
        con.executemany("INSERT INTO chunks (namespace, chunk_id, doc_id, title, position, text, content_hash, "
                        "n_tokens) VALUES ('default', ?, 'd', 't', ?, ?, 'h', 1)",
                        [[c, i, t] for i, (c, t) in enumerate(sources.items())])
        figures = _figures(_insert_extractions(con, "default", {c: encode(ex) for c, ex in results.items()},
                                               {"c4": "ValueError: bad"}, sources))
        got = {t: con.execute(f"SELECT * EXCLUDE (namespace) FROM {t} ORDER BY rowid").fetchall()
               for t in ("extracted_entities", "extracted_relations", "extracted_facts", "extraction_failures")}
        facts = con.execute(f"SELECT * EXCLUDE (namespace) FROM {fact_texts('extracted_facts')} "
                            "ORDER BY chunk_id, fact_idx").fetchall()
        read = {t: sorted(con.execute(f"SELECT * EXCLUDE (namespace) FROM ({described(t)})", {"ns": "default"})
                          .fetchall(), key=repr) for t in ("extracted_entities", "extracted_relations")}
    assert got["extracted_entities"] == [("c1", None, "PERSON", None, 3, 1), ("c1", "B", None, "", None, None),
                                         ("c1", "D", "ORG", None, 1, None), ("c3", "C", "ORG", "one", None, None)]
    assert got["extracted_relations"] == [("c1", odd, "B", "d", 0.1 + 0.2, None, None, None, None),
                                          ("c1", "B", odd, "", 2.5, "PART_OF", None, None, None),
                                          ("c1", None, "D", None, 1.0, None, 0, 2, None)]
    assert read["extracted_entities"] == sorted([(c, e["name"], e["type"], e["description"])
                                                 for c, ex in results.items() for e in ex.entities], key=repr)
    assert read["extracted_relations"] == sorted([(c, r["source"], r["target"], r["weight"], r.get("type"),
                                                   r["description"]) for c, ex in results.items()
                                                  for r in ex.relations], key=repr)
    assert got["extracted_facts"] == [("c1", 0, 7 + 40 * len(odd) + 1, 3, None, [odd, "B"]),
                                      ("c1", 1, 2, 3, None, []), ("c1", 2, 2, 3, None, ["D"]),
                                      ("c1", 3, 7, 40 * len(odd), None, [odd]), ("c3", 0, None, None, "t", ["C"])]
    assert facts == [(c, i, f["text"], f["names"]) for c, ex in results.items() for i, f in enumerate(ex.facts)]
    assert got["extraction_failures"] == [("c4", "ValueError: bad")]
    assert figures == {"raw_entities": 4, "raw_relations": 3, "facts": 5}
