"""The per-document assets are partitioned by document; a run covers a key range of one namespace,
and the graph run that follows drops the documents whose file vanished."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.warehouse import connect
from lazyhippo_dagster.assets._partitions import RANGE_END, RANGE_START
from lazyhippo_dagster.event_log import BatchedSqliteEventLogStorage, enable_event_batches
from lazyhippo_dagster.runner import index_chain, run_config


def _key(source: str, namespace: str = "default") -> str:
    return f"{namespace}/{source}"  # the key names the file


def _hashes(settings: Settings) -> dict[str, str]:
    with connect(settings) as con:
        return dict(con.execute("SELECT source, content_hash FROM documents WHERE namespace = ?", [settings.namespace]).fetchall())


@pytest.fixture()
def corpus(tmp_path) -> tuple[Path, Path, dict]:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_CORPUS, src)
    home = tmp_path / "home"
    return src, home, run_config({"lazyhippo": {"home": str(home), "source": str(src)}})


def test_an_index_runs_documents_over_their_partitions_then_the_graph_once(corpus):
    src, home, config = corpus
    instance = dg.DagsterInstance.ephemeral()
    first = index_chain(instance, home, config, {}, "default")
    assert [r.dagster_run.job_name for r in first.results] == ["index_documents", "index_graph"]
    assert len(instance.get_materialized_partitions(dg.AssetKey("extractions"))) == 8
    assert instance.get_materialized_partitions(dg.AssetKey("entities")) == {"default"}
    (src / "tomas_reyes.txt").write_text((src / "tomas_reyes.txt").read_text() + "\nHe retired in 1952.\n")
    second = index_chain(instance, home, config, {}, "default")
    docs_run = second.results[0].dagster_run
    assert docs_run.tags[RANGE_START] == docs_run.tags[RANGE_END] == _key("tomas_reyes.txt")  # that document only
    extraction = next(e.event_specific_data.materialization for e in second.results[0].get_asset_materialization_events()
                      if e.asset_key.to_user_string() == "extractions")
    assert extraction.partition == _key("tomas_reyes.txt")
    assert extraction.metadata["dagster/row_count"].value > 0 and "entities" in extraction.metadata


def test_a_run_over_one_document_partition_leaves_the_other_documents_as_they_are(corpus):
    src, home, config = corpus
    from lazyhippo_dagster.definitions import defs

    instance = dg.DagsterInstance.ephemeral()
    assert index_chain(instance, home, config, {}, "default").success
    before = _hashes(Settings(home=home))
    for name in ("tomas_reyes.txt", "eastbridge_history.txt"):
        (src / name).write_text((src / name).read_text() + "\nA later note.\n")
    one = defs.resolve_job_def("index_documents").execute_in_process(
        run_config=config, instance=instance, partition_key=_key("tomas_reyes.txt"), raise_on_error=False)
    assert one.success
    after = _hashes(Settings(home=home))
    assert after["tomas_reyes.txt"] != before["tomas_reyes.txt"]  # the run's document is read again ...
    assert after["eastbridge_history.txt"] == before["eastbridge_history.txt"]  # ... the other changed one is not
    assert {k: v for k, v in after.items() if k != "tomas_reyes.txt"} == {k: v for k, v in before.items() if k != "tomas_reyes.txt"}


def test_a_vanished_file_leaves_with_the_graph_run_and_comes_back_with_the_file(corpus, tmp_path):
    src, home, config = corpus
    instance = dg.DagsterInstance.ephemeral()
    assert index_chain(instance, home, config, {}, "default").success
    kept = tmp_path / "kept.txt"
    shutil.move(src / "visitor_form.txt", kept)
    gone = index_chain(instance, home, config, {}, "default")
    assert [r.dagster_run.job_name for r in gone.results] == ["index_graph"]  # nothing to read: the graph run only
    settings = Settings(home=home)
    assert "visitor_form.txt" not in _hashes(settings)
    with connect(settings) as con:
        assert con.execute("SELECT count(*) FROM chunks c JOIN (SELECT doc_id FROM chunks EXCEPT SELECT doc_id FROM documents) "
                           "USING (doc_id)").fetchone()[0] == 0  # its chunks went too
        assert con.execute("SELECT count(*) FROM deleted_documents").fetchone()[0] == 0  # not remembered as deleted
    assert _key("visitor_form.txt") not in instance.get_dynamic_partitions("documents")
    shutil.move(kept, src / "visitor_form.txt")
    back = index_chain(instance, home, config, {}, "default")
    assert back.results[0].dagster_run.tags[RANGE_START] == _key("visitor_form.txt")
    assert "visitor_form.txt" in _hashes(settings)
    rows = (src / "river_sell.jsonl").read_text().splitlines()  # a row removed from a file that stays
    (src / "river_sell.jsonl").write_text("\n".join(rows[1:]) + "\n")
    gone_row = next(s for s in _hashes(settings) if s.startswith("river_sell.jsonl#") and s.split("#")[1] in rows[0])
    assert index_chain(instance, home, config, {}, "default").success
    assert gone_row not in _hashes(settings) and len(_hashes(settings)) == 7


def test_a_graph_run_configured_with_another_source_drops_nothing(corpus, tmp_path):
    src, home, config = corpus
    from lazyhippo_dagster.definitions import defs

    instance = dg.DagsterInstance.ephemeral()
    assert index_chain(instance, home, config, {}, "default").success
    other = tmp_path / "other"
    other.mkdir()
    (other / "note.txt").write_text("Nothing of the indexed documents is here.")
    rebuild = defs.resolve_job_def("rebuild_graph").execute_in_process(
        run_config=run_config({"lazyhippo": {"home": str(home), "source": str(other)}}), instance=instance,
        partition_key="default", raise_on_error=False)
    assert rebuild.success and len(_hashes(Settings(home=home))) == 8


def test_a_ranged_run_records_every_partition_through_the_batched_event_log(tmp_path, monkeypatch):
    """The same materializations as Dagster's own SQLite event log, written as batches."""
    from lazyhippo_dagster.bench_partitions import probe_assets

    parts, (probe_a, probe_b) = probe_assets()

    batches: list[int] = []
    original = BatchedSqliteEventLogStorage.store_event_batch
    monkeypatch.setattr(BatchedSqliteEventLogStorage, "store_event_batch",
                        lambda self, events: (batches.append(len(events)), original(self, events))[1])
    enable_event_batches()
    keys = [f"kb/d_{i:03d}" for i in range(60)]
    recorded = {}
    for name, storage in (("stock", {}), ("batched", {"event_log_storage": {
            "module": "lazyhippo_dagster.event_log", "class": "BatchedSqliteEventLogStorage",
            "config": {"base_dir": str(tmp_path / "batched" / "history" / "runs")}}})):
        (tmp_path / name).mkdir()
        with dg.instance_for_test(temp_dir=str(tmp_path / name), overrides=storage) as instance:
            instance.add_dynamic_partitions(parts.name, keys)
            assert dg.materialize([probe_a, probe_b], instance=instance, tags={RANGE_START: keys[0], RANGE_END: keys[-1]}).success
            recorded[name] = {a.key.to_user_string(): (instance.get_materialized_partitions(a.key),
                                                        len(instance.fetch_materializations(a.key, limit=1000).records))
                              for a in (probe_a, probe_b)}
            for a in (probe_a, probe_b):  # the asset's row points at its newest materialization, as per event
                newest = max(r.storage_id for r in instance.fetch_materializations(a.key, limit=1000).records)
                assert instance.get_asset_records([a.key])[0].asset_entry.last_materialization_record.storage_id == newest
    assert recorded["batched"] == recorded["stock"] == {"probe_a": (set(keys), 60), "probe_b": (set(keys), 60)}
    assert batches and max(batches) > 1  # the batched run wrote many events per transaction


