"""Query-time Personalized PageRank for the Neo4j store: the embedded algorithm over the served graph.

The entity+passage edges are read from Neo4j once per graph version (every graph-changing sync bumps it) and
turned into the same adjacency the query loader builds (`passage_graph.passage_adjacency`, same GraphParams),
aligned to the index's node order; each query is then the in-process sparse power iteration. So the ranking is
the embedded store's, and a query costs no server round trip beyond a version check every `version_ttl` seconds.
Why not `gds.pageRank` with `sourceNodes`: the open GDS build rejects weighted source nodes, and the grouped
workaround cost 200+ ms per query and changed the ranking (docs/backends.md).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lazyhippo.graph.passage import EntityEdges, GraphParams, passage_adjacency
from lazyhippo.stores.neo4j.client import RELATIONS, Neo4jClient


@dataclass(frozen=True)
class ServedEdges:
    """The graph PPR walks, as Neo4j serves it at one version (ids, not positions)."""

    version: str
    entity_types: dict[str, str]
    relations: tuple[list, list, list]     # source ids, target ids, weights (None: no weight)
    synonyms: tuple[list, list, list]      # source ids, target ids, scores
    mentions: list[tuple[str, str, int]]   # chunk id, entity id, count


def read_served_edges(client: Neo4jClient, namespace: str, version: str) -> ServedEdges:
    ns = {"ns": namespace}
    types = client.query("MATCH (e:Entity {namespace: $ns}) RETURN collect(e.id) AS ids, collect(coalesce(e.type, '')) AS types",
                         ns, raw=True)[0]
    rel = client.query(f"MATCH {RELATIONS} "
                       "RETURN collect(a.id) AS s, collect(b.id) AS t, collect(r.weight) AS w", ns, raw=True)[0]
    syn = client.query("MATCH (a:Entity {namespace: $ns})-[r:SEMANTICALLY_SIMILAR]->(b:Entity {namespace: $ns}) "
                       "RETURN collect(a.id) AS s, collect(b.id) AS t, collect(r.score) AS w", ns, raw=True)[0]
    men = client.query("MATCH (c:Chunk {namespace: $ns})-[r:MENTIONS]->(e:Entity {namespace: $ns}) "
                       "RETURN collect(c.id) AS c, collect(e.id) AS e, collect(r.count) AS n", ns, raw=True)[0]
    return ServedEdges(version, dict(zip(types["ids"], types["types"])),
                       (rel["s"], rel["t"], rel["w"]), (syn["s"], syn["t"], syn["w"]),
                       list(zip(men["c"], men["e"], men["n"])))


def served_adjacency(edges: ServedEdges, index, params: GraphParams) -> sp.csr_matrix:
    """`edges` as the adjacency over `index`'s node order (entities, then chunks); nodes the index does not
    know are left out, as the loader leaves out rows without an entity. Which entity a passage's title names
    is derived from names and titles the way the loader derives it (`index.mentions.title_entity`), so the
    title edges are the same on both stores."""
    from lazyhippo.graph.algorithms import positions

    entity_ids, chunk_ids = index.entities.ids.arrow(), index.chunks.ids.arrow()  # looked up in Arrow, at once
    n_e, n_p = len(entity_ids), len(chunk_ids)
    mentions = edges.mentions
    rows = positions(chunk_ids, [c for c, _, _ in mentions])
    cols = positions(entity_ids, [e for _, e, _ in mentions])
    keep = (rows >= 0) & (cols >= 0)
    counts = np.asarray([n for _, _, n in mentions], dtype=np.float32).reshape(-1)[keep]
    # one (chunk, entity) entry per mention row, in canonical order, as the loader's count matrix has it
    counts_m = sp.coo_matrix((counts, (rows[keep], cols[keep])), shape=(n_p, n_e)).tocsr().tocoo()
    is_title = index.mentions.title_entity[counts_m.row] == counts_m.col
    return passage_adjacency(
        params, n_e, n_p, [edges.entity_types.get(e, "") for e in index.entities.ids],
        EntityEdges.of(entity_ids, *edges.relations), EntityEdges.of(entity_ids, *edges.synonyms),
        counts_m, is_title)


class Neo4jPPR:
    """PPRBackend for lazyhippo.query (`run(index, personalization, damping, tol, max_iter)`)."""

    name = "neo4j"

    def __init__(self, client: Neo4jClient, namespace: str, version_ttl: float = 2.0):
        self.client = client
        self.namespace = namespace
        self.version_ttl = version_ttl   # a reindex takes far longer than this delay in noticing it
        self._lock = threading.Lock()
        self._version: tuple[str, float] | None = None
        self._edges: ServedEdges | None = None
        self._matrix: tuple | None = None   # (edges, index node ids, params, transition, dangling, matvec)

    def invalidate(self) -> None:
        """Forget the graph version (this process just changed the graph)."""
        self._version = None

    def version(self) -> str:
        now = time.monotonic()
        if self._version is None or now - self._version[1] > self.version_ttl:
            self._version = (self.client.graph_version(self.namespace) or "none", now)
        return self._version[0]

    def _transition(self, index):
        from lazyhippo.graph.ppr import parallel_matvec, transition_matrix

        params = index.graph.params
        with self._lock:
            version = self.version()
            if self._edges is None or self._edges.version != version:
                self._edges = read_served_edges(self.client, self.namespace, version)
            m = self._matrix
            if m is None or m[0] is not self._edges or m[1] is not index.graph.node_ids or m[2] != params:
                transition, dangling = transition_matrix(served_adjacency(self._edges, index, params))
                t32 = transition.astype(np.float32)  # as EmbeddedPPR: float32 product, renormalized in float64
                m = self._matrix = (self._edges, index.graph.node_ids, params, t32, dangling, parallel_matvec(t32))
        return m[3], m[4], m[5]

    def run(self, index, personalization, damping, tol, max_iter) -> np.ndarray:
        from lazyhippo.graph.ppr import personalized_pagerank

        transition, dangling, matvec = self._transition(index)
        return personalized_pagerank(transition, personalization, damping, tol, max_iter,
                                     dangling=dangling, matvec=matvec).scores
