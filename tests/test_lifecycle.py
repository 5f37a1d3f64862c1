"""Document lifecycle on the embedded store: delete with rebuild, incremental reindex."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from lazyhippo.index import run_index
from lazyhippo.models.extractors import NlpExtractor
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stages.lifecycle import UnknownDocumentError, delete_documents
from lazyhippo.stores.graphs import EmbeddedGraphStore
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import connect, fact_texts
from tests.services_fixtures import namespaces, neo4j_store  # noqa: F401 - fixtures

# what "the same graph" means: every graph-wide table, all columns but the namespace
GRAPH_SQL = {
    "entities": "SELECT entity_id, name, norm_name, type, description, mention_count, degree FROM entities",
    "relations": "SELECT relation_id, source_id, target_id, description, weight, n_chunks FROM relations",
    "mentions": "SELECT chunk_id, entity_id, count FROM mentions",
    "facts": f"SELECT fact_id, chunk_id, text, entity_ids FROM {fact_texts('facts')}",
    "knn_edges": "SELECT source_id, target_id, round(score, 5), rank FROM knn_edges",
    "entity_scores": "SELECT entity_id, community_id, round(pagerank, 6) FROM entity_scores",
    "community_summaries": "SELECT community_id, title, summary, hub_entities FROM community_summaries",
    "chunks": "SELECT chunk_id, doc_id, text FROM chunks",
}


def graph_snapshot(settings: Settings) -> dict[str, list[tuple]]:
    with connect(settings) as con:
        return {t: sorted(con.execute(f"{sql} WHERE namespace = ?", [settings.namespace]).fetchall(), key=repr)
                for t, sql in GRAPH_SQL.items()}


def graph_difference(ours: dict[str, list[tuple]], reference: dict[str, list[tuple]]) -> dict[str, dict]:
    """Per table, a few rows found on one side only: what a failed "same graph" check shows instead of both graphs."""
    out = {}
    for table in ours:
        a, b = Counter(map(repr, ours[table])), Counter(map(repr, reference[table]))  # rows may hold lists
        if a != b:
            out[table] = {"rows": (a.total(), b.total()), "only_ours": sorted(a - b)[:5], "only_reference": sorted(b - a)[:5]}
    return out


class CountingExtractor(NlpExtractor):
    """The offline extractor, counting the chunks it is asked to extract."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def submit_json(self, chunks):
        self.seen += [c.chunk_id for c in chunks]
        return super().submit_json(chunks)


