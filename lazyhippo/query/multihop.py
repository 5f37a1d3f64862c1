"""The local route's `multi_hop` option (the Memory-MCP design's `retrieve_multi_hop`): breadth-first expansion
from the entities the question links to, `levels` passage levels deep (MultiHopParams), stopping early when a hop
brings almost nothing new, then PPR over that expanded subgraph only.

It is the local route with a different PPR backend: seeds, chunk scoring and diagnostics are shared;
mass cannot leak to parts of the graph the question has no path to within those levels.
"""

from __future__ import annotations

import numpy as np

from lazyhippo.graph.ppr import parallel_matvec, personalized_pagerank
from lazyhippo.query.config import MultiHopParams
from lazyhippo.query.types import hub_entities


class SubgraphPPR:
    """PPRBackend over the subgraph reached from the seed entities (hub entities are reached, not expanded).
    One instance per query: it records the subgraph it used."""

    name = "multi-hop-subgraph"

    def __init__(self, params: MultiHopParams, hub_df_share: float):
        self.params = params
        self.hub_df_share = hub_df_share
        self.max_hops, self.max_nodes = params.hops, params.max_nodes
        self.nodes = np.zeros(0, dtype=np.int64)   # the subgraph of the last run
        self.hops = 0                              # hops the last expansion made

    def expand(self, index, start: np.ndarray) -> np.ndarray:
        """Node indices within `max_hops` of `start`, breadth-first, sorted; no further hop once the subgraph holds
        `max_nodes` or the last hop added fewer than `min_new_nodes`."""
        by_column = index.graph.columns32  # the adjacency's structure: column j lists the neighbours of j
        n_e = index.n_entities
        expandable = np.ones(by_column.shape[0], dtype=bool)
        expandable[:n_e] = ~hub_entities(index, self.hub_df_share, self.params.hub_top_share)
        seen = np.zeros(by_column.shape[0], dtype=bool)
        seen[start] = True
        frontier = start
        size = int(seen.sum())
        self.hops = 0
        for _ in range(self.max_hops):
            frontier = frontier[expandable[frontier]]
            if not len(frontier) or size >= self.max_nodes:
                break
            reached = np.zeros_like(seen)
            reached[by_column[:, frontier].indices] = True
            reached &= ~seen
            frontier = np.flatnonzero(reached)
            if not len(frontier):
                break
            seen |= reached
            size += len(frontier)
            self.hops += 1
            if len(frontier) < self.params.min_new_nodes:
                break
        return np.flatnonzero(seen)

    def run(self, index, personalization, damping, tol, max_iter):
        p = np.asarray(personalization, dtype=np.float64)
        start = np.flatnonzero(p[:index.n_entities] > 0)
        if not len(start):  # nothing linked to an entity: expand from the passage seeds instead
            start = np.flatnonzero(p > 0)
        nodes = self.nodes = self.expand(index, start)
        inside = np.zeros(len(p), dtype=bool)
        inside[nodes] = True
        if not len(nodes):
            return np.zeros(len(p))
        transition, dangling, matvec = subgraph_walk(index.graph, inside)
        return personalized_pagerank(transition, p * inside, damping, tol, max_iter, dangling=dangling,
                                     matvec=matvec).scores

    def holds(self, index, chunks: np.ndarray) -> np.ndarray:
        """Which of `chunks` lie inside the last subgraph: dense passage seeds and BM25 reach others too."""
        inside = np.zeros(len(index.graph.node_ids), dtype=bool)
        inside[self.nodes] = True
        return inside[np.asarray(chunks, dtype=np.int64) + index.n_entities]

    def diagnostics(self) -> dict:
        return {"levels": self.params.levels, "hops": self.hops, "subgraph_nodes": len(self.nodes)}


def subgraph_walk(graph, inside: np.ndarray):
    """The random walk confined to the nodes marked `inside`, without building the subgraph: for the symmetric
    adjacency A, a step of the subgraph's walk is `mask * A (x / deg_S)`, with deg_S the degree counted inside
    the subgraph, and `A y` is the index's precomputed transition T = A D^-1 applied to `y * degree`, or, where
    the index holds T by columns only, `degree * (T^T y)` (T^T = D^-1 A: the columns' arrays read as rows).
    Returns what `personalized_pagerank` takes: a matrix (for its shape), the subgraph's dangling nodes and the step."""
    mask = inside.astype(np.float32)
    full = graph.degree.astype(np.float32)
    one = np.ones_like(full)
    if graph.transition32 is not None:
        mv, before, after = graph.matvec32 or graph.transition32.dot, full, one
    else:
        rows = graph.columns32.T  # a CSR view of the same arrays
        mv, before, after = parallel_matvec(rows) or rows.dot, one, full
    deg = after * mv(mask * before) * mask
    dangling = inside & (deg <= 0)
    inv = np.zeros_like(deg)
    inv[deg > 0] = 1.0 / deg[deg > 0]
    scale = inv * before
    kept = mask * after

    def step(x: np.ndarray) -> np.ndarray:
        return kept * mv(x * scale)

    return graph.columns32, dangling, step
