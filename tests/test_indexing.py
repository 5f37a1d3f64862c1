"""The indexing platform on the embedded default."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from lazyhippo.index import run_index
from lazyhippo.models.tokens import count_tokens
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.sources.files import Section, _make, read_source
from lazyhippo.stages.chunks import chunk_document
from lazyhippo.stages.exports import EXPORT_TABLES
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import connect
from lazyhippo_dagster.definitions import defs

EXPECTED_ASSETS = {"documents", "chunks", "extractions", "entities", "relations", "mentions", "facts", "embeddings",
                   "knn_edges", "communities", "community_summaries", "exports", "published_snapshot"}


def _rows(settings: Settings, sql: str) -> list[tuple]:
    with connect(settings, read_only=True) as con:
        return con.execute(sql, [settings.namespace]).fetchall()


def _materialize(home: Path, source: Path, namespace: str = "default"):
    """The `index` chain (documents run over the staged document partitions, then the namespace's graph run)."""
    from lazyhippo_dagster.runner import index_run, run_config

    config = run_config({"lazyhippo": {"home": str(home), "source": str(source)},
                         "graph_store": {"kind": "embedded"}, "object_store": {"kind": "local"}})
    return index_run(dg.DagsterInstance.ephemeral(), home, config, {}, namespace)


def test_definitions_load_with_every_stage():
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert EXPECTED_ASSETS <= keys
    assert {defs.resolve_job_def(j).partitions_def.name for j in ("index", "index_graph", "rebuild_graph")} == {"namespaces"}
    assert defs.resolve_sensor_def("source_changed") and defs.resolve_schedule_def("nightly_reindex")


@pytest.fixture(scope="module")
def materialized(tmp_path_factory):
    home = tmp_path_factory.mktemp("dagster_index")
    first = _materialize(home, SAMPLE_CORPUS)
    return home, first


def test_assets_materialize_with_metadata(materialized):
    home, result = materialized
    assert result.success
    mats = {m.asset_key.to_user_string(): m for m in result.get_asset_materialization_events()
            and [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]}
    assert EXPECTED_ASSETS <= set(mats)
    docs = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
            if e.asset_key.to_user_string() == "documents"]
    assert len(docs) == 1 and docs[0].metadata["dagster/row_count"].value == 8  # one per namespace
    assert mats["entities"].metadata["dagster/row_count"].value > 20
    top = mats["entities"].metadata["top_entities"]  # a typed table: its columns show in the UI's Columns tab
    assert any(r.data["entity"] == "Ada Fenwick" for r in top.records)
    assert [(c.name, c.type) for c in top.schema.columns] == [("entity", "string"), ("type", "string"),
                                                              ("mentions", "int"), ("degree", "int")]
    assert isinstance(mats["communities"].metadata["largest"].value, int)  # figures are plain values, plotted
    assert mats["communities"].metadata["modularity"].value > 0.2
    assert "size_distribution" in mats["communities"].metadata
    assert mats["knn_edges"].metadata["dagster/row_count"].value > 0


def test_rerun_is_idempotent_same_ids_no_duplicates_no_extractor_calls(materialized):
    home, _ = materialized
    settings = Settings(home=home)
    tables = ("documents", "chunks", "entities", "relations", "mentions", "facts", "knn_edges", "entity_scores",
              "communities", "community_summaries", "embeddings")
    snapshot = {t: sorted(_rows(settings, f"SELECT * EXCLUDE (namespace) FROM {t} WHERE namespace = ?"), key=repr)
                for t in tables if t != "embeddings"}
    snapshot["embeddings"] = sorted(_rows(settings, "SELECT kind, item_id FROM embeddings WHERE namespace = ?"))
    again = _materialize(home, SAMPLE_CORPUS)
    assert again.success
    # nothing added, changed or removed: nothing read again, chunked again or extracted
    assert again.change == again.change.__class__()
    extracted = next(e.event_specific_data.materialization for e in again.get_asset_materialization_events()
                     if e.asset_key.to_user_string() == "extractions")
    assert extracted.metadata["computed"].value == 0 and extracted.metadata["documents_extracted"].value == 0
    for t in tables:
        now = (sorted(_rows(settings, "SELECT kind, item_id FROM embeddings WHERE namespace = ?")) if t == "embeddings"
               else sorted(_rows(settings, f"SELECT * EXCLUDE (namespace) FROM {t} WHERE namespace = ?"), key=repr))
        assert now == snapshot[t], f"{t} changed on an unchanged re-run"
    dup = _rows(settings, "SELECT count(*) - count(DISTINCT chunk_id) FROM chunks WHERE namespace = ?")[0][0]
    assert dup == 0


