"""Graph store protocol. `embedded`: the DuckDB warehouse plus in-process algorithms; `neo4j`: Bolt + GDS.

The warehouse always holds the tables (it feeds exports and the SQL models); a graph store runs the
graph-wide algorithms and, for Neo4j, keeps the served graph in sync.
"""

from __future__ import annotations

from typing import Protocol

import duckdb
import numpy as np

from lazyhippo.graph import algorithms as graph
from lazyhippo.graph.algorithms import Communities, KnnEdge


class GraphStore(Protocol):
    name: str
    exact_knn: bool  # knn() is the in-process search (graph.knn_batches): an update may search only what it can change

    def sync(self, con: duckdb.DuckDBPyConnection, namespace: str, asset: str) -> dict:
        """Push the warehouse rows the asset `asset` produced to the store; returns figures for metadata."""
        ...

    def knn(self, namespace: str, ids: list[str], vectors: np.ndarray, top_k: int, cutoff: float,
            structural: str = "off") -> list[KnnEdge]:
        """`structural`: FastRP vectors "concat"-enated to the text vectors or "replace"-ing them (GDS only)."""
        ...

    def communities(self, namespace: str, node_ids: list[str], edges: list[tuple[str, str, float]],
                    algorithm: str, initial: list[list[int] | None] | None = None, resolutions: tuple[float, ...] = (1.0,)
                    ) -> Communities:
        """Levels coarse to fine (see algorithms.detect_communities). `initial`: the previous partition of each
        level (per node; None: that level starts over), which embedded Leiden refines; GDS starts over."""
        ...

    def pagerank(self, namespace: str, node_ids: list[str], edges: list[tuple[str, str, float]]) -> dict[str, float]: ...

    def ppr_backend(self, namespace: str):
        """The query engine's PPR backend over this store's graph; None: the in-process default."""
        ...

    def close(self) -> None: ...


class EmbeddedGraphStore:
    name = "embedded"
    exact_knn = True

    def sync(self, con, namespace, asset):
        return {}

    def knn(self, namespace, ids, vectors, top_k, cutoff, structural="off"):
        if structural != "off":
            raise ValueError(f"knn_structural {structural!r} needs graph_store 'neo4j' (FastRP runs in GDS)")
        return graph.knn_edges(ids, vectors, top_k, cutoff)

    def communities(self, namespace, node_ids, edges, algorithm, initial=None, resolutions=(1.0,)):
        return graph.detect_communities(node_ids, edges, algorithm, initial=initial, resolutions=resolutions)

    def pagerank(self, namespace, node_ids, edges):
        return graph.pagerank(node_ids, edges)

    def ppr_backend(self, namespace):
        return None

    def close(self):
        pass