def copy_corpus(dst: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(SAMPLE_CORPUS, dst, ignore=shutil.ignore_patterns(*skip) if skip else None)
    return dst


def doc_id_of(settings: Settings, source: str) -> str:
    with connect(settings) as con:
        return con.execute("SELECT doc_id FROM documents WHERE namespace = ? AND source = ?",
                           [settings.namespace, source]).fetchone()[0]


@pytest.fixture(scope="module")
def deleted(tmp_path_factory):
    """The sample corpus indexed, then marlow_observatory.md deleted; and a fresh index without that file."""
    root = tmp_path_factory.mktemp("lifecycle")
    full = Settings(home=root / "full", source=str(copy_corpus(root / "corpus")))
    run_index(full)
    before = graph_snapshot(full)
    doc = doc_id_of(full, "marlow_observatory.md")
    with connect(full) as con:
        out = delete_documents(full, con, [doc], EmbeddedGraphStore(), LocalObjectStore(full.export_dir))
    fresh = Settings(home=root / "fresh", source=str(copy_corpus(root / "rest", ("marlow_observatory.md",))))
    run_index(fresh)
    return full, fresh, before, out, doc


def test_delete_gives_the_graph_of_a_fresh_index_without_the_document(deleted):
    full, fresh, before, out, doc = deleted
    after, expected = graph_snapshot(full), graph_snapshot(fresh)
    assert out["deleted"]["documents"] == 1 and out["deleted"]["chunks"] > 0
    assert not graph_difference(after, expected)
    # the delete changed something: some entities went, some shared ones got new descriptions or counts
    gone = {r[0] for r in before["entities"]} - {r[0] for r in after["entities"]}
    assert gone
    changed = {r[0] for r in after["entities"]} & {r[0] for r in before["entities"] if r not in after["entities"]}
    assert changed, "entities also supported elsewhere should have been rebuilt with fewer mentions"


def test_delete_calls_no_extractor_and_exports_reflect_it(deleted, monkeypatch):
    full, fresh, _, _, doc = deleted
    import json

    def manifest(s: Settings, run_id: str) -> dict:
        return json.loads((s.export_dir / s.namespace / "runs" / run_id / "manifest.json").read_text())

    # the delete's exports count the rows the index without the document holds
    assert manifest(full, "delete") == manifest(fresh, "library") and manifest(full, "library") != manifest(full, "delete")

    def boom(self, chunks):
        raise AssertionError("the extractor must not be called by a delete")

    monkeypatch.setattr(NlpExtractor, "extract", boom)
    other = doc_id_of(full, "tomas_reyes.txt")
    with connect(full) as con:
        delete_documents(full, con, ["tomas_reyes.txt"], EmbeddedGraphStore(), LocalObjectStore(full.export_dir))
        left = {r[0] for r in con.execute("SELECT doc_id FROM documents WHERE namespace = 'default'").fetchall()}
    assert other not in left and doc not in left


def test_reindex_keeps_deleted_documents_out_until_their_content_changes(tmp_path):
    settings = Settings(home=tmp_path / "h", source=str(copy_corpus(tmp_path / "c")))
    run_index(settings)
    doc = doc_id_of(settings, "corran_shipping.txt")
    with connect(settings) as con:
        delete_documents(settings, con, [doc], EmbeddedGraphStore(), LocalObjectStore(settings.export_dir))
    out = run_index(settings)
    assert out["documents"].skipped_deleted == 1
    with connect(settings) as con:
        assert not con.execute("SELECT 1 FROM documents WHERE doc_id = ?", [doc]).fetchall()
    path = tmp_path / "c" / "corran_shipping.txt"
    path.write_text(path.read_text() + "\nCorran Shipping opened a second office in Eastbridge.\n")
    run_index(settings)
    with connect(settings) as con:
        assert con.execute("SELECT count(*) FROM chunks WHERE doc_id = ?", [doc]).fetchone()[0] > 0


def test_delete_of_an_unknown_document_names_it_and_changes_nothing(sample_settings):
    with connect(sample_settings) as con:
        with pytest.raises(UnknownDocumentError, match="d_nope"):
            delete_documents(sample_settings, con, ["d_nope"], EmbeddedGraphStore(), LocalObjectStore(sample_settings.export_dir))
        assert con.execute("SELECT count(*) FROM documents WHERE namespace = 'default'").fetchone()[0] == 8


def test_one_changed_file_re_extracts_that_document_only(tmp_path):
    settings = Settings(home=tmp_path / "h", source=str(copy_corpus(tmp_path / "c")))
    run_index(settings)
    doc = doc_id_of(settings, "tomas_reyes.txt")  # the path names the document: the same id after the edit
    with connect(settings) as con:
        rows_before = {t: sorted(con.execute(f"SELECT * FROM {t} WHERE doc_id <> ?", [doc]).fetchall(), key=repr)
                       for t in ("documents", "chunks")}
        extracted_before = sorted(con.execute(
            "SELECT * FROM extracted_entities WHERE chunk_id NOT IN (SELECT chunk_id FROM chunks WHERE doc_id = ?)",
            [doc]).fetchall(), key=repr)
    path = tmp_path / "c" / "tomas_reyes.txt"
    path.write_text(path.read_text().replace("Reyes", "Reyes-Ortega", 1))
    counting = CountingExtractor()
    run_index(settings, extractor=counting)
    with connect(settings) as con:
        doc_chunks = {r[0] for r in con.execute("SELECT chunk_id FROM chunks WHERE doc_id = ?", [doc]).fetchall()}
        assert counting.seen and set(counting.seen) <= doc_chunks
        assert {t: sorted(con.execute(f"SELECT * FROM {t} WHERE doc_id <> ?", [doc]).fetchall(), key=repr)
                for t in ("documents", "chunks")} == rows_before
        assert sorted(con.execute(
            "SELECT * FROM extracted_entities WHERE chunk_id NOT IN (SELECT chunk_id FROM chunks WHERE doc_id = ?)",
            [doc]).fetchall(), key=repr) == extracted_before


def test_cli_delete_rebuilds_through_dagster_and_names_unknown_documents(tmp_path, monkeypatch):
    import json

    import dagster as dg
    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    home, runner = str(tmp_path / "idx"), CliRunner()
    assert runner.invoke(app, ["index", "--home", home]).exit_code == 0
    instance = dg.DagsterInstance.from_config(str(tmp_path / "dagster"))
    bad = runner.invoke(app, ["delete", "nope.txt", "--home", home])
    assert bad.exit_code == 2 and "nope.txt" in bad.output
    out = runner.invoke(app, ["delete", "river_sell.jsonl#sell-1", "visitor_form.txt", "--home", home])
    assert out.exit_code == 0, out.output
    counts = json.loads(runner.invoke(app, ["status", "--home", home, "--json"]).stdout.strip().splitlines()[-1])
    assert counts["documents"] == 6 and counts["deleted_documents"] == 2 and counts["community_summaries"] > 0
    with connect(Settings(home=tmp_path / "idx")) as con:
        gone = {d for (d,) in con.execute("SELECT source FROM deleted_documents").fetchall()}
    assert gone == {"river_sell.jsonl#sell-1", "visitor_form.txt"}
    runs = {r.job_name: r for r in instance.get_runs()}
    assert runs["rebuild_graph"].status == dg.DagsterRunStatus.SUCCESS


@pytest.mark.services
def test_delete_on_neo4j_serves_the_graph_of_a_fresh_index(tmp_path, neo4j_store, namespaces):  # noqa: F811
    ns_full, ns_fresh = namespaces("delete"), namespaces("fresh")
    full = Settings(home=tmp_path / "full", namespace=ns_full, source=str(copy_corpus(tmp_path / "c")))
    fresh = Settings(home=tmp_path / "fresh", namespace=ns_fresh,
                     source=str(copy_corpus(tmp_path / "rest", ("ada_fenwick.md",))))
    run_index(full, neo4j_store)
    with connect(full) as con:
        delete_documents(full, con, ["ada_fenwick.md"], neo4j_store, LocalObjectStore(full.export_dir))
    run_index(fresh, neo4j_store)

    def served(ns: str) -> dict:
        q = neo4j_store.query
        return {
            "entities": sorted((r["id"], r["d"], r["m"]) for r in q(
                "MATCH (e:Entity {namespace: $ns}) RETURN e.id AS id, e.description AS d, e.mention_count AS m", {"ns": ns})),
            "relations": sorted((r["s"], r["t"], r["w"]) for r in q(
                "MATCH (a:Entity {namespace: $ns})-[r:RELATED_TO]->(b) RETURN a.id AS s, b.id AS t, r.weight AS w", {"ns": ns})),
            "mentions": sorted((r["c"], r["e"]) for r in q(
                "MATCH (c:Chunk {namespace: $ns})-[:MENTIONS]->(e) RETURN c.id AS c, e.id AS e", {"ns": ns})),
            "documents": sorted(r["id"] for r in q("MATCH (d:Document {namespace: $ns}) RETURN d.id AS id", {"ns": ns})),
            "knn": len(q("MATCH (a:Entity {namespace: $ns})-[r:SEMANTICALLY_SIMILAR]->() RETURN r", {"ns": ns})),
        }

    after, expected = served(ns_full), served(ns_fresh)
    assert after["entities"] and after == expected
    assert graph_snapshot(full)["entities"] == graph_snapshot(fresh)["entities"]
