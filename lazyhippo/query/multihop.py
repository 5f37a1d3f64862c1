"""Route multi_hop (the Memory-MCP design's `retrieve_multi_hop`): breadth-first expansion from the
entities the question links to, up to `max_hops` graph hops, then PPR over that expanded subgraph only.

It is the local route with a different PPR backend: seeds, chunk scoring and diagnostics are shared;
mass cannot leak to parts of the graph the question has no path to within `max_hops`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .config import MultiHopParams
from .ppr import personalized_pagerank


class SubgraphPPR:
    """PPRBackend over the subgraph reached from the seed entities (hub entities are reached, not expanded).
    One instance per query: it records the size of the subgraph it used."""

    name = "multi-hop-subgraph"

    def __init__(self, params: MultiHopParams, hub_df_share: float):
        self.params = params
        self.hub_df_share = hub_df_share
        self.subgraph_nodes = 0

    def expand(self, index, start: np.ndarray) -> np.ndarray:
        """Node indices within `max_hops` of `start`, breadth-first, sorted."""
        adj = index.graph.adjacency
        n_e = index.n_entities
        expandable = np.ones(adj.shape[0], dtype=bool)
        expandable[:n_e] = index.entities.df <= max(2.0, self.hub_df_share * index.n_chunks)
        seen = np.zeros(adj.shape[0], dtype=bool)
        seen[start] = True
        frontier = start
        size = int(seen.sum())
        for _ in range(self.params.max_hops):
            frontier = frontier[expandable[frontier]]
            if not len(frontier) or size >= self.params.max_nodes:
                break
            reached = np.zeros_like(seen)
            reached[adj[frontier].indices] = True
            reached &= ~seen
            frontier = np.flatnonzero(reached)
            seen |= reached
            size += len(frontier)
        return np.flatnonzero(seen)

    def run(self, index, personalization, damping, tol, max_iter):
        p = np.asarray(personalization, dtype=np.float64)
        start = np.flatnonzero(p[:index.n_entities] > 0)
        if not len(start):  # nothing linked to an entity: expand from the passage seeds instead
            start = np.flatnonzero(p > 0)
        nodes = self.expand(index, start)
        self.subgraph_nodes = int(len(nodes))
        out = np.zeros(len(p))
        if len(nodes):
            trans, dangling = _transition(index.graph.adjacency[nodes][:, nodes].tocsr())
            out[nodes] = personalized_pagerank(trans, p[nodes], damping, tol, max_iter, dangling=dangling).scores
        return out


def _transition(sub: sp.csr_matrix) -> tuple[sp.csc_matrix, np.ndarray]:
    """`ppr.transition_matrix` for a per-query subgraph, without its sparse products: rows scaled in place to
    sum to 1, the transpose taken as CSC (no copy), which multiplies a vector as well as CSR does."""
    out_w = np.asarray(sub.sum(axis=1)).ravel()
    dangling = out_w <= 0
    inv = np.zeros_like(out_w)
    inv[~dangling] = 1.0 / out_w[~dangling]
    sub.data *= np.repeat(inv, np.diff(sub.indptr))
    return sub.T, dangling
