"""What an index costs on disk: a snapshot of what readers read, int8 vectors, a packed extraction cache."""

from __future__ import annotations

import json
import sqlite3
import zlib

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from lazyhippo.index import run_index
from lazyhippo.models.extractors import Extraction, ExtractionCache, _sentence_graph, encode, extract_chunks
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.sql import SQL_DIR
from lazyhippo.stages.chunks import Chunk
from lazyhippo.stores.cache import COLUMNS, PLAIN, pack_extraction, unpack_extraction
from lazyhippo.stores.warehouse import (STAGING, TABLES, connect, counts, fact_texts, quantize, read_vectors,
                                        run_sql_model, snapshot_path, vector_matrix)


def _tables(path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    finally:
        con.close()


def test_a_home_of_one_namespace_holds_its_index_once_and_the_next_write_leaves_the_snapshot_as_it_was(tmp_path):
    settings = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(settings)
    snap = snapshot_path(settings)
    assert snap.stat().st_ino == settings.db_path.stat().st_ino  # one file on disk, two names
    before = counts(settings)
    with connect(settings) as con:
        con.execute("DELETE FROM chunks")
    assert snap.stat().st_ino != settings.db_path.stat().st_ino and settings.db_path.stat().st_nlink == 1
    assert counts(settings) == before and before["chunks"] > 0  # readers still see the published index
    run_index(settings)
    assert snap.stat().st_ino == settings.db_path.stat().st_ino and counts(settings) == before


def test_beside_another_namespace_the_snapshot_is_a_copy_without_staging_tables_and_status_still_counts_them(tmp_path):
    first = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(first)
    other = first.with_(namespace="other")
    run_index(other)
    snap = snapshot_path(other)
    assert snap.stat().st_ino != other.db_path.stat().st_ino
    held = _tables(snap)
    assert not held & set(STAGING) and set(TABLES) - set(STAGING) <= held
    with connect(other) as con:  # the work file keeps them: updates recompute from them
        work = {t: con.execute(f"SELECT count(*) FROM {t} WHERE namespace = ?", [other.namespace]).fetchall()[0][0]
                for t in TABLES}
    assert work["extracted_relations"] > 0 and counts(other) == work


def test_stored_vectors_are_int8_codes_of_31_levels_read_back_with_their_cosines_within_0_03():
    """Each value is one of -15..15 steps of its row's largest magnitude, written as int8 x 8: 31 distinct bytes,
    which zstd stores in about 5 bits, and every reader keeps its int8 arithmetic."""
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((500, 256)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    con = duckdb.connect()
    con.execute("CREATE TABLE embeddings (namespace VARCHAR, kind VARCHAR, item_id VARCHAR, vector BLOB, scale FLOAT)")
    q, scale = quantize(vectors)
    codes = np.frombuffer(b"".join(q.to_pylist()), np.int8)
    assert set(np.unique(codes)) == set(range(-120, 121, 8))
    con.register("v", pa.table({"item_id": [f"i{i:04d}" for i in range(500)], "vector": q, "scale": scale}))
    con.execute("INSERT INTO embeddings SELECT 'ns', 'entity', item_id, vector, scale FROM v")
    ids, back = read_vectors(con, "ns", "entity")
    assert back.dtype == np.float32 and back.shape == vectors.shape and ids[0] == "i0000"
    assert np.abs(back - vectors).max(axis=1).max() <= np.abs(vectors).max(axis=1).max() / 30 + 1e-6
    back /= np.linalg.norm(back, axis=1, keepdims=True)
    assert np.abs(back @ back.T - vectors @ vectors.T).max() < 0.03


def test_a_warehouse_with_float_vectors_is_quantized_once_on_open_and_an_old_snapshot_still_reads(tmp_path, sample_settings):
    settings = sample_settings.with_(home=tmp_path / "old")
    settings.home.mkdir()
    vectors = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    old = duckdb.connect(str(settings.db_path))
    old.execute("CREATE TABLE embeddings (namespace VARCHAR NOT NULL, kind VARCHAR NOT NULL, item_id VARCHAR NOT NULL, "
                "model VARCHAR NOT NULL, vector FLOAT[] NOT NULL, PRIMARY KEY (namespace, kind, item_id))")
    old.executemany("INSERT INTO embeddings VALUES ('default', 'chunk', ?, 'm', ?)",
                    [(f"c{i}", v.tolist()) for i, v in enumerate(vectors)])
    ids, as_float = read_vectors(old, "default", "chunk")  # a snapshot published before: read as it is
    assert ids == ["c0", "c1", "c2"] and np.array_equal(as_float, vectors)
    old.close()
    with connect(settings) as con:
        kinds = dict(con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'embeddings'").fetchall())
        _, migrated = read_vectors(con, "default", "chunk")
    assert kinds["vector"] == "BLOB" and kinds["scale"] == "FLOAT"
    assert np.allclose(migrated, vectors, atol=np.abs(vectors).max() * (1 / 254 + 1 / 30) + 1e-6)


def test_a_warehouse_with_codes_as_lists_gets_the_same_codes_as_blobs_once_on_open_and_every_reader_reads_both(
        tmp_path, sample_settings, caplog):
    """Codes written as TINYINT[] (which DuckDB stores uncompressed) become one zstd-compressed BLOB per vector:
    every reader (the KNN stage's, the query index's, exports' and Neo4j's floats) gets the same codes from the
    old snapshot as it is and from the rewritten file, so no ranking can move."""
    from lazyhippo.query.loader import _graph_dim, _stored_vectors
    from lazyhippo.stores.warehouse import float_vector_sql, read_stored_vectors

    settings = sample_settings.with_(home=tmp_path / "old")
    settings.home.mkdir()
    rng = np.random.default_rng(5)
    codes = rng.integers(-127, 128, size=(70_000, 8)).astype(np.int8)  # more than one statement of the rewrite
    scales = rng.random(70_000).astype(np.float32)
    names = [f"e{i:05d}" for i in rng.permutation(70_000)]
    old = duckdb.connect(str(settings.db_path))
    old.execute("CREATE TABLE embeddings (namespace VARCHAR NOT NULL, kind VARCHAR NOT NULL, item_id VARCHAR NOT NULL, "
                "model VARCHAR NOT NULL, vector TINYINT[] NOT NULL, scale FLOAT NOT NULL, text_hash UBIGINT)")
    old.register("v", pa.table({"item_id": names, "vector": pa.array(list(codes)), "scale": scales,
                                "text_hash": pa.array(range(70_000), pa.uint64())}))
    old.execute("INSERT INTO embeddings SELECT 'default', 'entity', item_id, 'm', vector, scale, text_hash FROM v")
    old.unregister("v")
    at = {n: i for i, n in enumerate(names)}
    order = [at[n] for n in sorted(names)]

    def read(con) -> tuple:
        ids, q, s = read_stored_vectors(con, "default", "entity", batch=30_000)
        loaded = _stored_vectors(con, "default", "entity", sorted(names))
        floats = con.execute(f"SELECT {float_vector_sql(con)} FROM embeddings WHERE item_id = ?", [names[0]]).fetchall()
        return ids, q, s, loaded.q, loaded.scale, np.array(floats[0][0], dtype=np.float32), _graph_dim(con, {"ns": "default"})

    snapshot = read(old)  # a snapshot published before: read as it is
    old.close()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        kind = con.execute("SELECT data_type FROM duckdb_columns() WHERE table_name = 'embeddings' "
                           "AND column_name = 'vector'").fetchall()[0][0]
        hashes = con.execute("SELECT item_id, text_hash FROM embeddings ORDER BY item_id").fetchall()
        rewritten = read(con)
    assert kind == "BLOB" and caplog.text.count("compressed codes") == 1
    assert hashes == sorted((n, at[n]) for n in names)
    for got in (snapshot, rewritten):
        assert got[0] == sorted(names) and got[6] == 8
        assert np.array_equal(got[1], codes[order]) and np.array_equal(got[2], scales[order])
        assert np.array_equal(got[3], codes[order]) and np.array_equal(got[4], scales[order])
        assert np.array_equal(got[5], codes[0] * scales[0])
    caplog.clear()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings):
        pass
    assert "rewriting" not in caplog.text  # once


def test_a_new_home_stores_31_level_codes_and_opens_again_without_a_rewrite(tmp_path, sample_settings, caplog):
    settings = sample_settings.with_(home=tmp_path / "new")
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"):
        run_index(settings, run_id="codes")
        with connect(settings) as con:
            blobs = con.execute("SELECT vector FROM embeddings").fetchall()
    assert blobs and "rewriting" not in caplog.text
    codes = np.frombuffer(b"".join(b for (b,) in blobs), np.int8)
    assert np.all(codes % 8 == 0) and np.abs(codes).max() == 120


def test_a_home_of_255_level_codes_keeps_them_beside_the_31_level_codes_its_updates_add(tmp_path, sample_settings, caplog):
    """Every reader takes int8 codes of any number of levels: a home written before keeps its codes (coding them
    again would grow its file, which DuckDB never shrinks, and redo its KNN search)."""
    from lazyhippo.stores.warehouse import code_blobs, int8_rows, read_stored_vectors

    settings = sample_settings.with_(home=tmp_path / "old")
    run_index(settings, run_id="first")
    with connect(settings) as con:
        item = con.execute("SELECT min(item_id) FROM embeddings WHERE kind = 'chunk'").fetchall()[0][0]
        old, old_scale = int8_rows(np.random.default_rng(5).standard_normal((1, 256)))  # 255 levels, as written before
        con.execute("UPDATE embeddings SET vector = ?, scale = ? WHERE kind = 'chunk' AND item_id = ?",
                    [code_blobs(old).to_pylist()[0], float(old_scale[0]), item])
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        ids, codes, scales = read_stored_vectors(con, "default", "chunk")
    assert "rewriting" not in caplog.text
    assert np.array_equal(codes[ids.index(item)], old[0]) and scales[ids.index(item)] == old_scale[0]
    assert len(np.unique(codes[ids.index(item)])) > 31
    others = np.delete(codes, ids.index(item), axis=0)
    assert len(others) and np.all(others % 8 == 0) and np.abs(others).max() == 120


def test_vector_matrix_scales_each_row():
    q, scale = quantize(np.array([[0.5, -1.0], [2.0, 0.0]], dtype=np.float32))
    assert [np.frombuffer(b, np.int8).tolist() for b in q.to_pylist()] == [[56, -120], [120, 0]]
    assert np.allclose(vector_matrix(pa.table({"vector": q, "scale": scale})), [[7 / 15, -1.0], [2.0, 0.0]], atol=1e-6)



def test_lh_vector_gives_each_rows_floats_and_null_where_a_row_has_no_vector():
    """Exports join every row to its vector: a row without one gets NULL, the others their codes times scale."""
    from lazyhippo.stores.warehouse import _with_functions

    con = _with_functions(duckdb.connect())
    q, scale = quantize(np.array([[0.5, -1.0], [2.0, 0.0]], dtype=np.float32))
    con.register("v", pa.table({"i": [1, 2], "vector": q, "scale": scale}))
    rows = con.execute("SELECT t.i, lh_vector(v.vector, v.scale) FROM range(4) t(i) LEFT JOIN v USING (i) "
                       "ORDER BY t.i").fetchall()
    assert [r[1] is None for r in rows] == [True, False, False, True]
    assert np.allclose([rows[1][1], rows[2][1]], [[7 / 15, -1.0], [2.0, 0.0]], atol=1e-6)

TEXT = ("Ada Fenwick directed the Marlow Observatory in Cresswell from 1901 until her retirement. "
        "Tomas Reyes, her assistant at the Marlow Observatory, catalogued comets with Ada Fenwick and Mei Lin. "
        "Mei Lin later founded the Keswick Museum of Astronomy in Cresswell.")


def _graph() -> Extraction:
    """An offline extraction of TEXT: each sentence in its entities, facts and every relation of its pairs."""
    sentences = [s + "." for s in TEXT.rstrip(".").split(". ")]
    names = [["Ada Fenwick", "Marlow Observatory", "Cresswell"],
             ["Tomas Reyes", "Marlow Observatory", "Ada Fenwick", "Mei Lin"],
             ["Mei Lin", "Keswick Museum of Astronomy", "Cresswell"]]
    return _sentence_graph("Observatories", [(s, [(n, "ORG") for n in ns]) for s, ns in zip(sentences, names)])


def test_an_extraction_is_packed_against_its_text_and_comes_back_exactly():
    """Each sentence is kept once, as its place in the chunk's text: a fraction of the whole JSON compressed."""
    text = encode(_graph())
    packed = pack_extraction(text, TEXT)
    assert packed[0] == COLUMNS and unpack_extraction(packed, TEXT) == text
    assert len(packed) * 2 < len(zlib.compress(text.encode(), 6))
    assert b"Cresswell" not in zlib.decompress(packed[1:])  # a reference into TEXT, not the name again


def test_an_extraction_of_another_shape_comes_back_exactly():
    """Names outside the text, non-ASCII text, an integer weight and usage are packed; a typed relation (an LLM's)
    or a field of its own keeps the payload whole."""
    plain = Extraction(entities=[{"name": "Zoë Ångström", "type": "PERSON", "description": "Zoë works."}],
                       relations=[{"source": "Zoë Ångström", "target": "Lab", "description": "Zoë works.", "weight": 2},
                                  {"source": "Lab", "target": "Zoë Ångström", "description": "", "weight": 0.5}],
                       facts=[{"text": "Zoë works.", "names": ["Zoë Ångström"]}], usage={"prompt_tokens": 3})
    typed = Extraction(relations=[{"source": "Lab", "target": "Zoë", "type": "USES", "description": "", "weight": 1.0}])
    extra = Extraction(entities=[{"name": "Lab", "type": "ORG", "description": "x", "confidence": 0.9}])
    source = "Zoë works. Zoë Ångström leads it."
    for ex, form in ((plain, COLUMNS), (typed, PLAIN), (extra, PLAIN)):
        packed = pack_extraction(encode(ex), source)
        assert packed[0] == form and unpack_extraction(packed, source) == encode(ex)


def test_the_extraction_cache_packs_new_entries_and_still_reads_entries_written_before(tmp_path):
    path = tmp_path / "extractions.sqlite"
    ex = _graph()
    cache = ExtractionCache(path)
    cache.put_many({"new": ex}, {"new": TEXT})
    cache.close()
    con = sqlite3.connect(str(path))
    assert con.execute("SELECT key FROM packed").fetchall() == [("new",)]
    con.execute("INSERT INTO cache VALUES ('old', ?)", [json.dumps(ex.__dict__)])  # written before compression
    con.execute("INSERT INTO cache VALUES ('zlib', ?)", [zlib.compress(json.dumps(ex.__dict__).encode())])
    con.commit()
    con.close()
    cache = ExtractionCache(path)
    try:
        assert cache.get_many({"new": TEXT, "old": TEXT, "zlib": TEXT, "missing": TEXT}) == {
            "new": ex, "old": ex, "zlib": ex}
    finally:
        cache.close()


def test_extract_chunks_reads_back_the_json_it_extracted(tmp_path):
    """A cache hit hands on the same JSON text as the extraction it stands for."""
    chunk = Chunk(chunk_id="c1", doc_id="d1", title="Observatories", position=0, section=None, page=None, text=TEXT,
                  content_hash="h1", n_tokens=0)

    class Graph:
        name, model, prompt_version = "graph", "m", "v1"

        def extract(self, chunks):
            return [_graph() for _ in chunks]

    cache = ExtractionCache(tmp_path / "c.sqlite")
    try:
        first = extract_chunks([chunk], Graph(), cache)
        again = extract_chunks([chunk], Graph(), cache)
    finally:
        cache.close()
    assert (first.computed, again.cached) == (1, 1) and again.results == first.results == {"c1": encode(_graph())}


def test_a_new_extraction_cache_has_64_kib_pages_and_one_written_before_keeps_its_own(tmp_path):
    """Compressed extractions overflow SQLite's 4 KiB pages, and each row's last overflow page was half empty."""
    ex = Extraction(entities=[{"name": "Ada", "type": "PERSON", "description": "x"}], relations=[], facts=[])
    cache = ExtractionCache(tmp_path / "new.sqlite")
    cache.put_many({"k": ex}, {"k": "Ada"})
    cache.close()
    with sqlite3.connect(str(tmp_path / "new.sqlite")) as con:
        assert con.execute("PRAGMA page_size").fetchone()[0] == 65536
    with sqlite3.connect(str(tmp_path / "old.sqlite")) as con:
        con.execute("CREATE TABLE cache (key TEXT PRIMARY KEY, payload TEXT NOT NULL)")
        con.execute("INSERT INTO cache VALUES ('k', ?)", [json.dumps(ex.__dict__)])
    cache = ExtractionCache(tmp_path / "old.sqlite")
    try:
        assert cache.get_many({"k": "Ada"}) == {"k": ex}
    finally:
        cache.close()
    with sqlite3.connect(str(tmp_path / "old.sqlite")) as con:
        assert con.execute("PRAGMA page_size").fetchone()[0] == 4096

def test_relations_are_stored_with_the_pairs_of_one_sentence_together():
    """Every pair of a sentence carries that sentence as its description: stored side by side, DuckDB's
    dictionary compression keeps it once per segment instead of once per pair."""
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.execute((SQL_DIR / "schema.sql").read_text())
    sentences, per = 40, 7
    names = [(s, f"N{s}x{i}") for s in range(sentences) for i in range(per)]
    con.execute("CREATE TEMP TABLE lh_names AS SELECT name, lower(name) AS norm_name, 'e_' || substr(sha256(lower(name)), 1, 16) "
                "AS entity_id FROM (SELECT unnest($n::VARCHAR[]) AS name)", {"n": [n for _, n in names]})
    con.execute("INSERT INTO entities (namespace, entity_id, name, norm_name) SELECT 'ns', entity_id, name, norm_name "
                "FROM lh_names")
    # half the sentences are facts the descriptions refer to, half are descriptions stored as text
    con.execute("CREATE TEMP TABLE lh_sentences AS SELECT 'c' || s AS chunk_id, 0 AS fact_idx, "
                "'Sentence ' || s || ' names all of them.' AS text FROM range(0, $n, 2) t(s)", {"n": sentences})
    rows = [(f"c{s}", a, b, None if s % 2 == 0 else f"Sentence {s} names all of them.", 1.0,
             0 if s % 2 == 0 else None) for s in range(sentences)
            for i, (_, a) in enumerate(names[s * per:(s + 1) * per]) for _, b in names[s * per + i + 1:(s + 1) * per]]
    con.execute("CREATE TEMP TABLE lh_relations (chunk_id VARCHAR, source VARCHAR, target VARCHAR, "
                "description VARCHAR, weight DOUBLE, fact_idx INTEGER, type VARCHAR)")
    order = np.random.default_rng(3).permutation(len(rows))  # extracted in any order: the model groups by pair
    con.executemany("INSERT INTO lh_relations VALUES (?, ?, ?, ?, ?, ?, NULL)", [rows[i] for i in order])
    con.execute("CREATE OR REPLACE TEMP TABLE lh_relations AS SELECT r.*, a.entity_id AS source_id, b.entity_id AS target_id "
                "FROM lh_relations r JOIN lh_names a ON a.name = r.source JOIN lh_names b ON b.name = r.target")
    assert run_sql_model(con, "relations", "ns") == len(rows)
    stored = [r[0] for r in con.execute("SELECT description FROM relations ORDER BY rowid").fetchall()]
    assert sum(a != b for a, b in zip(stored, stored[1:])) == sentences - 1
    assert set(stored) == {f"Sentence {s} names all of them." for s in range(sentences)}


def test_a_new_warehouse_file_has_64_kib_blocks_and_one_written_before_keeps_its_own(tmp_path):
    """DuckDB's default 256 KiB blocks left a sixth of an index's file empty."""
    settings = Settings(home=tmp_path / "h")
    with connect(settings) as con:
        assert con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0] == 65536
    old = Settings(home=tmp_path / "old")
    old.home.mkdir()
    duckdb.connect(str(old.db_path)).execute("CREATE TABLE kept AS SELECT 7 AS n").close()
    with connect(old) as con:
        assert con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0] == 262144
        assert con.execute("SELECT n FROM kept").fetchone()[0] == 7
        con.execute("INSERT INTO chunks (namespace, chunk_id, doc_id, position, text, content_hash, n_tokens) "
                    "VALUES ('default', 'c1', 'd1', 0, 'text', 'h', 1)")
    with connect(old) as con:
        assert con.execute("SELECT count(*) FROM chunks").fetchone()[0] == 1


