"""Graph algorithms for the embedded store: exact KNN (faiss), Leiden/Louvain (leidenalg/igraph), PageRank."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable

import numpy as np


@dataclass(frozen=True)
class KnnEdge:
    source: str
    target: str
    score: float
    rank: int


def knn_edges(ids: list[str], vectors: np.ndarray, top_k: int, cutoff: float) -> list[KnnEdge]:
    """Top-k cosine neighbours per item above `cutoff` (vectors are L2-normalized), exact inner product."""
    import faiss

    if len(ids) < 2 or top_k <= 0:
        return []
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    k = min(top_k + 1, len(ids))
    scores, nbrs = index.search(x, k)
    edges: list[KnnEdge] = []
    for i in range(len(ids)):
        rank = 0
        for score, j in zip(scores[i], nbrs[i]):
            if j < 0 or j == i or score < cutoff or rank >= top_k:
                continue
            rank += 1
            edges.append(KnnEdge(ids[i], ids[j], float(min(score, 1.0)), rank))
    return edges


@dataclass(frozen=True)
class Communities:
    membership: dict[str, int]   # entity id -> community index (0 = largest)
    modularity: float
    levels: int


def merged_undirected(node_ids: list[str], edges: Iterable[tuple[str, str, float]]) -> dict[tuple[int, int], float]:
    """The graph both stores run their algorithms on: undirected, self-loops and unknown ends dropped,
    parallel edges' weights summed; keys are (smaller, larger) node indices."""
    index = {n: i for i, n in enumerate(node_ids)}
    merged: dict[tuple[int, int], float] = {}
    for a, b, w in edges:
        i, j = index.get(a), index.get(b)
        if i is None or j is None or i == j:
            continue
        key = (min(i, j), max(i, j))
        merged[key] = merged.get(key, 0.0) + float(w)
    return merged


def renumbered_by_size(membership: list[int]) -> list[int]:
    """Community labels renumbered largest first (ties: first seen), so ids read naturally and are
    stable for equal input whichever store computed them."""
    sizes: dict[int, int] = {}
    first: dict[int, int] = {}
    for i, m in enumerate(membership):
        sizes[m] = sizes.get(m, 0) + 1
        first.setdefault(m, i)
    order = {c: i for i, c in enumerate(sorted(sizes, key=lambda c: (-sizes[c], first[c])))}
    return [order[m] for m in membership]


def _igraph(node_ids: list[str], edges: list[tuple[str, str, float]]):
    import igraph as ig

    merged = merged_undirected(node_ids, edges)
    g = ig.Graph(n=len(node_ids), edges=list(merged), directed=False)
    g.es["weight"] = list(merged.values())
    return g


def detect_communities(node_ids: list[str], edges: list[tuple[str, str, float]],
                       algorithm: str = "leiden", seed: int = 42) -> Communities:
    """Every node gets a community (isolated nodes are singletons); seeded so re-runs agree."""
    import igraph as ig

    g = _igraph(node_ids, edges)
    ig.set_random_number_generator(random.Random(seed))
    if algorithm == "leiden":
        import leidenalg

        part = leidenalg.find_partition(g, leidenalg.ModularityVertexPartition, weights="weight", seed=seed)
        membership, levels = list(part.membership), 1
    elif algorithm == "louvain":
        hierarchy = g.community_multilevel(weights="weight", return_levels=True)
        membership, levels = list(hierarchy[-1].membership), len(hierarchy)
    else:
        raise ValueError(f"unknown community algorithm {algorithm!r} (expected 'leiden' or 'louvain')")
    modularity = g.modularity(membership, weights="weight") if g.ecount() else 0.0
    return Communities(dict(zip(node_ids, renumbered_by_size(membership))), float(modularity), levels)


def pagerank(node_ids: list[str], edges: list[tuple[str, str, float]], damping: float = 0.85) -> dict[str, float]:
    g = _igraph(node_ids, edges)
    return dict(zip(node_ids, g.pagerank(weights="weight", damping=damping)))