def test_every_entity_has_a_community_and_knn_respects_topk_and_cutoff(sample_settings):
    s = sample_settings
    missing = _rows(s, "SELECT count(*) FROM entities e LEFT JOIN entity_scores c USING (namespace, entity_id) "
                       "WHERE e.namespace = ? AND c.community_id IS NULL")[0][0]
    assert missing == 0
    per_source = _rows(s, "SELECT source_id, count(*), min(score) FROM knn_edges WHERE namespace = ? GROUP BY source_id")
    assert per_source and all(n <= s.knn_top_k and lo >= s.knn_cutoff for _, n, lo in per_source)


def test_knn_topk_and_cutoff_are_configurable(tmp_path):
    s = Settings(home=tmp_path, source=str(SAMPLE_CORPUS), knn_top_k=2, knn_cutoff=0.8)
    run_index(s)
    rows = _rows(s, "SELECT source_id, count(*), min(score) FROM knn_edges WHERE namespace = ? GROUP BY source_id")
    assert all(n <= 2 and lo >= 0.8 for _, n, lo in rows)


def test_relations_per_chunk_keeps_each_chunks_most_associated_pairs(tmp_path):
    """Chunk c0 names two rare people and two common names (in 8 chunks, together in 4): with one relation per
    chunk, c0 keeps the rare pair (seen together, nowhere else) and drops the common one; 0 keeps all."""
    import pyarrow as pa

    from lazyhippo.stages.entities import build_graph_tables
    from lazyhippo.stores.warehouse import replace_rows

    def graph(per_chunk: int) -> set[tuple[str, str]]:
        s = Settings(home=tmp_path / str(per_chunk), relations_per_chunk=per_chunk)
        ents = [{"chunk_id": f"c{i}", "name": n, "type": "PERSON", "description": ""}
                for i in range(8) for n in ("Common One", "Common Two")]
        ents += [{"chunk_id": "c0", "name": n, "type": "PERSON", "description": ""} for n in ("Rare Ada", "Rare Bo")]
        rels = [{"chunk_id": "c0", "source": a, "target": b, "description": "", "weight": 1.0}
                for a, b in (("Common One", "Common Two"), ("Rare Ada", "Rare Bo"))]
        rels += [{"chunk_id": f"c{i}", "source": "Common One", "target": "Common Two", "description": "", "weight": 1.0}
                 for i in (1, 2, 3)]
        with connect(s) as con:
            replace_rows(con, "extracted_entities", "default", pa.Table.from_pylist([{"namespace": "default", **e} for e in ents]))
            replace_rows(con, "extracted_relations", "default", pa.Table.from_pylist([{"namespace": "default", **r} for r in rels]))
            build_graph_tables(s, con)
            rows = con.execute("SELECT a.name, b.name, r.weight FROM relations r JOIN entities a ON a.entity_id = r.source_id "
                               "JOIN entities b ON b.entity_id = r.target_id").fetchall()
        return {tuple(sorted((a, b))) + (w,) for a, b, w in rows}

    assert graph(0) == {("Common One", "Common Two", 4.0), ("Rare Ada", "Rare Bo", 1.0)}
    # c0 keeps the rare pair; c1..c3 hold only the common pair and keep it: its weight drops by c0's share
    assert graph(1) == {("Common One", "Common Two", 3.0), ("Rare Ada", "Rare Bo", 1.0)}


def test_a_negative_relations_per_chunk_is_refused(tmp_path):
    with pytest.raises(ValueError, match="relations_per_chunk -1"):
        Settings(home=tmp_path, relations_per_chunk=-1)


class DictStore:
    """A shared object store (not a folder of the home) held in memory."""

    uri = "memory://"

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> str:
        self.objects[key] = data
        return "md5"

    def put_file(self, key: str, path) -> str:
        return self.put(key, path.read_bytes())

    def get(self, key: str) -> bytes:
        if key not in self.objects:
            raise FileNotFoundError(key)
        return self.objects[key]

    def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)