def _compression(con, table: str, column: str) -> set[str]:
    con.execute("CHECKPOINT")
    return {r[0] for r in con.execute(f"SELECT DISTINCT compression FROM pragma_storage_info('{table}') "
                                      "WHERE column_name = ? AND segment_type = 'VARCHAR'", [column]).fetchall()}


def test_long_text_is_stored_with_zstd_in_the_work_file_and_in_a_snapshot_beside_other_namespaces(tmp_path):
    """A document's sections were stored uncompressed (DuckDB's own choice for long strings): 18.2 MB of the
    warehouse at 10,000 documents, 5.3 MB with zstd."""
    first = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(first)
    other = first.with_(namespace="other")
    run_index(other)
    with connect(other) as con:
        for table, column in (("documents", "sections"), ("chunks", "text"), ("facts", "text"), ("entities", "description")):
            assert _compression(con, table, column) == {"ZSTD"}, (table, column)
    snap = duckdb.connect(str(snapshot_path(other)), read_only=True)
    try:
        ddl = dict(snap.execute("SELECT table_name, sql FROM duckdb_tables()").fetchall())
        assert "USING COMPRESSION ZSTD" in ddl["documents"] and "PRIMARY KEY" not in ddl["documents"]
        assert snap.execute("SELECT count(*) FROM chunks WHERE namespace = 'other'").fetchone()[0] > 0
    finally:
        snap.close()


