"""Neo4j + Graph Data Science graph store: the served graph lives in Neo4j, the graph-wide algorithms run in GDS.

Model (every node carries `namespace`; (namespace, id) is unique per label):

    (:Document {id, title, source, kind, content_hash, n_chars})
    (:Chunk {id, doc_id, title, position, section, page, text, n_tokens, content_hash})-[:PART_OF]->(:Document)
    (:Chunk)-[:MENTIONS {count, is_title}]->(:Entity {id, name, norm_name, type, description, mention_count,
                                                       degree, embedding, community_id, pagerank})
                                            the entity's type is a label too (:Entity:PERSON)
    (:Entity)-[:<relation type> {id, weight, description, n_chunks}]->(:Entity) the way the type reads; RELATED_TO
                                            when untyped; `id` (the relation id) marks relations (client.RELATIONS)
    (:Entity)-[:SEMANTICALLY_SIMILAR {score, rank}]->(:Entity)                  KNN, directed (source's top-k)
    (:Entity)-[:BELONGS_TO]->(:Community {id, level, size, modularity, title, summary, hub_entities})
    (:LazyhippoState {namespace, graph_version})                                bumped when the graph changes

Four parts: `client` (driver plumbing), `sync` (the only writer), `algorithms` (GDS, compute only) and `ppr`
(query-time PPR over the served graph). `Neo4jGraphStore` puts them behind the `GraphStore` protocol.
"""

from __future__ import annotations

import numpy as np

from lazyhippo.graph.algorithms import Communities, KnnEdge
from lazyhippo.stores.neo4j.algorithms import AlgorithmOptions, Neo4jAlgorithms
from lazyhippo.stores.neo4j.client import LABELS, REL_TYPES, Neo4jClient, Neo4jConnection, Neo4jStoreError, slug
from lazyhippo.stores.neo4j.ppr import Neo4jPPR
from lazyhippo.stores.neo4j.sync import Neo4jSync

__all__ = ["Neo4jGraphStore", "Neo4jConnection", "Neo4jStoreError", "AlgorithmOptions", "Neo4jPPR", "LABELS",
           "REL_TYPES", "slug"]


class Neo4jGraphStore:
    """GraphStore on Neo4j 5 + GDS 2.x. Thread-safe for the read paths (the driver pools its connections)."""

    name = "neo4j"

    def __init__(self, conn: Neo4jConnection, options: AlgorithmOptions = AlgorithmOptions()):
        self.client = Neo4jClient(conn)
        self.algorithms = Neo4jAlgorithms(self.client, options)
        self._sync = Neo4jSync(self.client)
        self._ppr: dict[str, Neo4jPPR] = {}
        self.exact_knn = options.knn_engine == "exact"

    @classmethod
    def from_env(cls, connect_timeout: float | None = None, **options) -> "Neo4jGraphStore":
        """Connection from NEO4J_* (password: environment or the services credentials file)."""
        return cls(Neo4jConnection.from_env(connect_timeout=connect_timeout), AlgorithmOptions(**options))

    def __repr__(self) -> str:  # never shows the password
        return f"Neo4jGraphStore({self.client.conn!r})"

    # GraphStore protocol
    def sync(self, con, namespace: str, asset: str) -> dict:
        out = self._sync(con, namespace, asset)
        if namespace in self._ppr:
            self._ppr[namespace].invalidate()
        return out

    def knn(self, namespace: str, ids: list[str], vectors: np.ndarray, top_k: int, cutoff: float,
            structural: str = "off") -> list[KnnEdge]:
        return self.algorithms.knn(namespace, ids, vectors, top_k, cutoff, structural)

    def communities(self, namespace: str, node_ids, edges, algorithm: str, initial=None,
                    resolutions=(1.0,)) -> Communities:
        return self.algorithms.communities(namespace, node_ids, edges, algorithm, resolutions)  # GDS starts over

    def pagerank(self, namespace: str, node_ids, edges) -> dict[str, float]:
        return self.algorithms.pagerank(namespace, node_ids, edges)

    def ppr_backend(self, namespace: str) -> Neo4jPPR:
        """The query engine's PPR backend over this namespace's served graph (one per namespace and store)."""
        if namespace not in self._ppr:
            self._ppr[namespace] = Neo4jPPR(self.client, namespace)
        return self._ppr[namespace]

    def close(self) -> None:
        self.client.close()

    # reads and admin
    def connect(self) -> None:
        self.client.connect()

    def verify(self) -> dict:
        return self.client.verify()

    def query(self, cypher: str, params: dict | None = None, write: bool = False) -> list[dict]:
        return self.client.query(cypher, params, write=write)

    def counts(self, namespace: str) -> dict[str, int]:
        return self.client.counts(namespace)

    def graph_version(self, namespace: str) -> str | None:
        return self.client.graph_version(namespace)

    def drop_namespace(self, namespace: str) -> None:
        self.client.drop_namespace(namespace)
