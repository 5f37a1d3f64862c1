"""Every asset is partitioned by namespace: an index is one run of its namespace, whose cost in Dagster events
does not grow with the documents, while the engine's content hashes decide what is read again and the
`documents` materialization lists what changed."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import dagster as dg
import pytest

from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.warehouse import connect
from lazyhippo_dagster.runner import index_run, instance_for, run_config


def _hashes(settings: Settings) -> dict[str, str]:
    with connect(settings) as con:
        return dict(con.execute("SELECT source, content_hash FROM documents WHERE namespace = ?", [settings.namespace]).fetchall())


def _latest(instance: dg.DagsterInstance, asset: str, partition: str = "default") -> dict:
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=1).records
    assert records and records[0].partition_key == partition
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


def _changes(meta: dict) -> list[tuple]:
    return [(r.data["document"], r.data["change"]) for r in meta["changes"].records]


@pytest.fixture()
def corpus(tmp_path) -> tuple[Path, Path, dict]:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_CORPUS, src)
    home = tmp_path / "home"
    return src, home, run_config({"lazyhippo": {"home": str(home), "source": str(src)}})


def test_an_index_is_one_run_of_its_namespace_and_a_change_reads_one_document_again(corpus):
    src, home, config = corpus
    instance = dg.DagsterInstance.ephemeral()
    first = index_run(instance, home, config, {}, "default")
    assert first.success and first.dagster_run.job_name == "index" and first.dagster_run.tags["dagster/partition"] == "default"
    assert first.change.added == 8 and instance.get_dynamic_partitions("namespaces") == ["default"]
    assert instance.get_materialized_partitions(dg.AssetKey("extractions")) == {"default"}
    docs = _latest(instance, "documents")
    assert docs["dagster/row_count"] == 8 and docs["documents_added"] == 8 and docs["changes_shown"] == 8
    with connect(Settings(home=home)) as con:
        chunks = dict(con.execute("SELECT d.source, count(*) FROM chunks c JOIN documents d USING (namespace, doc_id) "
                                  "GROUP BY 1").fetchall())
    assert {r.data["document"]: r.data["chunks"] for r in docs["changes"].records} == chunks  # chunks per document
    (src / "tomas_reyes.txt").write_text((src / "tomas_reyes.txt").read_text() + "\nHe retired in 1952.\n")
    second = index_run(instance, home, config, {}, "default")
    assert second.success and (second.change.added, second.change.changed, second.change.removed) == (0, 1, 0)
    assert _changes(_latest(instance, "documents")) == [("tomas_reyes.txt", "changed")]
    extraction = _latest(instance, "extractions")
    assert extraction["documents_extracted"] == 1 and extraction["dagster/row_count"] > 0  # that document only
    assert _latest(instance, "chunks")["rechunked_documents"] == 1


def test_the_events_of_a_run_do_not_grow_with_its_documents(tmp_path):
    """Sixty documents cost Dagster the same events as eight: nothing is recorded per document."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(60):
        (many / f"note_{i:02d}.txt").write_text(f"Note {i}. Ada Fenwick visited Eastbridge in {1900 + i}.\n")
    instance = dg.DagsterInstance.ephemeral()
    counts = {}
    for namespace, source in (("few", SAMPLE_CORPUS), ("many", many)):
        out = index_run(instance, tmp_path / "home", run_config({"lazyhippo": {"home": str(tmp_path / "home"),
                                                                              "source": str(source)}}), {}, namespace)
        assert out.success
        events = [e.dagster_event for e in instance.all_logs(out.run_id) if e.is_dagster_event]
        counts[namespace] = (sum(1 for e in events if e.event_type in (dg.DagsterEventType.ASSET_MATERIALIZATION,
                                                                       dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED)),
                             len(events))
    assert counts["few"][0] == counts["many"][0]
    assert abs(counts["few"][1] - counts["many"][1]) < 10  # the checks' own events aside (questions beside one source)
    assert _latest(instance, "documents", "many")["dagster/row_count"] == 60


