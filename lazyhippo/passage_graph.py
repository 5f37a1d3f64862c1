"""The entity+passage graph that Personalized PageRank walks: its edge weights and its adjacency.

Below both the graph stores and the query engine, so the query loader (rows from DuckDB) and the Neo4j
PPR (rows from the served graph) build the very same matrix from the same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

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


Edge = tuple  # (entity index or None, entity index or None, weight or None)


def passage_adjacency(params: GraphParams, n_entities: int, n_chunks: int, entity_types: list[str],
                      relations: Iterable[Edge], synonyms: Iterable[Edge], mentions: sp.coo_matrix,
                      is_title: np.ndarray) -> sp.csr_matrix:
    """Symmetric weighted adjacency over nodes 0..n_entities-1 (entities) then the chunks.

    `relations` / `synonyms` are (i, j, weight) over entity indices (None: not an entity of the index);
    `mentions` is the (chunk, entity) count matrix and `is_title` flags its entries (same order as
    `mentions.data`) that join a passage to the entity its document title names. Duplicates are summed.
    """
    skip = ({i for i, t in enumerate(entity_types) if t in params.relation_skip_types}
            if params.relation_skip_types else set())
    rows, cols, vals = [], [], []
    for i, j, w in relations:
        if i is None or j is None or i == j or i in skip or j in skip:
            continue
        if (1.0 if w is None else w) < params.relation_min_weight:
            continue
        w = params.relation_weight * min(float(w or 1.0), params.relation_cap)
        rows += [i, j]; cols += [j, i]; vals += [w, w]
    for i, j, s in synonyms:
        if i is None or j is None or i == j or s < params.synonym_min_score:
            continue
        w = params.synonym_weight * float(s)
        rows += [i, j]; cols += [j, i]; vals += [w, w]
    mw = params.mention_weight * np.log1p(mentions.data)
    mw = mw + params.title_mention_weight * is_title
    rows = np.concatenate([np.asarray(rows, dtype=np.int64), mentions.row + n_entities, mentions.col])
    cols = np.concatenate([np.asarray(cols, dtype=np.int64), mentions.col, mentions.row + n_entities])
    vals = np.concatenate([np.asarray(vals, dtype=np.float64), mw, mw])
    n = n_entities + n_chunks
    adjacency = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))  # duplicates are summed
    adjacency.sum_duplicates()
    return adjacency