def test_a_warehouse_written_before_stores_its_text_with_zstd_once_on_open_with_the_same_rows(tmp_path, caplog):
    settings = Settings(home=tmp_path / "old")
    settings.home.mkdir()
    old = duckdb.connect(str(settings.db_path))
    old.execute("CREATE TABLE documents (namespace VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, source VARCHAR NOT NULL, "
                "title VARCHAR, kind VARCHAR, content_hash VARCHAR NOT NULL, n_chars BIGINT, sections VARCHAR NOT NULL, "
                "PRIMARY KEY (namespace, doc_id))")
    rows = [("default", f"d{i}", f"s{i}", "t", "txt", f"h{i}", 3000, json.dumps([{"text": "word " * 600 + str(i)}]))
            for i in range(50)]
    old.executemany("INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    old.close()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        assert _compression(con, "documents", "sections") == {"ZSTD"}
        assert sorted(con.execute("SELECT * FROM documents").fetchall()) == sorted(rows)
        assert not con.execute("SELECT 1 FROM duckdb_tables() WHERE table_name LIKE 'lh_old_%'").fetchall()
    assert "documents" in caplog.text and "zstd" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        assert con.execute("SELECT count(*) FROM documents").fetchone()[0] == 50
    assert "zstd" not in caplog.text  # once


def _relation_id_stored(con) -> bool:
    return not con.execute("SELECT is_generated FROM duckdb_columns() WHERE database_name = current_database() "
                           "AND table_name = 'relations' AND column_name = 'relation_id'").fetchone()[0]


def test_a_relation_id_is_derived_from_its_pair_when_read_in_the_work_file_and_in_a_snapshot(tmp_path):
    """Random hex ids of 13.7 M relations took 139 MB of the warehouse at 100,000 documents: they are computed
    from the pair instead, the same ids as before (queries, exports and Neo4j read them)."""
    first = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(first)
    other = first.with_(namespace="other")
    run_index(other)  # two namespaces: the snapshot is a copy, not the work file
    expected = "'r_' || substr(sha256(least(source_id, target_id) || '|' || greatest(source_id, target_id)), 1, 16)"
    with connect(other) as con:
        assert not _relation_id_stored(con)
        n, same = con.execute(f"SELECT count(*), count(*) FILTER (WHERE relation_id = {expected}) FROM relations").fetchone()
        assert n > 0 and same == n
    snap = duckdb.connect(str(snapshot_path(other)), read_only=True)
    try:
        assert not _relation_id_stored(snap)
        n, same = snap.execute(f"SELECT count(*), count(*) FILTER (WHERE relation_id = {expected}) FROM relations").fetchone()
        assert n > 0 and same == n
    finally:
        snap.close()


def test_mentions_are_stored_in_chunk_order_so_each_chunk_id_is_kept_once_per_run_of_rows(tmp_path):
    """In the order of their aggregation a chunk's mentions were scattered: mentions at 100,000 documents 89 MB,
    60 MB in chunk order."""
    settings = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(settings)
    with connect(settings) as con:
        stored = con.execute("SELECT chunk_id, entity_id FROM mentions ORDER BY rowid").fetchall()
    assert len(stored) > 50 and stored == sorted(stored)


def test_a_warehouse_that_stored_relation_ids_derives_them_once_on_open_with_the_same_rows(tmp_path, caplog):
    settings = Settings(home=tmp_path / "old")
    settings.home.mkdir()
    old = duckdb.connect(str(settings.db_path))
    old.execute("CREATE TABLE relations (namespace VARCHAR NOT NULL, relation_id VARCHAR NOT NULL, source_id VARCHAR "
                "NOT NULL, target_id VARCHAR NOT NULL, description VARCHAR, weight DOUBLE, n_chunks BIGINT, "
                "type VARCHAR DEFAULT 'RELATED_TO', forward BOOLEAN DEFAULT true)")
    pairs = [(f"e_{i:016x}", f"e_{i + 1:016x}") for i in range(40)]
    old.executemany("INSERT INTO relations VALUES ('default', 'r_' || substr(sha256(? || '|' || ?), 1, 16), ?, ?, "
                    "'d', 1.0, 1, 'USES', false)", [(a, b, a, b) for a, b in pairs])
    before = sorted(old.execute("SELECT * FROM relations").fetchall())
    old.close()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        assert not _relation_id_stored(con)
        assert sorted(con.execute("SELECT * FROM relations").fetchall()) == before
    assert "relations" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        assert con.execute("SELECT count(*) FROM relations").fetchone()[0] == 40
    assert "relations" not in caplog.text  # once


def _differing_rows(con, table: str, other: str) -> int:
    """Rows of `table` and `other` that the other lacks, both ways (EXCEPT ALL: duplicates count)."""
    return sum(con.execute(f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})").fetchone()[0]
               for a, b in ((table, other), (other, table)))


