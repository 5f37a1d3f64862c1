"""Graph completeness audit: a small clean graph passes every check; each deliberate break fails its check
(and only that one), on the embedded store (warehouse tables) and on Neo4j (the same graph synced there)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lazyhippo.evaluate import audit
from lazyhippo.settings import Settings
from lazyhippo.stores.warehouse import connect, quantize, replace_rows
from tests.services_fixtures import minio_store, namespaces, neo4j_store  # noqa: F401 - fixtures

CHECKS = ("knn_edges_present", "entities_have_community", "entities_have_pagerank", "chunks_have_mentions",
          "communities_have_summary", "no_orphan_edges")

# two documents, five chunks, six entities in two communities
DOCS = [("d1", "Alpha report"), ("d2", "Beta notes")]
CHUNKS = [("c1", "d1", 0), ("c2", "d1", 1), ("c3", "d1", 2), ("c4", "d2", 0), ("c5", "d2", 1)]
ENTITIES = ["e1", "e2", "e3", "e4", "e5", "e6"]
MENTIONS = [("c1", "e1"), ("c1", "e2"), ("c2", "e2"), ("c3", "e3"), ("c4", "e4"), ("c4", "e5"), ("c5", "e6")]
RELATIONS = [("e1", "e2"), ("e2", "e3"), ("e4", "e5"), ("e5", "e6")]
KNN = [("e1", "e3", 0.91), ("e3", "e1", 0.91), ("e4", "e6", 0.85)]
COMMUNITY = {"e1": "k_0", "e2": "k_0", "e3": "k_0", "e4": "k_1", "e5": "k_1", "e6": "k_1"}


def _table(rows: list[dict], ns: str) -> pa.Table:
    return pa.Table.from_pylist([{"namespace": ns, **r} for r in rows])


def build_graph(con, ns: str) -> None:
    replace_rows(con, "documents", ns, _table([{"doc_id": d, "source": f"{d}.txt", "title": t, "kind": "text",
                                               "content_hash": d, "n_chars": 10, "sections": "[]"} for d, t in DOCS], ns))
    replace_rows(con, "chunks", ns, _table([{"chunk_id": c, "doc_id": d, "title": dict(DOCS)[d], "position": p,
                                            "section": None, "page": None, "text": f"text of {c}", "content_hash": c,
                                            "n_tokens": 3} for c, d, p in CHUNKS], ns))
    replace_rows(con, "entities", ns, _table([{"entity_id": e, "name": e.upper(), "norm_name": e, "type": "THING",
                                              "description": f"{e} is a thing", "mention_count": 1, "degree": 1}
                                             for e in ENTITIES], ns))
    replace_rows(con, "mentions", ns, _table([{"chunk_id": c, "entity_id": e, "count": 1} for c, e in MENTIONS], ns))
    replace_rows(con, "relations", ns, _table([{"source_id": a, "target_id": b,
                                               "description": "related", "weight": 1.0, "n_chunks": 1}
                                              for a, b in RELATIONS], ns))
    replace_rows(con, "knn_edges", ns, _table([{"source_id": a, "target_id": b, "score": s, "rank": 1}
                                              for a, b, s in KNN], ns))
    # near-parallel entity vectors: pairs reach the KNN cutoff, so KNN edges are due
    vectors, scales = quantize(np.array([[1.0, 0.1 * i] for i in range(len(ENTITIES))]))
    replace_rows(con, "embeddings", ns, _table([{"kind": "entity", "item_id": e, "model": "test", "text_hash": i,
                                                "vector": v, "scale": float(sc)}
                                               for i, (e, v, sc) in enumerate(zip(ENTITIES, vectors.to_pylist(), scales))], ns))
    replace_rows(con, "entity_scores", ns, _table([{"entity_id": e, "community_id": c, "pagerank": 1 / 6}
                                                  for e, c in COMMUNITY.items()], ns))
    replace_rows(con, "communities", ns, _table([{"community_id": c, "level": 0, "size": 3, "modularity": 0.5}
                                                for c in ("k_0", "k_1")], ns))
    replace_rows(con, "community_summaries", ns, _table([{"community_id": c, "title": c, "summary": f"about {c}",
                                                          "hub_entities": ["E1"]} for c in ("k_0", "k_1")], ns))


SYNC_STAGES = ("documents", "chunks", "entities", "knn_edges", "communities", "community_summaries")


@dataclass
class Graph:
    """One synthetic graph on one store, with the means to break it there."""

    kind: str
    settings: Settings
    store: object = None

    @property
    def ns(self) -> str:
        return self.settings.namespace

    def audit(self, **kw) -> dict[str, audit.CheckResult]:
        with connect(self.settings) as con:
            facts = audit.WarehouseFacts(con, self.ns) if self.kind == "embedded" else audit.Neo4jFacts(self.store, self.ns)
            return {r.name: r for r in audit.audit_graph(facts, knn_top_k=10, **kw)}

    def sql(self, statement: str, *params) -> None:
        with connect(self.settings) as con:
            con.execute(statement, [self.ns, *params])

    def cypher(self, statement: str, **params) -> None:
        self.store.query(statement, {"ns": self.ns, **params}, write=True)

    def break_(self, what: str) -> None:
        emb = self.kind == "embedded"
        if what == "knn_edges_present":
            self.sql("DELETE FROM knn_edges WHERE namespace = ?") if emb else self.cypher(
                "MATCH (:Entity {namespace: $ns})-[r:SEMANTICALLY_SIMILAR]->() DELETE r")
        elif what == "entities_have_community":
            self.sql("UPDATE entity_scores SET community_id = 'k_gone' WHERE namespace = ? AND entity_id = 'e1'") if emb \
                else self.cypher("MATCH (e:Entity {namespace: $ns, id: 'e1'}) REMOVE e.community_id")
        elif what == "entities_have_pagerank":
            self.sql("UPDATE entity_scores SET pagerank = 'NaN'::DOUBLE WHERE namespace = ? AND entity_id = 'e2'") if emb \
                else self.cypher("MATCH (e:Entity {namespace: $ns, id: 'e2'}) REMOVE e.pagerank")
        elif what == "chunks_have_mentions":  # 2 of 5 chunks (40%) mention nothing
            self.sql("DELETE FROM mentions WHERE namespace = ? AND chunk_id IN ('c3', 'c5')") if emb else self.cypher(
                "MATCH (c:Chunk {namespace: $ns})-[r:MENTIONS]->() WHERE c.id IN ['c3', 'c5'] DELETE r")
        elif what == "communities_have_summary":
            self.sql("DELETE FROM community_summaries WHERE namespace = ? AND community_id = 'k_1'") if emb \
                else self.cypher("MATCH (c:Community {namespace: $ns, id: 'k_1'}) REMOVE c.summary")
        elif what == "no_orphan_edges":  # a relation to something that is no entity
            self.sql("INSERT INTO relations (namespace, source_id, target_id, description, weight, n_chunks) "
                     "VALUES (?, 'e1', 'e_ghost', 'x', 1.0, 1)") if emb else self.cypher(
                "MATCH (a:Entity {namespace: $ns, id: 'e1'}) MERGE (g:Document {namespace: $ns, id: 'e_ghost'}) "
                "MERGE (a)-[:RELATED_TO {namespace: $ns, id: 'r_ghost'}]->(g)")
        else:
            raise ValueError(what)


@pytest.fixture(params=["embedded", pytest.param("neo4j", marks=pytest.mark.services)])
def graph(request, tmp_path: Path) -> Graph:
    if request.param == "embedded":
        settings = Settings(home=tmp_path, namespace="audit")
        with connect(settings) as con:
            build_graph(con, settings.namespace)
        return Graph("embedded", settings)
    store = request.getfixturevalue("neo4j_store")
    settings = Settings(home=tmp_path, namespace=request.getfixturevalue("namespaces")("audit"))
    with connect(settings) as con:
        build_graph(con, settings.namespace)
        for stage in SYNC_STAGES:
            store.sync(con, settings.namespace, stage)
    return Graph("neo4j", settings, store)


def test_clean_graph_passes_every_check(graph: Graph):
    results = graph.audit()
    assert set(results) == set(CHECKS)
    assert all(r.passed for r in results.values()), [str(r) for r in results.values() if not r.passed]
    assert results["knn_edges_present"].figures["knn_edges"] == 3
    assert results["chunks_have_mentions"].figures["chunks"] == 5


@pytest.mark.parametrize("broken", CHECKS)
def test_each_break_fails_its_check_only(graph: Graph, broken: str):
    graph.break_(broken)
    results = graph.audit()
    assert not results[broken].passed, str(results[broken])
    others = [str(r) for name, r in results.items() if name != broken and not r.passed]
    assert not others, others


def test_failures_name_what_is_missing(graph: Graph):
    for what in ("entities_have_community", "entities_have_pagerank", "communities_have_summary", "no_orphan_edges"):
        graph.break_(what)
    results = graph.audit()
    assert results["entities_have_community"].examples == ["e1"]
    assert results["entities_have_pagerank"].examples == ["e2"]
    assert results["communities_have_summary"].examples == ["k_1"]
    assert results["no_orphan_edges"].figures["orphan_relations"] == 1
    assert "e_ghost" in results["no_orphan_edges"].examples[0]


def test_unmentioned_chunks_are_listed_and_fail_only_above_the_share(graph: Graph):
    graph.break_("chunks_have_mentions")
    res = graph.audit(max_unmentioned_share=0.4)["chunks_have_mentions"]
    assert res.passed and res.figures["without_mentions"] == 2 and res.figures["share"] == 0.4
    assert [e.split(" ")[0] for e in res.examples] == ["c3", "c5"]
    assert "(Alpha report)" in res.examples[0]
    assert not graph.audit(max_unmentioned_share=0.2)["chunks_have_mentions"].passed


def test_knn_check_is_off_when_knn_is_disabled(graph: Graph):
    graph.break_("knn_edges_present")
    with connect(graph.settings) as con:
        facts = audit.WarehouseFacts(con, graph.ns) if graph.kind == "embedded" else audit.Neo4jFacts(graph.store, graph.ns)
        assert audit.check_knn_edges(facts, knn_top_k=0).passed
        assert not audit.check_knn_edges(facts, knn_top_k=5).passed


def test_dagster_checks_wrap_the_audit(graph: Graph):
    """The asset checks, invoked directly with resources: the same verdicts, as AssetCheckResults."""
    import dagster as dg

    from lazyhippo_dagster.assets import checks_completeness as checks
    from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource

    lh = LazyhippoResource(home=str(graph.settings.home), namespace=graph.ns)
    gs = GraphStoreResource(kind=graph.kind)
    ok = checks.knn_edges_present(lazyhippo=lh, graph_store=gs)
    assert ok.passed and "best_pair_similarity" not in ok.metadata  # edges exist: no vector read to explain them
    graph.break_("knn_edges_present")
    graph.break_("chunks_have_mentions")
    res = checks.knn_edges_present(lazyhippo=lh, graph_store=gs)
    assert isinstance(res, dg.AssetCheckResult) and not res.passed
    assert res.metadata["knn_edges"].value == 0 and res.metadata["store"].value == graph.kind
    assert res.metadata["best_pair_similarity"].value >= res.metadata["cutoff"].value  # why edges were due
    lenient = checks.chunks_have_mentions(checks.ChunkMentionsConfig(max_unmentioned_share=0.5), lazyhippo=lh, graph_store=gs)
    strict = checks.chunks_have_mentions(checks.ChunkMentionsConfig(), lazyhippo=lh, graph_store=gs)
    assert lenient.passed and not strict.passed
    assert any("c3" in r.data["failing"] for r in strict.metadata["failing"].records)
    assert checks.entities_have_community(lazyhippo=lh, graph_store=gs).passed