def test_each_document_partition_carries_its_own_row_count_preview_and_problems(corpus):
    """A run over every document: each partition's materialization counts and previews that document only
    (they add up to the table), under a key that names its file; a file that cannot be read shows its problem."""
    src, home, config = corpus
    (src / "broken.txt").write_bytes(b"\x00\x01 binary")
    instance = dg.DagsterInstance.ephemeral()
    assert index_chain(instance, home, config, {}, "default").success
    with connect(Settings(home=home)) as con:
        chunks = dict(con.execute("SELECT d.source, count(*) FROM chunks c JOIN documents d USING (namespace, doc_id) "
                                  "GROUP BY 1").fetchall())

    def latest(asset: str) -> dict:
        records = instance.fetch_materializations(dg.AssetKey(asset), limit=100).records
        return {r.partition_key: r.asset_materialization.metadata for r in records}

    per_chunks = latest("chunks")
    assert set(per_chunks) == {_key(s) for s in chunks}  # a key per readable document, named by its source
    for source, n in chunks.items():
        meta = per_chunks[_key(source)]
        assert meta["dagster/row_count"].value == n
        assert 0 < meta["preview"].value.count("\n") - 1 <= min(n, 5)  # its own chunks, a Markdown table
    assert sum(m["dagster/row_count"].value for m in per_chunks.values()) == sum(chunks.values())
    docs = latest("documents")
    assert docs[_key("tomas_reyes.txt")]["dagster/row_count"].value == 1
    assert docs[_key("tomas_reyes.txt")]["input_problems"].value == 0
    assert _key("broken.txt") not in docs  # never a document, so never a partition
    extractions = latest("extractions")
    assert all(m["dagster/row_count"].value > 0 for m in extractions.values())
    assert len({m["dagster/row_count"].value for m in extractions.values()}) > 1  # not one run total copied


def test_readers_see_a_documents_run_only_once_the_graph_run_publishes_it(corpus):
    """Between the two runs of an update, queries keep answering from the last complete index: never new
    chunks beside the old graph."""
    from lazyhippo.stores.warehouse import index_notice
    from lazyhippo_dagster.definitions import defs

    src, home, config = corpus
    instance = dg.DagsterInstance.ephemeral()
    assert index_chain(instance, home, config, {}, "default").success
    settings = Settings(home=home)

    def published_text() -> str:
        with connect(settings, read_only=True) as con:
            return " ".join(r[0] for r in con.execute("SELECT c.text FROM chunks c JOIN documents d USING (namespace, doc_id) WHERE d.source = 'tomas_reyes.txt'").fetchall())

    (src / "tomas_reyes.txt").write_text((src / "tomas_reyes.txt").read_text() + "\nHe retired to Corran in 1952.\n")
    docs = defs.resolve_job_def("index_documents").execute_in_process(
        run_config=config, instance=instance, partition_key=_key("tomas_reyes.txt"), raise_on_error=False)
    assert docs.success and "retired to Corran" not in published_text()
    assert "graph run that publishes them" in index_notice(settings)
    graph = defs.resolve_job_def("index_graph").execute_in_process(
        run_config=config, instance=instance, partition_key="default", raise_on_error=False)
    assert graph.success and "retired to Corran" in published_text() and index_notice(settings) is None