def test_staging_stores_each_sentence_once_and_descriptions_refer_to_the_facts(sample_settings):
    """Every pair of names in a sentence carried the sentence as its description, and every name the first
    sentence naming it (the staging tables 44.0 -> 30.1 MB at 10,000 documents): they refer to the chunk's fact."""
    with connect(sample_settings) as con:
        n_rel, text_rel = con.execute("SELECT count(*), count(description) FROM extracted_relations").fetchone()
        n_ent, text_ent = con.execute("SELECT count(*), count(description) FROM extracted_entities").fetchone()
        chunks = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
        repeated = con.execute(f"""
            SELECT count(*) FROM (SELECT chunk_id, description FROM extracted_entities
                                  UNION ALL SELECT chunk_id, description FROM extracted_relations) x
            JOIN {fact_texts("extracted_facts")} f USING (chunk_id)
            WHERE left(f.text, 300) = x.description""").fetchone()[0]
    assert n_rel > 100 and text_rel == 0  # each offline relation is read from a sentence
    assert n_ent > 50 and text_ent <= chunks  # a title's: its chunk's first sentence, when that names nothing
    assert repeated == 0


@pytest.mark.parametrize("table, names", [("extracted_entities", ("name",)),
                                          ("extracted_relations", ("source", "target"))])
