"""Graph completeness audit: plain functions over the materialized graph, whichever store holds it.

`WarehouseFacts` reads the DuckDB tables (embedded store); `Neo4jFacts` counts with Cypher on the served graph.
Each `check_*` returns a `CheckResult` (passed + figures + failing examples); the Dagster asset checks in
`assets/checks_completeness.py` are thin wrappers, and tests call these directly.
"""

from __future__ import annotations

from typing import Protocol

from lazyhippo.evaluate.checks import CheckResult

EXAMPLES = 20


class GraphFacts(Protocol):
    store: str
    namespace: str

    def entity_count(self) -> int: ...
    def knn_edge_count(self) -> int: ...
    def chunk_count(self) -> int: ...
    def community_count(self) -> int: ...
    def entities_without_community(self) -> list[str]: ...
    def entities_without_pagerank(self) -> list[str]: ...
    def chunks_without_mentions(self) -> list[tuple[str, str]]: ...   # (chunk_id, title)
    def communities_without_summary(self) -> list[str]: ...
    def orphan_edges(self, kind: str) -> list[str]: ...               # kind: "relations" | "knn"


class WarehouseFacts:
    """The DuckDB tables of one namespace (the embedded store's graph)."""

    store = "embedded"

    def __init__(self, con, namespace: str):
        self.con = con
        self.namespace = namespace

    def _ids(self, sql: str) -> list[str]:
        return [r[0] for r in self.con.execute(sql, [self.namespace]).fetchall()]

    def _count(self, table: str) -> int:
        return self.con.execute(f"SELECT count(*) FROM {table} WHERE namespace = ?", [self.namespace]).fetchone()[0]

    def entity_count(self) -> int:
        return self._count("entities")

    def knn_edge_count(self) -> int:
        return self._count("knn_edges")

    def chunk_count(self) -> int:
        return self._count("chunks")

    def community_count(self) -> int:
        return self._count("communities")

    def entities_without_community(self) -> list[str]:
        return self._ids("""
            SELECT e.entity_id FROM entities e
            LEFT JOIN entity_scores s ON s.namespace = e.namespace AND s.entity_id = e.entity_id
            LEFT JOIN communities c ON c.namespace = s.namespace AND c.community_id = s.community_id
            WHERE e.namespace = ? AND (s.community_id IS NULL OR c.community_id IS NULL) ORDER BY 1""")

    def entities_without_pagerank(self) -> list[str]:
        return self._ids("""
            SELECT e.entity_id FROM entities e
            LEFT JOIN entity_scores s ON s.namespace = e.namespace AND s.entity_id = e.entity_id
            WHERE e.namespace = ? AND (s.pagerank IS NULL OR isnan(s.pagerank)) ORDER BY 1""")

    def chunks_without_mentions(self) -> list[tuple[str, str]]:
        return [(r[0], r[1] or "") for r in self.con.execute("""
            SELECT c.chunk_id, c.title FROM chunks c
            WHERE c.namespace = ? AND NOT EXISTS (
                SELECT 1 FROM mentions m JOIN entities e ON e.namespace = m.namespace AND e.entity_id = m.entity_id
                WHERE m.namespace = c.namespace AND m.chunk_id = c.chunk_id)
            ORDER BY c.doc_id, c.position""", [self.namespace]).fetchall()]

    def communities_without_summary(self) -> list[str]:
        return self._ids("""
            SELECT c.community_id FROM communities c
            LEFT JOIN community_summaries s ON s.namespace = c.namespace AND s.community_id = c.community_id
            WHERE c.namespace = ? AND trim(coalesce(s.summary, '')) = '' ORDER BY 1""")

    def orphan_edges(self, kind: str) -> list[str]:
        table = {"relations": "relations", "knn": "knn_edges"}[kind]
        return [f"{a}->{b}" for a, b in self.con.execute(f"""
            SELECT r.source_id, r.target_id FROM {table} r
            WHERE r.namespace = ? AND (
                NOT EXISTS (SELECT 1 FROM entities e WHERE e.namespace = r.namespace AND e.entity_id = r.source_id)
             OR NOT EXISTS (SELECT 1 FROM entities e WHERE e.namespace = r.namespace AND e.entity_id = r.target_id))
            ORDER BY 1, 2""", [self.namespace]).fetchall()]