def test_exports_read_back_and_match_duckdb(sample_settings):
    from lazyhippo.stages.exports import export_parquet, export_query

    s = sample_settings
    store = DictStore()
    with connect(s, read_only=True) as con:
        export_parquet(s, con, store, "r1")
        for table in EXPORT_TABLES:
            exported = pq.read_table(io.BytesIO(store.get(f"default/tables/{table}.parquet")))
            expected = con.sql(export_query(table), params=["default"]).to_arrow_table()
            offline_empty = table == "community_reports"  # reports need an LLM; offline the table is empty
            assert exported.num_rows == expected.num_rows and (expected.num_rows > 0 or offline_empty), table
            assert exported.to_pylist() == expected.to_pylist(), table


def test_exported_parquet_gathers_batches_into_row_groups_of_bounded_bytes(sample_settings, monkeypatch):
    """A row group per batch restarted each column's dictionary every 50,000 rows (relations at 100,000
    documents 303 MB, 290 MB in groups of 32 MB); a group still holds at most ROW_GROUP_BYTES of batches."""
    from lazyhippo.stages import exports

    monkeypatch.setattr(exports, "EXPORT_BATCH_ROWS", 20)
    with connect(sample_settings, read_only=True) as con:
        expected = con.sql(exports.export_query("relations"), params=["default"]).to_arrow_table()
        assert expected.num_rows > 60
        for group_bytes, groups in ((64 << 20, 1), (1, -(-expected.num_rows // 20))):
            monkeypatch.setattr(exports, "ROW_GROUP_BYTES", group_bytes)
            store = DictStore()
            exports.export_parquet(sample_settings, con, store, "r1")
            data = pq.ParquetFile(io.BytesIO(store.get("default/tables/relations.parquet")))
            assert data.metadata.num_row_groups == groups
            assert data.read().to_pylist() == expected.to_pylist()


def test_exports_reach_the_store_as_files_never_as_one_bytes_object(sample_settings, tmp_path):
    """An exported table goes to the object store from its temporary file, read in pieces (at 100,000 documents
    a table's Parquet is hundreds of MB); the object is the one `put` of its bytes gives, and putting the same
    file again rewrites nothing."""
    import hashlib

    from lazyhippo.stages.exports import export_parquet

    class FilesOnly(LocalObjectStore):
        def put(self, key: str, data: bytes) -> str:
            assert not key.endswith(".parquet"), f"{key} went to the store as one bytes object"
            return super().put(key, data)

    store = FilesOnly(tmp_path / "objects")
    with connect(sample_settings, read_only=True) as con:
        out = export_parquet(sample_settings, con, store, "r1")
    for entry in out.objects.values():
        data = store.get(entry["key"])
        assert entry["md5"] == hashlib.md5(data).hexdigest() and entry["bytes"] == len(data)
        assert LocalObjectStore(tmp_path / "other").put(entry["key"], data) == entry["md5"]
    path = tmp_path / "objects" / out.objects["relations"]["key"]
    copy = shutil.copy(path, tmp_path / "relations.parquet")
    written = path.stat().st_mtime_ns
    assert store.put_file(out.objects["relations"]["key"], Path(copy)) == out.objects["relations"]["md5"]
    assert path.stat().st_mtime_ns == written  # unchanged: no rewrite


def test_exports_rewrite_only_the_tables_whose_rows_changed(sample_settings, tmp_path):
    """The second export of the same rows writes nothing and keeps the manifest; a changed row rewrites its table
    alone, and every object still reads back as its table."""
    from lazyhippo.stages.exports import export_parquet, export_query

    s = Settings(home=tmp_path, source=sample_settings.source)
    shutil.copy(sample_settings.db_path, s.db_path)
    store = DictStore()
    with connect(s) as con:
        first = export_parquet(s, con, store, "r1")
        assert first.written == list(EXPORT_TABLES)
        again = export_parquet(s, con, store, "r2")
        assert again.written == [] and again.objects == first.objects
        assert store.get("default/runs/r2/manifest.json") == store.get("default/tables/manifest.json")
        con.execute("UPDATE entities SET description = 'revised' WHERE entity_id = (SELECT min(entity_id) FROM entities)")
        changed = export_parquet(s, con, store, "r3")
        assert changed.written == ["entities"]
        assert json.loads(store.get("default/tables/manifest.json")) == changed.objects
        for table in EXPORT_TABLES:
            exported = pq.read_table(io.BytesIO(store.get(f"default/tables/{table}.parquet")))
            expected = con.sql(export_query(table), params=["default"]).to_arrow_table()
            assert exported.to_pylist() == expected.to_pylist(), table


def test_exported_relations_leave_out_their_derived_id_and_texts_are_written_side_by_side(sample_settings):
    """The relations object has no relation_id (a reader derives it from the pair as docs/lifecycle.md says:
    7.2 of its 16.4 MB at 10,000 documents), and entities, facts and relations are written in the order of
    their texts, so repeated sentences compress together."""
    from lazyhippo.stages.exports import export_parquet

    store = DictStore()
    with connect(sample_settings, read_only=True) as con:
        export_parquet(sample_settings, con, store, "r1")
        relations = pq.read_table(io.BytesIO(store.get("default/tables/relations.parquet")))
        assert "relation_id" not in relations.column_names and {"source_id", "target_id"} <= set(relations.column_names)
        con.register("exported", relations)
        derived = con.execute("SELECT 'r_' || substr(sha256(source_id || '|' || target_id), 1, 16) FROM exported "
                              "ORDER BY ALL").fetchall()
        stored = con.execute("SELECT relation_id FROM relations WHERE namespace = 'default' ORDER BY ALL").fetchall()
        assert derived == stored and len(stored) > 10
    for table, column in (("entities", "description"), ("facts", "text"), ("relations", "description")):
        texts = pq.read_table(io.BytesIO(store.get(f"default/tables/{table}.parquet"))).column(column).to_pylist()
        present = [t for t in texts if t is not None]
        assert len(present) > 10 and present == sorted(present), table


def test_exports_written_in_another_form_are_written_again_once(sample_settings, tmp_path, monkeypatch):
    """An object whose rows are unchanged but whose form is not this version's (other Parquet options, other
    columns or order) is written again by the next run, then skipped: a home keeps no object in an old form."""
    from lazyhippo.stages import exports

    store = DictStore()
    with connect(sample_settings, read_only=True) as con:
        first = exports.export_parquet(sample_settings, con, store, "r1")
        monkeypatch.setattr(exports, "PARQUET_ZSTD", {**exports.PARQUET_ZSTD, "compression_level": 1})
        assert exports.export_parquet(sample_settings, con, store, "r2").written == list(EXPORT_TABLES)
        assert exports.export_parquet(sample_settings, con, store, "r3").written == []
        monkeypatch.setattr(exports, "EXPORT_ORDER", {})
        assert "entities" in exports.export_parquet(sample_settings, con, store, "r4").written
    assert first.written == list(EXPORT_TABLES)


def test_bad_files_are_reported_by_name_and_skipped(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("Ada Fenwick founded the Marlow Observatory on Mount Keel.")
    (src / "empty.txt").write_text("")
    (src / "binary.txt").write_bytes(b"\x00\x01\x02PNG\x00")
    (src / "latin1.md").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (src / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    (src / "huge.txt").write_text("word " * 50_000)
    (src / "rows.jsonl").write_text('{"id": "1", "title": "T", "text": "Fine row."}\n{not json}\n')
    s = Settings(home=tmp_path / "home", source=str(src), max_file_bytes=100_000)
    out = run_index(s)
    reasons = dict(_rows(s, "SELECT source, reason FROM document_errors WHERE namespace = ?"))
    assert reasons["empty.txt"].startswith("empty")
    assert "binary" in reasons["binary.txt"]
    assert "UTF-8" in reasons["latin1.md"]
    assert "PDF" in reasons["broken.pdf"]
    assert "too large" in reasons["huge.txt"]
    assert "JSONL" in reasons["rows.jsonl:2"]
    assert out["documents"].documents == 2
    # a file that breaks later keeps its indexed version: nothing already indexed is lost
    (src / "good.txt").write_bytes(b"\xff\xfe broken now")
    run_index(s)
    titles = {t for (t,) in _rows(s, "SELECT title FROM documents WHERE namespace = ?")}
    assert "Good" in titles
    assert _rows(s, "SELECT count(*) FROM chunks c JOIN documents d USING (namespace, doc_id) "
                    "WHERE c.namespace = ? AND d.title = 'Good'")[0][0] == 1


def _tiny_pdf(pages: list[str]) -> bytes:
    objs = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objs.append(f"<< /Length {len(stream)} >>\nstream\n{stream.decode()}\nendstream")
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objs)} 0 R "
                    f"/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(f"{len(objs)} 0 R")
    objs[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out, offsets = io.BytesIO(), []
    out.write(b"%PDF-1.4\n")
    for i, body in enumerate(objs, 1):
        offsets.append(out.tell())
        out.write(f"{i} 0 obj\n{body}\nendobj\n".encode())
    xref = out.tell()
    out.write(f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode())
    out.write("".join(f"{o:010d} 00000 n \n" for o in offsets).encode())
    out.write(f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def test_pdf_pages_become_citable_chunks(tmp_path):
    (tmp_path / "report.pdf").write_bytes(_tiny_pdf(["Halden Telescope overview.", "Tomas Reyes built a spectrograph."]))
    docs, errors = read_source(tmp_path, 10_000_000)
    assert not errors and len(docs) == 1
    chunks = chunk_document(docs[0])
    assert [c.page for c in chunks] == [1, 2]
    assert "spectrograph" in chunks[1].text


def test_chunks_respect_size_overlap_and_sections():
    body = " ".join(f"Sentence number {i} talks about the Halden Telescope." for i in range(200))
    doc = _make("a.md", "A", "md", [Section(body, "Intro"), Section("Short tail.", "Tail")])
    chunks = chunk_document(doc, size=64, overlap=16)
    assert all(c.n_tokens <= 64 and c.n_tokens == count_tokens(c.text) for c in chunks)
    assert chunks[-1].section == "Tail" and chunks[0].section == "Intro"
    first_tail = chunks[0].text.split(". ")[-1]
    assert first_tail in chunks[1].text  # overlap carries trailing sentences
    assert [c.chunk_id for c in chunk_document(doc, 64, 16)] == [c.chunk_id for c in chunks]


def test_namespaces_are_isolated(tmp_path):
    a = Settings(home=tmp_path, source=str(SAMPLE_CORPUS), namespace="a")
    run_index(a)
    before = _rows(a, "SELECT count(*) FROM entities WHERE namespace = ?")[0][0]
    other = tmp_path / "other"
    other.mkdir()
    (other / "note.txt").write_text("Henry Calloway lectured on optics in Eastbridge.")
    b = Settings(home=tmp_path, source=str(other), namespace="b")
    run_index(b)
    assert _rows(a, "SELECT count(*) FROM entities WHERE namespace = ?")[0][0] == before
    assert 0 < _rows(b, "SELECT count(*) FROM entities WHERE namespace = ?")[0][0] < before
    assert LocalObjectStore(a.export_dir).list("a/") and LocalObjectStore(a.export_dir).list("b/")


def test_the_graph_models_fit_a_duckdb_memory_cap_smaller_than_their_texts(tmp_path, monkeypatch):
    """At 100,000 documents the entity model's descriptions (1.1 GB) did not fit DuckDB's 512 MB cap: ordered
    aggregates and texts kept per group stay in memory. Here 36 MB of descriptions against a 64 MB cap, which the
    single-SELECT models ran out of. Half the chunks' descriptions are stored as text, half refer to the chunk's
    fact (as the staging load stores a sentence)."""
    import random

    import pyarrow as pa

    from lazyhippo.stores.warehouse import (chunk_relations, entity_inputs, extraction_inputs, name_keys,
                                             replace_rows, run_sql_model)

    monkeypatch.setenv("LAZYHIPPO_DUCKDB_MEMORY", "64MB")
    rng = random.Random(1)
    ents, rels, facts = [], [], []
    for c in range(40_000):
        sentence = " ".join(f"w{rng.randrange(5000)}" for _ in range(30))
        names = [f"Name {rng.randrange(100_000)}" for _ in range(6)]
        ref = {"description": None, "fact_idx": 0} if c % 2 else {"description": sentence, "fact_idx": None}
        facts.append({"namespace": "default", "chunk_id": f"c{c}", "fact_idx": 0, "text": sentence, "names": names})
        ents += [{"namespace": "default", "chunk_id": f"c{c}", "name": n, "type": "PERSON", **ref} for n in names]
        rels += [{"namespace": "default", "chunk_id": f"c{c}", "source": a, "target": b, **ref, "weight": 1.0}
                 for i, a in enumerate(names) for b in names[i + 1:] if a != b]
    with connect(Settings(home=tmp_path)) as con:
        replace_rows(con, "extracted_facts", "default", pa.Table.from_pylist(facts))
        replace_rows(con, "extracted_entities", "default", pa.Table.from_pylist(ents))
        replace_rows(con, "extracted_relations", "default", pa.Table.from_pylist(rels))
        name_keys(con, "default")
        chunk_relations(con, "default", 0)
        extraction_inputs(con, "default")
        entity_inputs(con, "default")
        entities = run_sql_model(con, "entities", "default")
        relations = run_sql_model(con, "relations", "default")
        most = con.execute("SELECT max(len(string_split(description, ' | '))) FROM entities").fetchall()[0][0]
        pairs = con.execute("SELECT count(DISTINCT (least(source_id, target_id), greatest(source_id, target_id))) "
                            "FROM lh_relations").fetchall()[0][0]
        unknown = con.execute("SELECT count(*) FROM relations WHERE description IS NULL OR description NOT IN "
                              "(SELECT text FROM extracted_facts)").fetchall()[0][0]
    assert entities == len({e["name"] for e in ents}) and most == 3
    assert relations == pairs and unknown == 0


def test_the_relations_model_joins_on_equalities_only(tmp_path):
    """An inequality between the two name lookups (`s <> t`) let DuckDB join every name with every other first
    (18 GB at 1,000 documents); the pairs lh_relations holds are of two distinct entities already."""
    import json

    import pyarrow as pa

    from lazyhippo.sql import SQL_DIR
    from lazyhippo.stores.warehouse import (chunk_relations, entity_inputs, extraction_inputs, name_keys,
                                             replace_rows, run_sql_model)

    s = Settings(home=tmp_path)
    names = [f"Name {i}" for i in range(50)]
    ents = [{"namespace": "default", "chunk_id": f"c{c}", "name": names[(c * 7 + j) % 50], "type": "PERSON",
             "description": ""} for c in range(40) for j in range(5)]
    rels = [{"namespace": "default", "chunk_id": a["chunk_id"], "source": a["name"], "target": b["name"],
             "description": "", "weight": 1.0} for a, b in zip(ents, ents[1:]) if a["chunk_id"] == b["chunk_id"]]
    rels.append({"namespace": "default", "chunk_id": "c0", "source": "Name 0", "target": "name 0", "description": "",
                 "weight": 1.0})  # one entity under two spellings: no self-relation
    with connect(s) as con:
        replace_rows(con, "extracted_entities", "default", pa.Table.from_pylist(ents))
        replace_rows(con, "extracted_relations", "default", pa.Table.from_pylist(rels))
        name_keys(con, "default")
        chunk_relations(con, "default", 0)
        extraction_inputs(con, "default")
        entity_inputs(con, "default")
        run_sql_model(con, "entities", "default")
        plans = []  # each statement's, the temporary tables of those before it built
        for statement in [s.query for s in con.extract_statements((SQL_DIR / "relations.sql").read_text())]:
            p = {"namespace": "default"} if "$namespace" in statement else None
            if not statement.lstrip().upper().startswith("DROP"):
                plans.append(con.execute(f"EXPLAIN (FORMAT json) {statement}", p).fetchall()[0][1])
            con.execute(statement, p)
        run_sql_model(con, "relations", "default")
        loops = con.execute("SELECT count(*) FROM relations WHERE source_id = target_id").fetchall()[0][0]

    def conditions(node: dict):
        if "JOIN" in node.get("name", ""):
            found = node.get("extra_info", {}).get("Conditions", [])
            yield from [found] if isinstance(found, str) else found
        for child in node.get("children", []):
            yield from conditions(child)

    found = [c for plan in plans for p in json.loads(plan) for c in conditions(p)]
    assert found and all("!=" not in c and "<>" not in c for c in found), found
    assert loops == 0


def test_warehouse_connections_take_their_memory_cap_and_threads_from_the_environment(tmp_path, monkeypatch):
    """DuckDB's default (80% of the machine) let one query take the memory of every other process: a warehouse
    connection is capped (LAZYHIPPO_DUCKDB_MEMORY), spills beside the warehouse, and a bad size is named."""
    monkeypatch.setenv("LAZYHIPPO_DUCKDB_MEMORY", "256MB")
    monkeypatch.setenv("LAZYHIPPO_THREADS", "1")
    s = Settings(home=tmp_path)
    with connect(s) as con:
        limit, threads, temp = con.execute("SELECT current_setting('memory_limit'), current_setting('threads'), "
                                           "current_setting('temp_directory')").fetchall()[0]
    assert limit == "244.1 MiB" and threads == 1 and temp == str(s.db_path) + ".tmp"
    monkeypatch.setenv("LAZYHIPPO_DUCKDB_MEMORY", "lots")
    with pytest.raises(ValueError, match="LAZYHIPPO_DUCKDB_MEMORY 'lots'"):
        with connect(s):
            pass