def test_names_in_the_sentence_they_refer_to_are_stored_as_places_and_read_back(sample_settings, table, names):
    """Each pair of names in a sentence repeated both names, each entity row its name (the two tables 21.0 ->
    9.0 MB at 10,000 documents): a name among the names of the row's fact is its place there, read back as the
    name."""
    from lazyhippo.stores.warehouse import named

    with connect(sample_settings) as con:
        n, text, placeable = con.execute(f"""
            SELECT count(*), {" + ".join(f"count(x.{c})" for c in names)},
                   count(*) FILTER ({" OR ".join(f"list_contains(f.names, x.{c})" for c in names)})
            FROM {table} x LEFT JOIN extracted_facts f
            ON f.namespace = x.namespace AND f.chunk_id = x.chunk_id AND f.fact_idx = x.fact_idx""").fetchone()
        read = con.execute(f"SELECT count(*), {', '.join(f'count({c})' for c in names)} FROM ({named(table)})",
                           {"ns": sample_settings.namespace}).fetchone()
    assert n > 100 and text < n / 10 and placeable == 0
    assert read == (n,) * (1 + len(names))


def _as_text(con, table: str, descriptions: bool) -> None:
    """Rewrite the staging table `table` with every name as text (and every description, when `descriptions`),
    in the layout `OLD_STAGING` (`descriptions`) or `OLD_NAMES` gives it."""
    from lazyhippo.stores.warehouse import PLACED

    placed = PLACED[table]
    drop = [*placed.values(), *(["fact_idx"] if descriptions else [])]
    text = [f"coalesce(x.{c}, f.names[x.{p}]) AS {c}" for c, p in placed.items()]
    text += ["coalesce(left(f.text, 300), x.description) AS description"] if descriptions else []
    con.execute(f"""CREATE TABLE lh_text AS SELECT x.* EXCLUDE ({", ".join(drop)}) REPLACE ({", ".join(text)})
        FROM {table} x LEFT JOIN {fact_texts("extracted_facts")} f
        ON f.namespace = x.namespace AND f.chunk_id = x.chunk_id AND f.fact_idx = x.fact_idx ORDER BY x.rowid""")
    con.execute(f"DROP TABLE {table}")
    con.execute(f"CREATE TABLE {table} ({(OLD_STAGING if descriptions else OLD_NAMES)[table]})")
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM lh_text")
    con.execute("DROP TABLE lh_text")