class Neo4jFacts:
    """The served graph in Neo4j (any object with `query(cypher, params) -> list[dict]`, e.g. Neo4jGraphStore)."""

    store = "neo4j"

    def __init__(self, store, namespace: str):
        self.db = store
        self.namespace = namespace

    def _rows(self, cypher: str) -> list[dict]:
        return self.db.query(cypher, {"ns": self.namespace})

    def _one(self, cypher: str) -> int:
        return int(self._rows(cypher)[0]["n"])

    def entity_count(self) -> int:
        return self._one("MATCH (e:Entity {namespace: $ns}) RETURN count(e) AS n")

    def knn_edge_count(self) -> int:
        return self._one("MATCH (:Entity {namespace: $ns})-[r:SEMANTICALLY_SIMILAR]->() RETURN count(r) AS n")

    def chunk_count(self) -> int:
        return self._one("MATCH (c:Chunk {namespace: $ns}) RETURN count(c) AS n")

    def community_count(self) -> int:
        return self._one("MATCH (c:Community {namespace: $ns}) RETURN count(c) AS n")

    def entities_without_community(self) -> list[str]:
        return [r["id"] for r in self._rows("""
            MATCH (e:Entity {namespace: $ns})
            WHERE e.community_id IS NULL
               OR NOT EXISTS { MATCH (e)-[:BELONGS_TO]->(c:Community {namespace: $ns}) WHERE c.id = e.community_id }
            RETURN e.id AS id ORDER BY id""")]

    def entities_without_pagerank(self) -> list[str]:
        return [r["id"] for r in self._rows("""
            MATCH (e:Entity {namespace: $ns}) WHERE e.pagerank IS NULL OR isNaN(e.pagerank)
            RETURN e.id AS id ORDER BY id""")]

    def chunks_without_mentions(self) -> list[tuple[str, str]]:
        return [(r["id"], r["title"] or "") for r in self._rows("""
            MATCH (c:Chunk {namespace: $ns})
            WHERE NOT EXISTS { MATCH (c)-[:MENTIONS]->(:Entity {namespace: $ns}) }
            RETURN c.id AS id, c.title AS title ORDER BY c.doc_id, c.position""")]

    def communities_without_summary(self) -> list[str]:
        return [r["id"] for r in self._rows("""
            MATCH (c:Community {namespace: $ns}) WHERE trim(coalesce(c.summary, '')) = ''
            RETURN c.id AS id ORDER BY id""")]

    def orphan_edges(self, kind: str) -> list[str]:
        """Edges touching this namespace whose endpoints are not both named entities of this namespace
        (stub nodes, other labels, other namespaces)."""
        rel, where = {"relations": ("", "r.id IS NOT NULL"), "knn": (":SEMANTICALLY_SIMILAR", "true")}[kind]
        rows = self._rows(f"""
            CALL () {{
                MATCH (a:Entity {{namespace: $ns}})-[r{rel}]-(b) WHERE {where} RETURN DISTINCT r
                UNION
                MATCH ()-[r{rel} {{namespace: $ns}}]->() WHERE {where} RETURN r
            }}
            WITH r, startNode(r) AS a, endNode(r) AS b
            WHERE NOT (a:Entity AND b:Entity AND a.namespace = $ns AND b.namespace = $ns
                       AND a.name IS NOT NULL AND b.name IS NOT NULL)
            RETURN coalesce(a.id, elementId(a)) + '->' + coalesce(b.id, elementId(b)) AS edge ORDER BY edge""")
        return [r["edge"] for r in rows]


# ---------------------------------------------------------------------------------------------- checks

def check_not_empty(facts: GraphFacts) -> CheckResult:
    """An empty graph (no chunk or no entity) would let every other check pass vacuously."""
    chunks, entities = facts.chunk_count(), facts.entity_count()
    return CheckResult("graph_not_empty", chunks > 0 and entities > 0, "the namespace has chunks and entities",
                       {"chunks": chunks, "entities": entities, "store": facts.store})


