"""The entity+passage graph that Personalized PageRank walks: its edge weights and its adjacency.

Below both the graph stores and the query engine, so the query loader (rows from DuckDB) and the Neo4j
PPR (rows from the served graph) build the very same matrix from the same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class GraphParams:
    """Edge weights of the entity+passage graph built at load time (part of the index cache key)."""

    relation_weight: float = 1.0      # entity-entity co-occurrence edges (times the relation weight)
    relation_cap: float = 4.0         # cap on one relation's summed weight before scaling
    relation_min_weight: float = 0.0  # relations lighter than this are left out of the graph
    relation_skip_types: tuple = ()   # entity types whose relations are left out (their mentions stay)
    synonym_weight: float = 0.5       # KNN (synonymy) edges, times the cosine score
    synonym_min_score: float = 0.90   # KNN edges below this are not used as synonyms
    mention_weight: float = 1.0       # passage-entity edges, times log(1 + count)
    title_mention_weight: float = 2.0 # extra weight on the edge between a passage and its own title entity


@dataclass(frozen=True)
class EntityEdges:
    """Entity-entity edges as columns over the index's entity positions (-1: not an entity of the index);
    a weight of NaN is an edge without one."""

    source: np.ndarray
    target: np.ndarray
    weight: np.ndarray

    @classmethod
    def of(cls, entity_ids, sources, targets, weights) -> "EntityEdges":
        import pyarrow as pa

        from lazyhippo.graph.algorithms import positions

        if not isinstance(weights, (pa.Array, pa.ChunkedArray)):
            weights = pa.array(weights, type=pa.float64())
        w = weights.to_numpy(zero_copy_only=False).astype(np.float64)  # a null weight becomes NaN
        return cls(positions(entity_ids, sources), positions(entity_ids, targets), w)


def passage_adjacency(params: GraphParams, n_entities: int, n_chunks: int, entity_types: list[str],
                      relations: EntityEdges, synonyms: EntityEdges, mentions: sp.coo_matrix,
                      is_title: np.ndarray) -> sp.csr_matrix:
    """Symmetric weighted adjacency over nodes 0..n_entities-1 (entities) then the chunks.

    `relations` / `synonyms` are edges over entity positions; `mentions` is the (chunk, entity) count matrix
    and `is_title` flags its entries (same order as `mentions.data`) that join a passage to the entity its
    document title names. Duplicates are summed.
    """
    r, sy = relations, synonyms
    keep = (r.source >= 0) & (r.target >= 0) & (r.source != r.target)
    if params.relation_skip_types:
        skip = np.array([t in params.relation_skip_types for t in entity_types] or [False])
        keep &= ~skip[r.source.clip(0)] & ~skip[r.target.clip(0)]
    missing = np.isnan(r.weight)
    keep &= np.where(missing, 1.0, r.weight) >= params.relation_min_weight
    weight = np.where(missing | (r.weight == 0), 1.0, r.weight)  # no weight counts as one co-occurrence
    rel = (r.source[keep], r.target[keep], params.relation_weight * np.minimum(weight[keep], params.relation_cap))
    del keep, missing, weight
    keep = (sy.source >= 0) & (sy.target >= 0) & (sy.source != sy.target) & (sy.weight >= params.synonym_min_score)
    syn = (sy.source[keep], sy.target[keep], params.synonym_weight * sy.weight[keep])
    mw = params.mention_weight * np.log1p(mentions.data) + params.title_mention_weight * is_title
    n = n_entities + n_chunks
    rows, cols, vals = _both_ways(n, rel, syn, (mentions.row + n_entities, mentions.col, mw))
    del rel, syn, mw
    adjacency = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))  # duplicates are summed
    del rows, cols, vals
    adjacency.sum_duplicates()
    return adjacency


def _both_ways(n: int, *edges: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows, columns and values of each group of (i, j, w) edges as i -> j then j -> i, the groups one after
    another, written into one array each in the index type the matrix keeps: concatenating pieces, then
    widening them, held three more copies of 27M relation entries at 100,000 documents."""
    total = 2 * sum(len(w) for _, _, w in edges)
    index = np.int32 if n <= np.iinfo(np.int32).max else np.int64
    rows, cols, vals = np.empty(total, dtype=index), np.empty(total, dtype=index), np.empty(total, dtype=np.float64)
    at = 0
    for i, j, w in edges:
        for a, b in ((i, j), (j, i)):
            rows[at:at + len(w)], cols[at:at + len(w)], vals[at:at + len(w)] = a, b, w
            at += len(w)
    return rows, cols, vals