def test_a_full_index_records_the_same_event_rows_for_four_times_the_documents(tmp_path):
    """The extraction fans out to at most `batches` steps whatever the corpus, so every row of a full index's
    event log (steps, outputs, log lines) is there as often for 24 documents as for 6."""
    batching = {"extractions": {"ops": {"plan_extraction_batches": {"config": {"batches": 3, "batch_chunks": 1}}}}}
    instance = dg.DagsterInstance.ephemeral()
    rows, steps = {}, {}
    for n in (6, 24):
        src = tmp_path / f"src_{n}"
        src.mkdir()
        (src / "notes.jsonl").write_text("".join(json.dumps({"id": f"n{i}", "title": f"Note {i}", "text": (
            f"Ada Fenwick visited Eastbridge in {1900 + i}. The Corran Shipping Company built its {i}th ship there.")})
            + "\n" for i in range(n)))
        home = tmp_path / f"home_{n}"
        out = index_run(instance, home, run_config({"lazyhippo": {"home": str(home), "source": str(src)}}, batching),
                        {}, "default")
        assert out.success and _latest(instance, "documents")["dagster/row_count"] == n
        rows[n] = len(instance.all_logs(out.run_id))
        steps[n] = sorted(e.dagster_event.step_key for e in instance.all_logs(out.run_id, of_type=dg.DagsterEventType.STEP_START))
    assert rows[6] == rows[24] and steps[6] == steps[24]
    assert len([s for s in steps[24] if s.startswith("extractions.extract_documents[")]) == 3


def test_unreadable_files_are_logged_one_by_one_only_up_to_a_cap(tmp_path):
    """Each log line is an event row: past WARNINGS_LOGGED, unreadable files are one summary line (and counted in
    the metadata)."""
    from lazyhippo_dagster.assets.documents import WARNINGS_LOGGED

    src = tmp_path / "src"
    src.mkdir()
    (src / "note.txt").write_text("Ada Fenwick visited Eastbridge in 1901.\n")
    for i in range(WARNINGS_LOGGED + 5):
        (src / f"broken_{i:02d}.pdf").write_bytes(b"not a pdf")
    instance = dg.DagsterInstance.ephemeral()
    out = index_run(instance, tmp_path / "home", run_config({"lazyhippo": {"home": str(tmp_path / "home"),
                                                                          "source": str(src)}}), {}, "default")
    assert out.success and _latest(instance, "documents")["documents_failed"] == WARNINGS_LOGGED + 5
    warnings = [e.user_message for e in instance.all_logs(out.run_id)
                if not e.is_dagster_event and e.level == logging.WARNING and e.step_key == "documents"]
    assert len(warnings) == WARNINGS_LOGGED + 1 and warnings[-1].startswith("... and 5 more")


def test_a_vanished_file_is_listed_as_removed_and_comes_back_with_the_file(corpus, tmp_path, monkeypatch):
    from lazyhippo_dagster.assets import documents

    src, home, config = corpus
    instance = dg.DagsterInstance.ephemeral()
    assert index_run(instance, home, config, {}, "default").success
    kept = tmp_path / "kept.txt"
    shutil.move(src / "visitor_form.txt", kept)
    (src / "broken.txt").write_bytes(b"\x00\x01 binary")
    (src / "new_note.txt").write_text("The Harbour Light stands above Eastbridge.\n")
    monkeypatch.setattr(documents, "CHANGES_SHOWN", 2)  # the table is capped, the counts are not
    gone = index_run(instance, home, config, {}, "default")
    assert gone.success and (gone.change.added, gone.change.removed, gone.change.failed) == (1, 1, 1)
    meta = _latest(instance, "documents")
    assert _changes(meta) == [("new_note.txt", "added"), ("visitor_form.txt", "removed")] and meta["changes_shown"] == 2
    settings = Settings(home=home)
    assert "visitor_form.txt" not in _hashes(settings)
    with connect(settings) as con:
        assert con.execute("SELECT count(*) FROM chunks WHERE doc_id NOT IN (SELECT doc_id FROM documents)").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM deleted_documents").fetchone()[0] == 0  # not remembered as deleted
    monkeypatch.undo()
    shutil.move(kept, src / "visitor_form.txt")
    back = index_run(instance, home, config, {}, "default")
    assert back.change.added == 1 and "visitor_form.txt" in _hashes(settings)
    assert ("broken.txt", "failed") in _changes(_latest(instance, "documents"))
    rows = (src / "river_sell.jsonl").read_text().splitlines()  # a row removed from a file that stays
    (src / "river_sell.jsonl").write_text("\n".join(rows[1:]) + "\n")
    gone_row = next(s for s in _hashes(settings) if s.startswith("river_sell.jsonl#") and s.split("#")[1] in rows[0])
    assert index_run(instance, home, config, {}, "default").success
    assert gone_row not in _hashes(settings) and len(_hashes(settings)) == 8
    assert ("river_sell.jsonl#" + gone_row.split("#")[1], "removed") in _changes(_latest(instance, "documents"))