# the staging tables as warehouses stored them before names were places: every name as text
OLD_NAMES = {
    "extracted_entities": "namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, name VARCHAR NOT NULL, type VARCHAR, "
                          "description VARCHAR, fact_idx INTEGER",
    "extracted_relations": "namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, source VARCHAR NOT NULL, "
                           "target VARCHAR NOT NULL, description VARCHAR, weight DOUBLE, type VARCHAR, fact_idx INTEGER",
}


def _staged_as_before(tmp_path, tables: dict, descriptions: bool):
    """An indexed home whose staging `tables` are put back as an older warehouse stored them, its graph tables
    kept beside as before_*, the entities stage's inputs forgotten so that they are built again whole: the home's
    settings, its staged rows as this version stores them, and the connection (to close)."""
    from lazyhippo.stages.entities import MODELS

    settings = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(settings)
    con = duckdb.connect(str(settings.db_path))
    staged = {t: con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables}
    for t in MODELS:
        con.execute(f"CREATE TABLE before_{t} AS SELECT * FROM {t}")
    for t in tables:
        _as_text(con, t, descriptions=descriptions)
    con.execute("DELETE FROM stage_inputs WHERE stage = 'entities'")
    return settings, staged, con


def _opened_builds_the_same(settings, tables: dict, staged: dict, caplog):
    """Opening the home stores the staged rows again, and the graph tables built from them are those before."""
    from lazyhippo.stages.entities import MODELS, build_graph_tables

    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        assert {t: con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables} == staged
        build_graph_tables(settings, con)
        assert {t: _differing_rows(con, t, f"before_{t}") for t in MODELS} == dict.fromkeys(MODELS, 0)
        assert all(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] > 0 for t in MODELS)


def test_a_warehouse_that_stored_names_as_text_stores_places_once_on_open_and_builds_the_same_graph(
        tmp_path, caplog):
    """The migration stores the rows the staging load stores, in the same order, and the graph tables built
    from them are the ones built before."""
    settings, staged, con = _staged_as_before(tmp_path, OLD_NAMES, descriptions=False)
    con.close()
    _opened_builds_the_same(settings, OLD_NAMES, staged, caplog)
    assert "names" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings):
        pass
    assert "rewriting" not in caplog.text  # once


# the staging tables as warehouses stored them before: every description as text
OLD_STAGING = {
    "extracted_entities": "namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, name VARCHAR NOT NULL, type VARCHAR, "
                          "description VARCHAR",
    "extracted_relations": "namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, source VARCHAR NOT NULL, "
                           "target VARCHAR NOT NULL, description VARCHAR, weight DOUBLE, type VARCHAR",
}


