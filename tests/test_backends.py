"""Embedded vs Neo4j+GDS / MinIO: the sample corpus indexed through `run_index` on both backends agrees.

Needs the servers (`lazyhippo services start`); skips without them, fails in CI / LAZYHIPPO_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq
import pytest

from lazyhippo.evaluate import audit
from lazyhippo.graph import algorithms as graph
from lazyhippo.index import graph_counts, run_index
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stages.communities import entity_graph
from lazyhippo.stages.exports import EXPORT_TABLES, export_query
from lazyhippo.stores.warehouse import connect
from tests.services_fixtures import minio_store, namespaces, neo4j_store  # noqa: F401 - fixtures

LABELS = ("Document", "Chunk", "Entity", "Community")
RELS = ("PART_OF", "MENTIONS", "SEMANTICALLY_SIMILAR", "BELONGS_TO")


@dataclass
class Runs:
    embedded: Settings
    neo: Settings
    emb_out: dict
    neo_out: dict
    seconds: dict


@pytest.fixture(scope="module")
def runs(tmp_path_factory, neo4j_store, minio_store, namespaces) -> Runs:  # noqa: F811
    ns = namespaces("backends")
    emb = Settings(home=tmp_path_factory.mktemp("embedded"), namespace=ns, source=str(SAMPLE_CORPUS))
    neo = Settings(home=tmp_path_factory.mktemp("neo4j"), namespace=ns, source=str(SAMPLE_CORPUS))
    t0 = time.perf_counter()
    emb_out = run_index(emb)
    t1 = time.perf_counter()
    neo_out = run_index(neo, neo4j_store, minio_store)
    t2 = time.perf_counter()
    return Runs(emb, neo, emb_out, neo_out, {"embedded": t1 - t0, "neo4j_minio": t2 - t1})


def _table(settings: Settings, sql: str) -> list[tuple]:
    with connect(settings) as con:
        return con.execute(sql, [settings.namespace]).fetchall()


def _neo_edges(store, ns: str, rel: str) -> dict[tuple[str, str], float]:
    rows = store.query(f"MATCH (a:Entity {{namespace: $ns}})-[r:{rel}]->(b:Entity {{namespace: $ns}}) "
                       "RETURN a.id AS s, b.id AS t, coalesce(r.score, r.weight) AS w", {"ns": ns})
    return {(r["s"], r["t"]): r["w"] for r in rows}



@pytest.mark.services
def test_same_tables_and_served_graph_counts(runs: Runs, neo4j_store):
    with connect(runs.embedded) as con:
        emb = graph_counts(con, runs.embedded.namespace)
    with connect(runs.neo) as con:
        neo = graph_counts(con, runs.neo.namespace)
    for table in ("documents", "chunks", "entities", "relations", "mentions", "knn_edges"):
        assert emb[table] == neo[table], table
    assert emb["entities"] > 20 and emb["relations"] > 50
    served = neo4j_store.counts(runs.neo.namespace)
    assert served["Document"] == neo["documents"] and served["Chunk"] == neo["chunks"]
    assert served["Entity"] == neo["entities"] and served["relations"] == neo["relations"]
    assert served["MENTIONS"] == neo["mentions"] and served["PART_OF"] == neo["chunks"]
    assert served["SEMANTICALLY_SIMILAR"] == neo["knn_edges"]
    with connect(runs.neo) as con:
        nested = con.execute("SELECT count(*) FROM communities WHERE namespace = ? AND parent_id IS NOT NULL",
                             [runs.neo.namespace]).fetchall()[0][0]
    assert served["Community"] == neo["communities"] and served["BELONGS_TO"] == neo["entities"] + nested


@pytest.mark.services
def test_relation_types_and_entity_types_served_as_types_and_labels(tmp_path, neo4j_store, namespaces):  # noqa: F811
    """A relation is served as a relationship of its type, in the direction the type reads; a changed type
    replaces the old relationship; entity types are labels beside Entity."""
    s = Settings(home=tmp_path, namespace=namespaces("typed"), source=str(SAMPLE_CORPUS))
    run_index(s)
    ns = s.namespace
    with connect(s) as con:
        rid, src, dst = con.execute("""SELECT r.relation_id, r.source_id, r.target_id FROM relations r
            JOIN entities a ON a.namespace = r.namespace AND a.entity_id = r.source_id
            JOIN entities b ON b.namespace = r.namespace AND b.entity_id = r.target_id
            WHERE r.namespace = ? AND list_sort([a.name, b.name]) = ['Ada Fenwick', 'Marlow Observatory']""", [ns]).fetchone()
        n_rel = con.execute("SELECT count(*) FROM relations WHERE namespace = ?", [ns]).fetchone()[0]
        people = con.execute("SELECT count(*) FROM entities WHERE namespace = ? AND type = 'PERSON'", [ns]).fetchone()[0]
        con.execute("UPDATE relations SET type = 'FOUNDED_BY', forward = false WHERE namespace = ? AND relation_id = ?",
                    [ns, rid])
        for asset in ("documents", "chunks", "entities"):
            neo4j_store.sync(con, ns, asset)
    typed = neo4j_store.query("MATCH (b:Entity {namespace: $ns})-[r:FOUNDED_BY]->(a:Entity {namespace: $ns}) "
                              "RETURN a.id AS a, b.id AS b, r.id AS id", {"ns": ns})
    assert typed == [{"a": src, "b": dst, "id": rid}]  # forward false: from target_id to source_id
    counts = neo4j_store.counts(ns)
    assert counts["relations"] == n_rel and counts["SEMANTICALLY_SIMILAR"] == 0
    labelled = neo4j_store.query("MATCH (e:Entity:PERSON {namespace: $ns}) RETURN count(e) AS n", {"ns": ns})[0]["n"]
    assert people > 0 and labelled == people
    with connect(s) as con:
        con.execute("UPDATE relations SET type = 'USES', forward = true WHERE namespace = ? AND relation_id = ?", [ns, rid])
        con.execute("UPDATE entities SET type = 'ASTRONOMER' WHERE namespace = ? AND name = 'Ada Fenwick'", [ns])
        neo4j_store.sync(con, ns, "entities")
    types = neo4j_store.query("MATCH (a:Entity {namespace: $ns})-[r {id: $id}]->(b) RETURN type(r) AS t, a.id AS a",
                              {"ns": ns, "id": rid})
    assert types == [{"t": "USES", "a": src}] and neo4j_store.counts(ns)["relations"] == n_rel
    ada = neo4j_store.query("MATCH (e:Entity {namespace: $ns, name: 'Ada Fenwick'}) RETURN labels(e) AS l", {"ns": ns})
    assert sorted(ada[0]["l"]) == ["ASTRONOMER", "Entity"]


@pytest.mark.services
def test_exact_knn_gives_identical_edges(runs: Runs, neo4j_store):
    q = "SELECT source_id, target_id, score FROM knn_edges WHERE namespace = ?"
    emb = {(a, b): s for a, b, s in _table(runs.embedded, q)}
    neo = {(a, b): s for a, b, s in _table(runs.neo, q)}
    assert emb and set(emb) == set(neo)
    assert max(abs(emb[k] - neo[k]) for k in emb) < 1e-5
    served = _neo_edges(neo4j_store, runs.neo.namespace, "SEMANTICALLY_SIMILAR")
    assert set(served) == set(neo)
    assert min(neo.values()) >= runs.neo.knn_cutoff


@pytest.mark.services
def test_communities_have_comparable_modularity(runs: Runs):
    emb, neo = runs.emb_out["communities"], runs.neo_out["communities"]
    assert abs(emb.modularity - neo.modularity) <= 0.1, (emb.modularity, neo.modularity)
    assert neo.modularity > 0.2
    # GDS's reported modularity is the usual weighted modularity: igraph agrees on the same partition
    with connect(runs.neo) as con:
        nodes, edges = entity_graph(con, runs.neo.namespace)
        member = dict(con.execute("SELECT entity_id, community_id FROM entity_scores WHERE namespace = ?",
                                  [runs.neo.namespace]).fetchall())
    g = graph.weighted_igraph(nodes, edges)
    labels = {c: i for i, c in enumerate(sorted(set(member.values())))}
    assert g.modularity([labels[member[n]] for n in nodes], weights="weight") == pytest.approx(neo.modularity, abs=1e-6)


@pytest.mark.services
def test_pagerank_agrees_with_igraph(runs: Runs):
    q = "SELECT entity_id, pagerank FROM entity_scores WHERE namespace = ? ORDER BY entity_id"
    emb, neo = dict(_table(runs.embedded, q)), dict(_table(runs.neo, q))
    assert emb.keys() == neo.keys()
    a, b = np.array([emb[k] for k in emb]), np.array([neo[k] for k in emb])
    assert np.abs(a - b).max() < 1e-4 and np.corrcoef(a, b)[0, 1] > 0.999


@pytest.mark.services
def test_rerun_creates_no_duplicates(runs: Runs, neo4j_store, minio_store):
    ns = runs.neo.namespace
    before = neo4j_store.counts(ns)
    run_index(runs.neo, neo4j_store, minio_store)
    after = neo4j_store.counts(ns)
    assert after == before
    dup_nodes = neo4j_store.query("MATCH (n {namespace: $ns}) WITH labels(n) AS l, n.id AS id, count(*) AS c "
                                  "WHERE c > 1 RETURN count(*) AS n", {"ns": ns})[0]["n"]
    dup_rels = neo4j_store.query("MATCH (a {namespace: $ns})-[r]->(b) WITH a, type(r) AS t, b, count(r) AS c "
                                 "WHERE c > 1 RETURN count(*) AS n", {"ns": ns})[0]["n"]
    assert dup_nodes == 0 and dup_rels == 0
    constraints = {r["name"] for r in neo4j_store.query("SHOW CONSTRAINTS YIELD name RETURN name")}
    assert {f"lh_{label.lower()}_key" for label in LABELS} <= constraints


@pytest.mark.services
def test_namespace_isolation(runs: Runs, neo4j_store, minio_store, namespaces):  # noqa: F811
    ns_a = runs.neo.namespace
    before = neo4j_store.counts(ns_a)
    ns_b = namespaces("isolation")
    settings_b = runs.neo.with_(namespace=ns_b, source=str(SAMPLE_CORPUS / "ada_fenwick.md"))
    run_index(settings_b, neo4j_store, minio_store)
    assert neo4j_store.counts(ns_a) == before
    b = neo4j_store.counts(ns_b)
    assert 0 < b["Entity"] < before["Entity"] and b["Document"] == 1
    shared = neo4j_store.query("MATCH (a:Entity {namespace: $a}), (b:Entity {namespace: $b}) WHERE a.id = b.id "
                               "RETURN count(*) AS n", {"a": ns_a, "b": ns_b})[0]["n"]
    assert shared > 0  # the same entity id lives on as two nodes, one per namespace
    crossing = neo4j_store.query("MATCH (a {namespace: $a})-[r]-(b {namespace: $b}) RETURN count(r) AS n",
                                 {"a": ns_a, "b": ns_b})[0]["n"]
    assert crossing == 0
    assert minio_store.list(f"{ns_b}/tables/") and all(k.startswith(f"{ns_b}/") for k in minio_store.list(f"{ns_b}/"))


@pytest.mark.services
def test_exports_on_minio_match_duckdb(runs: Runs, minio_store):
    ns = runs.neo.namespace
    keys = set(minio_store.list(f"{ns}/tables/"))
    with connect(runs.neo) as con:
        for table in EXPORT_TABLES:
            key = f"{ns}/tables/{table}.parquet"
            assert key in keys
            exported = pq.read_table(io.BytesIO(minio_store.get(key)))
            expected = con.sql(export_query(table), params=[ns]).to_arrow_table()
            assert exported.num_rows == expected.num_rows, table
            assert exported.to_pylist() == expected.to_pylist(), table
    manifests = [k for k in minio_store.list(f"{ns}/runs/") if k.endswith("manifest.json")]
    manifest = json.loads(minio_store.get(manifests[0]))
    stat = minio_store.client.stat_object(minio_store.bucket, manifest["entities"]["key"])
    assert stat.etag.strip('"') == manifest["entities"]["md5"]


@pytest.mark.services
def test_minio_put_is_idempotent_and_verified(minio_store, namespaces):  # noqa: F811
    key = f"{namespaces('objects')}/probe.bin"
    data = b"lazyhippo" * 1000
    md5 = minio_store.put(key, data)
    first = minio_store.client.stat_object(minio_store.bucket, key)
    time.sleep(1.1)
    assert minio_store.put(key, data) == md5
    assert minio_store.client.stat_object(minio_store.bucket, key).last_modified == first.last_modified  # not rewritten
    assert minio_store.get(key) == data and key in minio_store.list(key.rsplit("/", 1)[0])
    assert minio_store.put(key, data + b"!") != md5 and minio_store.get(key) == data + b"!"
    with pytest.raises(FileNotFoundError, match="s3://"):
        minio_store.get(key + ".missing")


@pytest.mark.services
def test_audit_passes_on_neo4j(runs: Runs, neo4j_store):
    facts = audit.Neo4jFacts(neo4j_store, runs.neo.namespace)
    results = audit.audit_graph(facts, knn_top_k=runs.neo.knn_top_k)
    assert all(r.passed for r in results), [str(r) for r in results if not r.passed]
    with connect(runs.embedded) as con:
        results = audit.audit_graph(audit.WarehouseFacts(con, runs.embedded.namespace), knn_top_k=10)
    assert all(r.passed for r in results), [str(r) for r in results if not r.passed]


@pytest.mark.services
def test_projections_are_dropped_after_use(runs: Runs, neo4j_store):
    from lazyhippo.stores.neo4j import slug

    names = [r["graphName"] for r in neo4j_store.query("CALL gds.graph.list() YIELD graphName RETURN graphName")]
    assert not [n for n in names if slug(runs.neo.namespace) in n]


@pytest.mark.services
def test_neo4j_ppr_ranks_like_the_embedded_store(runs: Runs, neo4j_store):
    """The same sample corpus indexed on both stores: PPR over the graph served by Neo4j gives the embedded
    scores, and the local route returns the same ranking."""
    from lazyhippo.graph.ppr import EmbeddedPPR
    from lazyhippo.query import retrieve
    from lazyhippo.query.loader import load_index
    from lazyhippo.stores.neo4j.ppr import read_served_edges, served_adjacency

    idx = load_index(runs.neo)
    served = served_adjacency(read_served_edges(neo4j_store.client, runs.neo.namespace, "v"), idx, idx.graph.params)
    adjacency = idx.graph.adjacency_matrix()
    assert served.nnz == adjacency.nnz and (served != adjacency).nnz == 0  # the same graph
    p = np.zeros(len(idx.graph.node_ids))
    p[0], p[3], p[idx.n_entities + 1] = 1.0, 0.4, 0.7  # two entities and a passage
    backend = neo4j_store.ppr_backend(runs.neo.namespace)
    expected = EmbeddedPPR().run(idx, p, 0.5, 1e-3, 50)
    assert np.abs(backend.run(idx, p, 0.5, 1e-3, 50) - expected).max() < 1e-9
    for q in ("Who founded the Marlow Observatory?", "Which river flows past the observatory town?",
              "Who succeeded Ada Fenwick?"):
        emb = retrieve(runs.embedded, q, route="local", top_k=8)
        neo = retrieve(runs.neo, q, route="local", top_k=8, ppr=backend)
        assert [c.chunk_id for c in neo] == [c.chunk_id for c in emb], q
        assert [c.score for c in neo] == pytest.approx([c.score for c in emb], abs=1e-7), q


@pytest.mark.services
def test_neo4j_ppr_follows_graph_changes(runs: Runs, neo4j_store):
    from lazyhippo.query.loader import load_index

    ns = runs.neo.namespace
    backend = neo4j_store.ppr_backend(ns)
    idx = load_index(runs.neo)
    first = backend._transition(idx)[0]
    assert backend._transition(idx)[0] is first  # cached per graph version
    with connect(runs.neo) as con:
        neo4j_store.sync(con, ns, "knn_edges")  # any graph-changing sync bumps the version
    second = backend._transition(idx)[0]
    assert second is not first and (second != first).nnz == 0  # re-read, same graph


@pytest.mark.services
def test_timings_reported(runs: Runs):
    print(f"index timings: {runs.seconds}")
    assert runs.seconds["neo4j_minio"] < 300


@pytest.mark.services
def test_knn_engines_on_synthetic_vectors(neo4j_store, namespaces):  # noqa: F811
    """gds.knn's exact settings reproduce the exact search on a few hundred points (it degrades slowly beyond:
    99.4% at 2,000 points, 96.4% on 63k entities); knn_engine="exact" is faiss, written to Neo4j."""
    from lazyhippo.stores.neo4j import Neo4jGraphStore

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(20, 32))
    x = centers[rng.integers(0, 20, 400)] + 0.5 * rng.normal(size=(400, 32))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    ids = [f"x{i:04d}" for i in range(len(x))]
    exact = {(e.source, e.target) for e in graph.knn_edges(ids, x, 10, 0.3)}
    ns = namespaces("knn")
    gds_edges = {(e.source, e.target) for e in neo4j_store.knn(ns, ids, x, 10, 0.3)}
    assert gds_edges == exact
    faiss_store = Neo4jGraphStore.from_env(knn_engine="exact", fastrp_dim=0)
    try:
        assert {(e.source, e.target) for e in faiss_store.knn(ns, ids, x, 10, 0.3)} == exact
    finally:
        faiss_store.close()


def test_unreachable_neo4j_is_a_clear_error():
    from lazyhippo.stores import open_graph_store
    from lazyhippo.stores.neo4j import Neo4jStoreError

    t0 = time.perf_counter()
    with pytest.raises(Neo4jStoreError, match=r"bolt://127\.0\.0\.1:9.*unreachable") as err:
        open_graph_store("neo4j", uri="bolt://127.0.0.1:9", password="not-logged-secret")
    assert time.perf_counter() - t0 < 10  # fails fast: a bounded connect timeout, no long retry loop
    assert "not-logged-secret" not in str(err.value)


def test_unreachable_minio_is_a_clear_error():
    from lazyhippo.stores.minio import MinioObjectStore
    from lazyhippo.stores.objects import ObjectStoreError

    store = MinioObjectStore("127.0.0.1:9", "bucket", "user", "not-logged-secret", timeout=2, retries=0)
    with pytest.raises(ObjectStoreError, match=r"http://127\.0\.0\.1:9.*unreachable.*s3://bucket/ns/tables/x\.parquet") as err:
        store.put("ns/tables/x.parquet", b"data")
    assert "not-logged-secret" not in str(err.value) and "not-logged-secret" not in repr(store)
