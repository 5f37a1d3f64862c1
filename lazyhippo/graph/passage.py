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
    del missing

    def relation_weight(w: np.ndarray) -> np.ndarray:
        w = np.where(np.isnan(w) | (w == 0), 1.0, w)  # no weight counts as one co-occurrence
        np.minimum(w, params.relation_cap, out=w)
        w *= params.relation_weight
        return w

    rel = (r.source, r.target, r.weight, relation_weight, keep)
    keep = (sy.source >= 0) & (sy.target >= 0) & (sy.source != sy.target) & (sy.weight >= params.synonym_min_score)
    syn = (sy.source, sy.target, sy.weight, lambda w: params.synonym_weight * w, keep)
    mw = params.mention_weight * np.log1p(mentions.data) + params.title_mention_weight * is_title
    adjacency = _both_ways(n_entities + n_chunks, rel, syn, (mentions.row + n_entities, mentions.col, mw, None, None))
    del rel, syn, mw, keep
    adjacency.sum_duplicates()  # in place
    return adjacency


def _both_ways(n: int, *edges: tuple) -> sp.csr_matrix:
    """Each group of (i, j, w, weigh, keep) edges, those `keep` keeps (None: all) with their weights `weigh(w)`
    (None: w), as i -> j then j -> i, the groups one after another, placed straight into a CSR matrix with
    duplicates unsummed: each row's entries in the order met, as scipy's COO -> CSR places them, so summing them
    gives its bits. Placed, masked and weighed a block at a time: the edges as COO rows, columns and values beside
    the CSR arrays held 28 bytes an entry at once (18M entries at 50,000 documents), this 12; the kept edges'
    copies and weights beside the edges, 16 bytes a relation more (6.6M relations at 50,000 documents)."""
    counts = np.zeros(n, dtype=np.int64)
    for a, _, _ in _blocks(edges, weighed=False):
        counts += np.bincount(a, minlength=n)
    nnz = int(counts.sum())
    index = np.int32 if max(nnz, n) <= np.iinfo(np.int32).max else np.int64
    indptr = np.zeros(n + 1, dtype=index)
    np.cumsum(counts, out=indptr[1:])
    del counts
    indices, data = np.empty(nnz, dtype=index), np.empty(nnz, dtype=np.float64)
    cursor = indptr[:-1].astype(np.int64)  # where each row's next entry goes
    for a, b, w in _blocks(edges):
        _place(n, a, b, w, cursor, indices, data)
    return sp.csr_matrix((data, indices, indptr), shape=(n, n))


def _blocks(edges, weighed: bool = True):
    """The (row, column, value) blocks of at most `_PLACE_BLOCK` edges that `_both_ways` places, in its order
    (values None unless `weighed`)."""
    for i, j, w, weigh, keep in edges:
        for a, b in ((i, j), (j, i)):
            for at in range(0, len(w), _PLACE_BLOCK):
                s = slice(at, at + _PLACE_BLOCK)
                k = slice(None) if keep is None else keep[s]
                v = None if not weighed else w[s][k] if weigh is None else weigh(w[s][k])
                yield a[s][k], b[s][k], v


def _place(n: int, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, cursor: np.ndarray,
           indices: np.ndarray, data: np.ndarray) -> None:
    """Puts a block of entries at their rows' cursors, in the block's order within a row (scipy's stable COO ->
    CSR of the block alone orders them so), and moves the cursors past them."""
    from scipy.sparse._sparsetools import coo_tocsr

    bp, bj, bx = np.empty(n + 1, dtype=indices.dtype), np.empty(len(rows), dtype=indices.dtype), np.empty(len(rows))
    coo_tocsr(n, n, len(rows), rows.astype(indices.dtype, copy=False), cols.astype(indices.dtype, copy=False),
              vals.astype(np.float64, copy=False), bp, bj, bx)
    per_row = np.diff(bp)
    at = np.repeat(cursor - bp[:-1], per_row)
    at += np.arange(len(rows))
    indices[at], data[at] = bj, bx
    cursor += per_row


_PLACE_BLOCK = 1 << 20  # entries placed at once: 20 bytes each of scratch