def test_a_warehouse_that_stored_descriptions_as_text_refers_to_facts_once_on_open_and_builds_the_same_graph(
        tmp_path, caplog):
    """The migration stores the rows the staging load stores (the same references, in the same order), and the
    graph tables built from them are the ones built before, row for row."""
    settings, staged, con = _staged_as_before(tmp_path, OLD_STAGING, descriptions=True)
    texts = con.execute("SELECT count(description) FROM extracted_relations").fetchone()[0]
    assert texts == len(staged["extracted_relations"]) > 100
    con.close()
    _opened_builds_the_same(settings, OLD_STAGING, staged, caplog)
    assert "descriptions" in caplog.text and "names" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        n = con.execute("SELECT count(*) FROM extracted_relations").fetchone()[0]
    assert n == len(staged["extracted_relations"])
    assert "rewriting" not in caplog.text  # once


# the fact tables as warehouses stored them before spans: every text
OLD_FACTS = {
    "extracted_facts": "namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, fact_idx INTEGER NOT NULL, "
                       "text VARCHAR NOT NULL, names VARCHAR[] NOT NULL",
    "facts": "namespace VARCHAR NOT NULL, fact_id VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, text VARCHAR NOT NULL, "
             "entity_ids VARCHAR[] NOT NULL",
}


KEYS = {"extracted_facts": "chunk_id || '#' || fact_idx", "facts": "fact_id"}


def _facts_as_text(con, table: str) -> None:
    """Rewrite the fact table `table` with every text stored, in the layout `OLD_FACTS` gives it."""
    con.execute(f"""CREATE TABLE lh_text AS SELECT x.* EXCLUDE (span_start, span_length)
                    REPLACE (coalesce(x.text, substr(c.text, x.span_start + 1, x.span_length)) AS text)
                    FROM {table} x LEFT JOIN chunks c USING (namespace, chunk_id) ORDER BY x.rowid""")
    con.execute(f"DROP TABLE {table}")
    con.execute(f"CREATE TABLE {table} ({OLD_FACTS[table]})")
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM lh_text")
    con.execute("DROP TABLE lh_text")


def test_the_query_index_takes_the_facts_spans_and_reads_a_snapshot_written_before_them_alike(tmp_path):
    """The query index's facts are the snapshot's spans, no text held whole; a snapshot published before spans
    (every text stored, never rewritten) gives the same texts, each held whole."""
    from lazyhippo.graph.passage import GraphParams
    from lazyhippo.query.loader import build_index

    settings = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(settings)
    path = snapshot_path(settings)

    def facts():
        with connect(settings, read_only=True) as con:
            return build_index(con, settings.namespace, str(path), GraphParams()).facts

    spans = facts()
    with duckdb.connect(str(path)) as con:
        _facts_as_text(con, "facts")
    texts = facts()
    assert len(spans.texts) > 10 and len(spans.texts.whole) == 0 and (spans.texts.length >= 0).all()
    assert len(texts.texts.whole) == len(texts.texts) and list(texts.texts) == list(spans.texts)


def test_a_warehouse_that_stored_facts_texts_stores_their_places_once_on_open_and_reads_them_back_equal(
        tmp_path, caplog):
    """Every fact's text (a sentence of its chunk) was stored beside its chunk's text: opened, the two tables hold
    the rows the staging load and the facts model store (each text its place in the chunk's text, in the same
    order), a text not found in its chunk kept whole; every text reads back as it was, and the entities stage's
    fingerprints of the chunks do not change (nothing is rebuilt)."""
    from lazyhippo.stages.entities import _chunk_hashes

    settings = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    run_index(settings)
    con = duckdb.connect(str(settings.db_path))
    stored = {t: con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in OLD_FACTS}
    assert all(len(rows) > 10 and all(r[3] is not None and r[5] is None for r in rows) for rows in stored.values())
    con.close()
    with connect(settings) as con:
        hashes = _chunk_hashes(con, settings.namespace)
    con = duckdb.connect(str(settings.db_path))
    texts = {}
    for t in OLD_FACTS:
        _facts_as_text(con, t)
        # the first row's text is nowhere in its chunk
        con.execute(f"UPDATE {t} SET text = 'elsewhere: ' || text WHERE rowid = 0")
        texts[t] = dict(con.execute(f"SELECT {KEYS[t]}, text FROM {t}").fetchall())
        first = con.execute(f"SELECT text FROM {t} WHERE rowid = 0").fetchall()[0][0]
        assert texts[t][stored[t][0][1] + "#0" if t == "extracted_facts" else stored[t][0][1]] == first
    con.close()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings) as con:
        rows = {t: con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in OLD_FACTS}
        read = {t: dict(con.execute(f"SELECT {KEYS[t]}, text FROM {fact_texts(t, con)}").fetchall()) for t in OLD_FACTS}
        moved = _chunk_hashes(con, settings.namespace)
    for t in OLD_FACTS:
        assert rows[t][1:] == stored[t][1:]
        assert rows[t][0][:3] == stored[t][0][:3] and rows[t][0][3:5] == (None, None)
        assert rows[t][0][5].startswith("elsewhere: ")
    assert read == texts
    assert "facts' texts" in caplog.text
    assert {c: h for c, h in moved.items() if c != stored["extracted_facts"][0][1]} == \
        {c: h for c, h in hashes.items() if c != stored["extracted_facts"][0][1]}
    caplog.clear()
    with caplog.at_level("WARNING", logger="lazyhippo.stores.warehouse"), connect(settings):
        pass
    assert "rewriting" not in caplog.text  # once