def best_pair_similarity(vectors, sample: int = 2000) -> float:
    """The highest cosine between two different entities: exact up to `sample` entities, else over an even
    sample of them (a lower bound, enough to know that edges were due)."""
    import numpy as np

    if len(vectors) < 2:
        return -1.0
    v = np.asarray(vectors, dtype=np.float32)[np.linspace(0, len(vectors) - 1, min(sample, len(vectors))).astype(int)]
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    sims = v @ v.T
    np.fill_diagonal(sims, -np.inf)
    return float(sims.max())


def check_knn_edges(facts: GraphFacts, knn_top_k: int, cutoff: float | None = None,
                    best_pair: float | None = None) -> CheckResult:
    """Edges are due only when KNN is on and some pair of entities reaches the cutoff: a small corpus whose
    entities are all unlike each other rightly has none."""
    entities, edges = facts.entity_count(), facts.knn_edge_count()
    reachable = cutoff is None or best_pair is None or best_pair >= cutoff
    due = knn_top_k > 0 and entities >= 2 and reachable
    figures = {"knn_edges": edges, "entities": entities, "knn_top_k": knn_top_k, "store": facts.store}
    if best_pair is not None:
        figures.update(best_pair_similarity=round(best_pair, 4), cutoff=cutoff)
    return CheckResult("knn_edges_present", (not due) or edges > 0,
                       "SEMANTICALLY_SIMILAR edges exist when KNN is enabled and a pair of entities reaches the cutoff",
                       figures)


def check_entity_communities(facts: GraphFacts) -> CheckResult:
    missing = facts.entities_without_community()
    return CheckResult("entities_have_community", not missing, "every entity has a community_id of an existing community",
                       {"entities": facts.entity_count(), "without_community": len(missing), "store": facts.store},
                       missing[:EXAMPLES])


def check_entity_pagerank(facts: GraphFacts) -> CheckResult:
    missing = facts.entities_without_pagerank()
    return CheckResult("entities_have_pagerank", not missing, "every entity has a PageRank",
                       {"entities": facts.entity_count(), "without_pagerank": len(missing), "store": facts.store},
                       missing[:EXAMPLES])


def check_chunk_mentions(facts: GraphFacts, max_share: float = 0.2) -> CheckResult:
    """Chunks that mention no entity. Some are legitimate (a form page, a bare heading), so the check fails
    only above `max_share` of all chunks; every such chunk is listed."""
    chunks = facts.chunk_count()
    missing = facts.chunks_without_mentions()
    share = len(missing) / chunks if chunks else 0.0
    return CheckResult("chunks_have_mentions", share <= max_share,
                       f"at most {max_share:.0%} of chunks mention no entity",
                       {"chunks": chunks, "without_mentions": len(missing), "share": round(share, 4),
                        "max_share": max_share, "store": facts.store},
                       [f"{cid} ({title})" if title else cid for cid, title in missing])


def check_community_summaries(facts: GraphFacts) -> CheckResult:
    missing = facts.communities_without_summary()
    return CheckResult("communities_have_summary", not missing, "every community has a non-empty summary",
                       {"communities": facts.community_count(), "without_summary": len(missing), "store": facts.store},
                       missing[:EXAMPLES])


def check_orphan_edges(facts: GraphFacts, kinds: tuple[str, ...] = ("relations", "knn")) -> CheckResult:
    found = {k: facts.orphan_edges(k) for k in kinds}
    total = sum(len(v) for v in found.values())
    return CheckResult("no_orphan_edges", total == 0, "every relation / KNN edge joins two entities of the namespace",
                       {**{f"orphan_{k}": len(v) for k, v in found.items()}, "store": facts.store},
                       [f"{k}: {e}" for k, v in found.items() for e in v][:EXAMPLES])


def audit_graph(facts: GraphFacts, knn_top_k: int = 10, max_unmentioned_share: float = 0.2) -> list[CheckResult]:
    return [check_knn_edges(facts, knn_top_k), check_entity_communities(facts), check_entity_pagerank(facts),
            check_chunk_mentions(facts, max_unmentioned_share), check_community_summaries(facts),
            check_orphan_edges(facts)]