def test_a_graph_run_configured_with_another_source_drops_nothing(corpus, tmp_path):
    src, home, config = corpus
    from lazyhippo_dagster.definitions import defs

    instance = dg.DagsterInstance.ephemeral()
    assert index_run(instance, home, config, {}, "default").success
    other = tmp_path / "other"
    other.mkdir()
    (other / "note.txt").write_text("Nothing of the indexed documents is here.")
    rebuild = defs.resolve_job_def("rebuild_graph").execute_in_process(
        run_config=run_config({"lazyhippo": {"home": str(home), "source": str(other)}}), instance=instance,
        partition_key="default", raise_on_error=False)
    assert rebuild.success and len(_hashes(Settings(home=home))) == 8


def test_readers_see_new_documents_only_once_the_graph_publishes_them(corpus):
    """Documents materialized alone (from the asset catalog) are not served beside the old graph: queries keep
    answering from the last complete index until a graph run publishes."""
    from lazyhippo.stores.warehouse import index_notice
    from lazyhippo_dagster.definitions import defs

    src, home, config = corpus
    instance = dg.DagsterInstance.ephemeral()
    assert index_run(instance, home, config, {}, "default").success
    settings = Settings(home=home)

    def published_text() -> str:
        with connect(settings, read_only=True) as con:
            return " ".join(r[0] for r in con.execute("SELECT c.text FROM chunks c JOIN documents d USING (namespace, doc_id) WHERE d.source = 'tomas_reyes.txt'").fetchall())

    (src / "tomas_reyes.txt").write_text((src / "tomas_reyes.txt").read_text() + "\nHe retired to Corran in 1952.\n")
    docs = defs.resolve_job_def("index").execute_in_process(
        run_config=config, instance=instance, partition_key="default", raise_on_error=False,
        asset_selection=[dg.AssetKey(k) for k in ("documents", "chunks", "extractions")])
    assert docs.success and "retired to Corran" not in published_text()
    assert "graph run that publishes them" in index_notice(settings)
    graph = defs.resolve_job_def("index_graph").execute_in_process(
        run_config=config, instance=instance, partition_key="default", raise_on_error=False)
    assert graph.success and "retired to Corran" in published_text() and index_notice(settings) is None


def test_a_setting_changed_by_a_reindex_is_kept_by_later_ui_and_sensor_runs(corpus, monkeypatch):
    """`--community-algorithm louvain` on a namespace whose documents did not change is recorded: a run launched
    with no config (the UI's, a sensor's, a schedule's) and a plain re-index both keep louvain."""
    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.resources import LazyhippoResource

    src, home, config = corpus
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    monkeypatch.delenv("LAZYHIPPO_HOME", raising=False)
    instance = instance_for(home)
    assert index_run(instance, home, config, {}, "default").success
    assert _latest(instance, "communities")["algorithm"] == "leiden"
    louvain = run_config({"lazyhippo": {"home": str(home), "source": str(src), "community_algorithm": "louvain"}})
    assert index_run(instance, home, louvain, {}, "default").success
    assert _latest(instance, "communities")["algorithm"] == "louvain"
    ui = defs.resolve_job_def("index_graph").execute_in_process(instance=instance, partition_key="default",
                                                                 raise_on_error=False)  # the Launchpad's default
    assert ui.success and _latest(instance, "communities")["algorithm"] == "louvain"
    assert [s.community_algorithm for s in LazyhippoResource().watched(instance)] == ["louvain"]  # sensor, schedule
    assert index_run(instance, home, config, {}, "default").success  # a re-index that names no algorithm
    assert _latest(instance, "communities")["algorithm"] == "louvain"


def test_documents_materialized_without_their_graph_are_followed_by_it_once(corpus):
    """`graph_after_documents`: after documents materialized alone (the asset catalog) one `index_graph` run of the
    namespace is requested, and only once; after an `index` run, which publishes after its documents, none is."""
    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.sensors import graph_after_documents

    src, home, config = corpus
    instance = dg.DagsterInstance.ephemeral()
    assert index_run(instance, home, config, {}, "default").success

    def tick(cursor=None):
        with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs) as context:
            out = graph_after_documents(context)
        return out.run_requests or [], out.cursor

    first, cursor = tick()
    assert first == []  # the index run brought everything up to date
    (src / "tomas_reyes.txt").write_text((src / "tomas_reyes.txt").read_text() + "\nHe retired to Corran in 1952.\n")
    assert defs.resolve_job_def("index").execute_in_process(
        run_config=config, instance=instance, partition_key="default",
        asset_selection=[dg.AssetKey(k) for k in ("documents", "chunks", "extractions")]).success
    after, cursor = tick(cursor)
    assert [(r.partition_key, r.tags["lazyhippo/namespace"]) for r in after] == [("default", "default")]
    assert tick(cursor)[0] == []  # requested once
    assert tick()[0][0].run_key == after[0].run_key  # a lost cursor asks again under the same run key