def test_a_warehouse_with_hex_fingerprints_gets_the_integers_this_version_computes_once_on_open(tmp_path):
    """Text hashes and stage fingerprints written as hex text become the integers the stages now compute for
    the same inputs, so an update after the upgrade embeds and recomputes nothing again: a text hash's first 64
    bits, a fingerprint's text hashed (the KNN stage's with its text hashes as integers, the entities stage's
    entity ids kept as the detail)."""
    from lazyhippo.sources.files import sha
    from lazyhippo.stages.incremental import PARAMS, fingerprint, knn_inputs, read_details, read_inputs

    settings = Settings(home=tmp_path / "old")
    settings.home.mkdir()
    old = duckdb.connect(str(settings.db_path))
    old.execute("CREATE TABLE embeddings (namespace VARCHAR NOT NULL, kind VARCHAR NOT NULL, item_id VARCHAR NOT NULL, "
                "model VARCHAR NOT NULL, vector TINYINT[] NOT NULL, scale FLOAT NOT NULL, text_hash VARCHAR)")
    old.execute("CREATE TABLE stage_inputs (namespace VARCHAR NOT NULL, stage VARCHAR NOT NULL, "
                "item_id VARCHAR NOT NULL, fingerprint VARCHAR NOT NULL)")
    texts = {"e_1": "Ada Fenwick", "e_2": "Marlow Observatory"}
    old.executemany("INSERT INTO embeddings VALUES ('default', 'entity', ?, 'static-256', [1, 2], 0.5, ?)",
                    [(i, sha(t, 32)) for i, t in texts.items()])
    old.execute("INSERT INTO embeddings VALUES ('default', 'entity', 'e_3', 'static-256', [1, 2], 0.5, NULL)")
    old.executemany("INSERT INTO stage_inputs VALUES ('default', ?, ?, ?)", [
        ("knn_edges", "e_1", f"static-256:{sha(texts['e_1'], 32)}"), ("knn_edges", "e_2", f"static-256:{sha(texts['e_2'], 32)}"),
        ("knn_edges", "e_3", "static-256:"), ("knn_edges", PARAMS, "10:0.6"),
        ("entities", "c_1", "3:-1234 e_1 e_2"), ("entities", "c_2", "1:77 "), ("entities", PARAMS, "0:abc:offline"),
        ("chunks", "d_1", "5d23262a8109c1e008aed6ee2d737ec0"), ("documents", "source", "/data/src")])
    old.close()
    with connect(settings) as con:
        hashes = dict(con.execute("SELECT item_id, text_hash FROM embeddings").fetchall())
        assert hashes == {"e_1": fingerprint(texts["e_1"]), "e_2": fingerprint(texts["e_2"]), "e_3": None}
        now = {i: fingerprint(v) for i, v in knn_inputs(con, "default", 10, 0.6).items()}
        assert read_inputs(con, "default", "knn_edges") == now  # the KNN stage finds nothing changed
        assert read_inputs(con, "default", "entities") == {
            "c_1": fingerprint("3:-1234"), "c_2": fingerprint("1:77"), PARAMS: fingerprint("0:abc:offline")}
        assert read_details(con, "default", "entities") == {"c_1": "e_1 e_2", "c_2": ""}
        assert read_inputs(con, "default", "chunks") == {"d_1": fingerprint("5d23262a8109c1e008aed6ee2d737ec0")}
        assert read_inputs(con, "default", "documents") == {"source": fingerprint("/data/src")}
        assert not con.execute("SELECT * FROM duckdb_tables() WHERE table_name LIKE 'lh_old%'").fetchall()
    with connect(settings) as con:  # once: opened again, the same rows
        assert dict(con.execute("SELECT item_id, text_hash FROM embeddings").fetchall()) == hashes
        assert con.execute("SELECT count(*) FROM stage_inputs").fetchone()[0] == 9


def test_stored_vectors_come_in_id_order_from_rows_stored_in_any_order_batch_by_batch(tmp_path):
    """The KNN stage's read: the ids sorted here, each stored row put at its id's place as its batch arrives."""
    from lazyhippo.stores.warehouse import read_stored_vectors

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    names = [f"e{i:04d}" for i in rng.permutation(300)]  # stored in no id order
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    con.execute("CREATE TABLE embeddings (namespace VARCHAR, kind VARCHAR, item_id VARCHAR, vector BLOB, scale FLOAT)")
    q, scale = quantize(vectors)
    con.register("v", pa.table({"item_id": names, "vector": q, "scale": scale}))
    con.execute("INSERT INTO embeddings SELECT 'ns', 'entity', item_id, vector, scale FROM v")
    con.execute("INSERT INTO embeddings SELECT 'ns', 'chunk', item_id, vector, scale FROM v")  # another kind
    ids, codes, scales = read_stored_vectors(con, "ns", "entity", batch=7)
    expected = np.frombuffer(b"".join(q.to_pylist()), np.int8).reshape(300, 16)
    at = {n: i for i, n in enumerate(names)}
    assert ids == sorted(names)
    assert np.array_equal(codes, expected[[at[n] for n in ids]]) and np.array_equal(scales, scale[[at[n] for n in ids]])


def test_release_cache_gives_back_duckdbs_cached_blocks_and_keeps_its_cap(tmp_path, monkeypatch):
    """A scan leaves its table's blocks in DuckDB's cache up to its cap; before a stage's own large arrays
    they go, and the cap (lowered for a moment) is what it was."""
    from lazyhippo.stores.warehouse import release_cache

    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    con.execute("SET memory_limit = '512MB'")
    con.execute("CREATE TABLE t AS SELECT i, md5(i::VARCHAR) AS s FROM range(2000000) r(i)")
    con.close()
    monkeypatch.setenv("LAZYHIPPO_DUCKDB_MEMORY", "512MB")
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    con.execute("SET memory_limit = '512MB'")
    cached = "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'BASE_TABLE'"
    con.execute("SELECT count(DISTINCT s) FROM t").fetchall()
    assert con.execute(cached).fetchone()[0] > 20 << 20
    release_cache(con)
    assert con.execute(cached).fetchone()[0] <= 1 << 20
    assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "488.2 MiB"
