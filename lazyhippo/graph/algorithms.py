"""Graph algorithms for the embedded store: KNN (exact, or faiss HNSW by size), Leiden/Louvain (igraph's C
implementations), PageRank."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from lazyhippo.settings import check_resolutions

if TYPE_CHECKING:
    import pyarrow as pa


KNN_SLACK = 4  # candidates beyond the top k, so a near-tie at the k-th place is decided by the exact scores
# Above this many items the full search goes through an approximate index (HNSW over 8-bit codes): the exact
# one compares every pair, 22 s for 92,143 entities on a quiet host and about 37 minutes for 900,000. An update
# searches its stale lists exactly while (lists x items) stays within the pairs of the largest exact search.
KNN_EXACT_MAX = 100_000
HNSW_M = 32              # links per node: on real entity vectors 16 found 93% of the exact edges, 32 found 97%
HNSW_EF_CONSTRUCTION = 40
HNSW_EF_SEARCH = 64
HNSW_CANDIDATES = 16     # proposals per item rescored exactly: the 8-bit codes misorder close neighbours
ROW_BLOCK = 65_536       # stored rows made float32 (64 MB at 256 dimensions), or codes transposed, at a time
KNN_MARGIN = 1e-3        # exact candidates reach down to the cutoff less this, far beyond their rounding
KNN_BLOCK_PAIRS = 1 << 22  # (source, item) products of one block of the exact search: 16 MB per array of them


@dataclass(frozen=True)
class KnnEdge:
    source: str
    target: str
    score: float
    rank: int


@dataclass(frozen=True)
class StoredVectors:
    """Vectors in the warehouse's stored form, int8 rows and a scale per row: a quarter of float32's memory.
    Unit float32 rows are made a block at a time, with the same bits as normalizing the whole matrix."""
    codes: np.ndarray   # (n, d) int8
    scales: np.ndarray  # (n,) float32

    def __len__(self) -> int:
        return len(self.codes)

    def unit(self, rows) -> np.ndarray:
        from lazyhippo.models.embedders import normalize

        return normalize(self.codes[rows].astype(np.float32) * self.scales[rows, None])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """All rows as unit float32 (for a store that needs them whole, as GDS does)."""
        return self.unit(slice(None)).astype(dtype or np.float32, copy=False)


Vectors = np.ndarray | StoredVectors


def unit_rows(vectors: Vectors, rows) -> np.ndarray:
    """float32 rows of `vectors` (already unit length when given as an array) at `rows` (a slice or 1-d indices)."""
    return vectors.unit(rows) if isinstance(vectors, StoredVectors) else np.asarray(vectors[rows], dtype=np.float32)


def item_blocks(vectors: Vectors) -> Iterator[tuple[int, np.ndarray]]:
    for start in range(0, len(vectors), ROW_BLOCK):
        yield start, unit_rows(vectors, slice(start, start + ROW_BLOCK))


def approximate_index(vectors: Vectors):
    """HNSW over 8-bit scalar-quantized codes, filled a block of rows at a time. Built on one thread: faiss
    inserts in parallel in an order that changes from run to run, and the graph with it; the levels come from
    faiss's fixed seed, so the same rows give the same index. Searching is per query and may use every thread."""
    import faiss

    dim = vectors.shape[1] if isinstance(vectors, np.ndarray) else vectors.codes.shape[1]
    index = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_8bit, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    step = max(1, len(vectors) // ROW_BLOCK)
    index.train(unit_rows(vectors, np.arange(0, len(vectors), step)[:ROW_BLOCK]))  # each dimension's range
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        for _, block in item_blocks(vectors):
            index.add(block)
    finally:
        faiss.omp_set_num_threads(threads)
    index.hnsw.efSearch = HNSW_EF_SEARCH
    return index


@cache
def pairs_above(integer: bool, threads: int):
    """An onnxruntime graph giving, for a block of queries against a block of items, the (query, item) pairs whose
    candidate cosine reaches a floor per query, with that cosine: the product, its scaling and the comparison run
    on every core without a (queries x items) array coming back to Python. Stored vectors multiply as int8 codes
    (u8 x s8 with a zero point of 128: the int32 products are exact and several times faster than float32's);
    float vectors as float32. It uses as many threads as faiss is allowed (the process's OpenMP setting)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    a_type, b_type = (TensorProto.UINT8, TensorProto.INT8) if integer else (TensorProto.FLOAT, TensorProto.FLOAT)
    product = ([helper.make_node("MatMulInteger", ["a", "b", "zero"], ["int"]),
                helper.make_node("Cast", ["int"], ["dot"], to=TensorProto.FLOAT)] if integer
               else [helper.make_node("MatMul", ["a", "b"], ["dot"])])
    nodes = [*product,
             helper.make_node("Mul", ["dot", "column"], ["score"]),  # cosine times the query's norm
             helper.make_node("GreaterOrEqual", ["score", "floor"], ["keep"]),
             helper.make_node("NonZero", ["keep"], ["at"]),
             helper.make_node("Transpose", ["at"], ["pairs"], perm=[1, 0]),
             helper.make_node("GatherND", ["score", "pairs"], ["scores"])]
    graph = helper.make_graph(
        nodes, "pairs_above",
        [helper.make_tensor_value_info("a", a_type, ["q", "d"]), helper.make_tensor_value_info("b", b_type, ["d", "n"]),
         helper.make_tensor_value_info("column", TensorProto.FLOAT, [1, "n"]),
         helper.make_tensor_value_info("floor", TensorProto.FLOAT, ["q", 1])],
        [helper.make_tensor_value_info("pairs", TensorProto.INT64, ["p", 2]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["p"])],
        [helper.make_tensor("zero", TensorProto.UINT8, [], [128])] if integer else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level, options.intra_op_num_threads = 3, threads
    # without onnxruntime's arena: kept by this cached session, it held a block's products (~70 MB) through every
    # step after the KNN search, the context check's index build included; freed tensors go back to malloc instead
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def code_norms(codes: np.ndarray) -> np.ndarray:
    """float64 norms of int8 rows: exact sums of integer squares, the same bits for any block of them."""
    return np.sqrt(np.maximum(np.einsum("ij,ij->i", codes, codes, dtype=np.float64), 1e-60))


def exact_candidates(vectors: Vectors, rows: np.ndarray, k: int,
                     cutoff: float) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Blocks of `rows` with their k best items (-1 past the last) among those whose cosine can reach `cutoff`:
    every item scoring within KNN_MARGIN of it (the candidates' rounding is below 1e-5), ordered by candidate
    cosine, ties to the lower index. Stored vectors compare by their exact int8 products scaled by the rows'
    norms, so the matrix is never made float32 whole. Items go by blocks of ROW_BLOCK (their codes transposed a
    block at a time, never a second copy of all of them: an update of a few rows against a million items), rows
    by blocks whose products stay within KNN_BLOCK_PAIRS; each row keeps its k best so far, an exact merge."""
    import faiss

    stored = isinstance(vectors, StoredVectors)
    session = pairs_above(stored, faiss.omp_get_max_threads())
    own = code_norms(vectors.codes[rows]) if stored else np.ones(len(rows))
    best = np.full((len(rows), k), -1, dtype=np.int64)
    best_scores = np.full((len(rows), k), -np.inf)
    for first in range(0, len(vectors), ROW_BLOCK):
        span = slice(first, first + ROW_BLOCK)
        if stored:
            codes = vectors.codes[span]
            items, norms = np.ascontiguousarray(codes.T), code_norms(codes)
        else:
            items = np.ascontiguousarray(unit_rows(vectors, span).T)
            norms = np.ones(items.shape[1])
        column = (1 / norms).astype(np.float32)[None]
        step = max(1, min(1024, KNN_BLOCK_PAIRS // len(norms)))
        for start in range(0, len(rows), step):
            block, at = rows[start:start + step], slice(start, start + step)
            queries = vectors.codes[block].view(np.uint8) ^ 0x80 if stored else unit_rows(vectors, block)  # codes + 128
            floor = ((cutoff - KNN_MARGIN) * own[at]).astype(np.float32)[:, None]
            pairs, scores = session.run(None, {"a": queries, "b": items, "column": column, "floor": floor})
            src, item = pairs[:, 0], pairs[:, 1] + first
            mine = item != block[src]
            src, item, scores = src[mine], item[mine], scores[mine] / own[start + src[mine]]
            held = np.nonzero(best[at] >= 0)  # the rows' k best among earlier items compete with these
            src = np.concatenate([src, held[0]])
            item, scores = np.concatenate([item, best[at][held]]), np.concatenate([scores, best_scores[at][held]])
            order = np.lexsort((item, -scores, src))  # by query, best first, ties to the lower index
            src, item, scores = src[order], item[order], scores[order]
            place = np.arange(len(src)) - np.searchsorted(src, src)  # rank within its query
            top = place < k
            best[at], best_scores[at] = -1, -np.inf
            best[start + src[top], place[top]] = item[top]
            best_scores[start + src[top], place[top]] = scores[top]
    for start in range(0, len(rows), 1024):
        yield rows[start:start + 1024], best[start:start + 1024]


@dataclass(frozen=True)
class KnnBatch:
    """Edges of a block of source items, as columns of indices into the items."""
    sources: np.ndarray  # int64
    targets: np.ndarray  # int64
    scores: np.ndarray   # float64 cosines
    ranks: np.ndarray    # int64, 1 = nearest


def knn_batches(vectors: Vectors, top_k: int, cutoff: float,
                rows: Sequence[int] | None = None) -> Iterator[KnnBatch]:
    """Top-k cosine neighbours per item above `cutoff` (vectors are L2-normalized), a block of sources at a time;
    `rows`: the neighbours of these items only (indices), searched over every item all the same.
    Candidates come from the exact search (exact_candidates: only items that can reach the cutoff) while rows x
    items stays within KNN_EXACT_MAX squared (every row up to KNN_EXACT_MAX items, an update's stale rows
    above), else from the approximate index. Either way a few more than needed are
    proposed and scored again in float64 in a fixed order, ties going to the lower index: the edges are the same
    bits whatever BLAS threading a process has (faiss's own scores move in the 7th digit with it, enough to
    reorder hubs and summaries downstream), and every weight is the true cosine."""
    n = len(vectors)
    if n < 2 or top_k <= 0:
        return
    rows = np.arange(n) if rows is None else np.asarray(list(rows), dtype=np.int64)
    k, take = min(top_k + 1 + KNN_SLACK, n), partial(unit_rows, vectors)
    if len(rows) * n <= KNN_EXACT_MAX ** 2:
        blocks = exact_candidates(vectors, rows, k, cutoff)
    else:
        index, k = approximate_index(vectors), min(max(HNSW_CANDIDATES, k), n)
        blocks = ((rows[s:s + 1024], index.search(take(rows[s:s + 1024]), k)[1]) for s in range(0, len(rows), 1024))
    for block, nbrs in blocks:
        q = take(block)
        valid = (nbrs >= 0) & (nbrs != block[:, None])
        safe = np.where(valid, nbrs, 0)
        near = take(safe.ravel()).reshape(*safe.shape, -1)
        scores = (q.astype(np.float64)[:, None, :] * near.astype(np.float64)).sum(axis=2)
        scores = np.where(valid, np.minimum(scores, 1.0), -np.inf)
        order = np.lexsort((safe, -scores), axis=1)  # best score first, ties to the lower index
        ranked = np.take_along_axis(scores, order, axis=1)[:, :top_k]
        keep = ranked >= cutoff  # scores fall along a row: the kept ones are its first
        src, col = np.nonzero(keep)
        yield KnnBatch(block[src], np.take_along_axis(safe, order, axis=1)[src, col], ranked[src, col], col + 1)


def knn_edges(ids: list[str], vectors: Vectors, top_k: int, cutoff: float,
              rows: Sequence[int] | None = None) -> list[KnnEdge]:
    """knn_batches as edges between `ids`."""
    return [KnnEdge(ids[s], ids[t], score, rank) for b in knn_batches(vectors, top_k, cutoff, rows)
            for s, t, score, rank in zip(b.sources.tolist(), b.targets.tolist(), b.scores.tolist(), b.ranks.tolist())]


@dataclass(frozen=True)
class KnnBasis:
    """What an update needs of the previous search: per item (all of them, edges or not) its number of
    neighbours and the lowest score among them, and the items that had a changed or gone neighbour."""
    lists: dict[str, tuple[int, float]]
    lost_neighbour: set[str]


def knn_stale_sources(ids: list[str], vectors: Vectors, top_k: int, cutoff: float, changed: set[str],
                      previous: KnnBasis) -> list[int]:
    """Indices of the items whose neighbour lists a search would now give differently, given the previous
    search and the items whose vector is new, changed or gone (`changed`): the changed and new items
    themselves, items that had a changed or gone neighbour, and items that a new vector would enter (it
    scores at least their k-th neighbour, or the cutoff while they have fewer than k). Every other list stays
    exactly what a full exact search would give (an approximate one's lists are kept as they were found).
    The new vectors are compared with every item exactly, a block of items at a time."""
    fresh = [i for i, n in enumerate(ids) if n in changed or n not in previous.lists]
    stale = set(fresh) | {i for i, n in enumerate(ids) if n in previous.lost_neighbour}
    if fresh and len(ids) > 1:
        best = np.full(len(ids), -np.inf, dtype=np.float32)
        for start in range(0, len(fresh), 1024):
            rows = np.asarray(fresh[start:start + 1024])
            q = unit_rows(vectors, rows)
            for first, block in item_blocks(vectors):
                scores = q @ block.T
                inside = (rows >= first) & (rows < first + len(block))
                scores[np.flatnonzero(inside), rows[inside] - first] = -np.inf  # not its own neighbour
                best[first:first + len(block)] = np.maximum(best[first:first + len(block)], scores.max(axis=0))
        floors = np.array([cutoff if n < top_k else low
                           for n, low in (previous.lists.get(i, (0, 1.0)) for i in ids)], dtype=np.float32)
        stale |= set(np.flatnonzero(best >= floors - 1e-6).tolist())  # ties and rounding: search again, not guess
    return sorted(stale)


@dataclass(frozen=True)
class CommunityLevel:
    membership: dict[str, int]   # entity id -> community index at this level (0 = largest)
    modularity: float


@dataclass(frozen=True)
class Communities:
    membership: dict[str, int]   # entity id -> community index at the finest level (0 = largest)
    modularity: float            # of the finest level
    levels: int                  # passes the algorithm ran
    hierarchy: tuple[CommunityLevel, ...] = ()  # coarse to fine, each level refining the one above; last = finest


def nested(levels: Sequence[Sequence[int]]) -> list[list[int]]:
    """Coarse-to-fine memberships made a tree: each community of a level goes whole into the community of
    the next coarser level that holds most of its nodes (ties: the smaller label), so every level refines
    the one above. Runs at separate resolutions need this; Louvain's own passes are nested already."""
    out = [list(levels[-1])]
    for coarse in reversed(levels[:-1]):
        votes = Counter(zip(out[0], coarse))
        parent: dict[int, int] = {}
        for (f, c), _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0])):
            parent.setdefault(f, c)
        out.insert(0, [parent[f] for f in out[0]])
    return out


def modularity(merged: "MergedGraph", n: int, labels: Sequence[int]) -> float:
    """Weighted modularity of a partition of the undirected graph `merged` over n nodes (igraph's definition),
    so both stores report every level the same way."""
    total = float(merged.weights.sum())
    if not len(merged) or total <= 0:
        return 0.0
    lab = np.asarray(labels, dtype=np.int64)
    a, b = lab[merged.pairs[:, 0]], lab[merged.pairs[:, 1]]
    inner = float(merged.weights[a == b].sum())
    degree = np.bincount(merged.pairs.ravel(), weights=np.repeat(merged.weights, 2), minlength=n)
    by_community = np.bincount(lab, weights=degree)
    return inner / total - float((by_community ** 2).sum()) / (4.0 * total * total)


def hierarchy(node_ids: list[str], levels: Sequence[Sequence[int]], score) -> tuple[CommunityLevel, ...]:
    """Raw coarse-to-fine memberships -> nested levels, renumbered largest first, each with `score(labels)`
    (its modularity)."""
    out = []
    for level in nested(levels):
        labels = renumbered_by_size(level)
        out.append(CommunityLevel(dict(zip(node_ids, labels)), float(score(labels))))
    return tuple(out)


def _strings(x):
    """Arrow string array of `x`: Arrow columns as they come, anything else converted."""
    import pyarrow as pa

    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    return x.cast(pa.string()) if isinstance(x, pa.Array) else pa.array(x, type=pa.string())


def positions(keys: Sequence[str], names: Sequence[str]) -> np.ndarray:
    """Index of each name in `keys`, -1 where absent: one hash lookup in Arrow, no per-item Python lookups."""
    import pyarrow.compute as pc

    if not len(keys) or not len(names):
        return np.full(len(names), -1, dtype=np.int64)
    found = pc.index_in(_strings(names), value_set=_strings(keys))
    return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass(frozen=True)
class Edges:
    """Weighted edges as columns: a graph of 400k edges moves as three arrays, not 400k tuples. The ends are
    numpy or Arrow string arrays (as read from DuckDB)."""
    sources: np.ndarray | pa.ChunkedArray
    targets: np.ndarray | pa.ChunkedArray
    weights: np.ndarray

    @classmethod
    def of(cls, edges: "Edges | Iterable[tuple[str, str, float]]") -> "Edges":
        if isinstance(edges, Edges):
            return edges
        sources, targets, weights = zip(*edges) if edges else ((), (), ())
        return cls(np.asarray(sources, dtype=object), np.asarray(targets, dtype=object),
                   np.asarray(weights, dtype=np.float64))

    def __len__(self) -> int:
        return len(self.weights)


@dataclass(frozen=True)
class MergedGraph:
    """Undirected edges as (smaller, larger) node index pairs in key order, with their summed weights."""
    pairs: np.ndarray    # (m, 2) integers (int32 as read from the warehouse, else int64)
    weights: np.ndarray  # (m,) float64

    def __len__(self) -> int:
        return len(self.weights)


def merged_undirected(node_ids: list[str], edges: "MergedGraph | Edges | Iterable[tuple[str, str, float]]") -> MergedGraph:
    """The graph both stores run their algorithms on: undirected, self-loops and unknown ends dropped,
    parallel edges' weights summed (a MergedGraph is that already)."""
    if isinstance(edges, MergedGraph):
        return edges
    e = Edges.of(edges)
    return merge_positions(len(node_ids), positions(node_ids, e.sources), positions(node_ids, e.targets), e.weights)


def merge_positions(n_nodes: int, a: np.ndarray, b: np.ndarray, weights: np.ndarray) -> MergedGraph:
    """Edges given by node positions (-1: unknown) merged undirected: self-loops and unknown ends dropped,
    parallel edges' weights summed in the order given."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    keep = (a >= 0) & (b >= 0) & (a != b)
    lo, hi, w = np.minimum(a, b)[keep], np.maximum(a, b)[keep], np.asarray(weights, dtype=np.float64)[keep]
    n = max(n_nodes, 1)
    keys, slot = np.unique(lo * n + hi, return_inverse=True)
    sums = np.bincount(slot, weights=w, minlength=len(keys))
    return MergedGraph(np.stack([keys // n, keys % n], axis=1), sums)


def merge_sorted(batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], capacity: int) -> MergedGraph:
    """Undirected edges already given as (smaller, larger) positions, ordered by pair, in batches of columns
    (at most `capacity` rows in all; no self-loops): parallel edges' weights summed in the order given, as
    merge_positions sums them. The pairs keep their integer width (int32 for DuckDB's INTEGER: half of int64's
    memory) and fill arrays sized once, so the graph is never held twice; a pair's rows that a batch ends in
    the middle of wait for the next batch, so every sum takes its terms in one pass."""
    pairs, weights, m = None, np.empty(capacity, dtype=np.float64), 0
    tail = None
    for lo, hi, w in batches:
        if tail is not None:
            lo, hi, w = (np.concatenate([t, x]) for t, x in zip(tail, (lo, hi, w)))
        if not len(lo):
            continue
        if pairs is None:
            pairs = np.empty((capacity, 2), dtype=np.result_type(lo.dtype, hi.dtype))
        first = np.ones(len(lo), dtype=bool)
        first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
        last = int(np.flatnonzero(first)[-1])  # the batch's last pair may go on in the next batch
        slot = np.cumsum(first[:last]) - 1
        sums = np.bincount(slot, weights=w[:last]) if last else np.empty(0)
        starts = np.flatnonzero(first[:last])
        pairs[m:m + len(sums), 0], pairs[m:m + len(sums), 1] = lo[starts], hi[starts]
        weights[m:m + len(sums)] = sums
        m += len(sums)
        tail = (lo[last:], hi[last:], w[last:])
    if tail is not None and len(tail[0]):
        pairs[m] = tail[0][0], tail[1][0]
        weights[m] = np.bincount(np.zeros(len(tail[2]), dtype=np.int64), weights=tail[2])[0]
        m += 1
    if pairs is None:
        return MergedGraph(np.empty((0, 2), dtype=np.int64), np.empty(0))
    pairs.resize((m, 2), refcheck=False)  # in place: the rows merged away go back now, not when the graph does
    weights.resize(m, refcheck=False)
    return MergedGraph(pairs, weights)


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


def _igraph(n: int, merged: MergedGraph):
    """The merged graph as igraph without attributes: the algorithms take its weights as an array (an edge
    attribute is a Python list, a float object per edge: 500 MB at 15 million edges)."""
    import igraph as ig

    g = ig.Graph(n=n, directed=False)
    g.add_edges(merged.pairs)  # an index array goes in whole: ~4x faster than a list of 300k pairs
    return g


def weighted_igraph(node_ids: list[str], edges: "Edges | MergedGraph | Iterable[tuple[str, str, float]]"):
    """The merged graph as igraph with its weights as the edge attribute `weight` (for checks beside igraph)."""
    merged = merged_undirected(node_ids, edges)
    g = _igraph(len(node_ids), merged)
    g.es["weight"] = merged.weights.tolist()
    return g


def detect_communities(node_ids: list[str], edges: "MergedGraph | Edges | Iterable[tuple[str, str, float]]",
                       algorithm: str = "leiden", seed: int = 42, initial: Sequence[list[int] | None] | None = None,
                       resolutions: Sequence[float] = (1.0,)) -> Communities:
    """Every node gets a community (isolated nodes are singletons); seeded so re-runs agree. Levels coarse to
    fine: Leiden runs once per resolution (igraph's C Leiden on modularity, the configuration model at
    resolution r: 1.0 = modularity) and the runs are nested; Louvain keeps its last `len(resolutions)`
    aggregation passes (GDS Louvain has no resolution, so both stores do the same). `initial`: starting
    partitions, one per level coarse to fine (Leiden; None: that level from scratch), each refined in one
    iteration instead of built from scratch in two."""
    import igraph as ig

    resolutions = check_resolutions(resolutions)
    merged = merged_undirected(node_ids, edges)
    g = _igraph(len(node_ids), merged)
    ig.set_random_number_generator(random.Random(seed))
    if algorithm == "leiden":
        raw = []
        for i, r in enumerate(resolutions):
            start = initial[i] if initial is not None else None
            extra = {"initial_membership": start, "n_iterations": 1} if start is not None else {"n_iterations": 2}
            part = g.community_leiden(objective_function="modularity", weights=merged.weights, resolution=r, **extra)
            raw.append(list(part.membership))
        ran = 1
    elif algorithm == "louvain":
        passes = g.community_multilevel(weights=merged.weights, return_levels=True) if g.ecount() else []
        raw = [list(p.membership) for p in reversed(passes[-len(resolutions):])] or [list(range(len(node_ids)))]
        ran = max(len(passes), 1)
    else:
        raise ValueError(f"unknown community algorithm {algorithm!r} (expected 'leiden' or 'louvain')")
    levels = hierarchy(node_ids, raw,
                       lambda labels: g.modularity(labels, weights=merged.weights) if g.ecount() else 0.0)
    return Communities(levels[-1].membership, levels[-1].modularity, ran, levels)


def pagerank(node_ids: list[str], edges: "MergedGraph | Edges | Iterable[tuple[str, str, float]]",
             damping: float = 0.85) -> dict[str, float]:
    """Power iteration on the merged graph (scipy, one thread), dangling mass spread evenly: the same bits on
    every run. igraph's PRPACK sums in parallel and its last digits change from run to run, which reorders
    near-tied hubs, and with them community titles and summaries, between two indexes of the same corpus."""
    from lazyhippo.graph.ppr import personalized_pagerank

    merged = merged_undirected(node_ids, edges)
    n = len(node_ids)
    if not n:
        return {}
    adjacency = symmetric_csr(n, merged)
    out_w = np.asarray(adjacency.sum(axis=1)).ravel()
    dangling = out_w <= 0
    inv = np.zeros_like(out_w)
    inv[~dangling] = 1.0 / out_w[~dangling]
    # column-stochastic transition (ppr.transition_matrix): M[i, j] = A[j, i] / w_j, and A is symmetric, so M is
    # A's own layout with each entry scaled by its column's 1 / w_j: the same bits, its index arrays shared; a
    # block at a time, so the factors are never a second array as long as the data
    for start in range(0, adjacency.nnz, CSR_BLOCK):
        adjacency.data[start:start + CSR_BLOCK] *= inv[adjacency.indices[start:start + CSR_BLOCK]]
    scores = personalized_pagerank(adjacency, np.ones(n), damping, tol=1e-13, max_iter=1000, dangling=dangling).scores
    return dict(zip(node_ids, scores.tolist()))


CSR_BLOCK = 1 << 20  # entries placed or scaled at a time while a graph's CSR is built: 8 MB per temporary


def symmetric_csr(n: int, merged: MergedGraph):
    """Both directions of the merged graph as one canonical CSR matrix (sorted indices, one entry per pair),
    written straight into its final arrays from the (smaller, larger) pairs in key order, a block of pairs at
    a time: row i holds the pairs (j, i) first (j < i, met in the order of j) and then (i, j) (j > i, in the
    order of j), so no transpose and no sum of two matrices (three times the result's memory) is made."""
    import scipy.sparse as sp

    index = np.int32 if n < 2**31 and 2 * len(merged) < 2**31 else np.int64
    lo, hi, w = merged.pairs[:, 0], merged.pairs[:, 1], merged.weights
    below, above = np.bincount(hi, minlength=n), np.bincount(lo, minlength=n)  # per row: entries left, right of i
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(below + above, out=indptr[1:])
    indices, data = np.empty(indptr[-1], dtype=index), np.empty(indptr[-1], dtype=np.float64)
    right = indptr[:-1] + below - (np.cumsum(above) - above)  # pair k of row i (k-th overall) goes to right[i] + k
    left = indptr[:-1].copy()  # the next free place among each row's entries left of its diagonal
    for start in range(0, len(merged), CSR_BLOCK):
        span = slice(start, start + CSR_BLOCK)
        a, b = lo[span], hi[span]
        at = right[a] + np.arange(start, start + len(a))
        indices[at], data[at] = b, w[span]
        order = np.argsort(b, kind="stable")  # the block's pairs by row b, each row's in the order of a
        rows = b[order]
        first = np.searchsorted(rows, rows)  # where each row's run starts within the block
        at = left[rows] + np.arange(len(rows)) - first
        indices[at], data[at] = a[order], w[span][order]
        left += np.bincount(b, minlength=n)
    return sp.csr_matrix((data, indices, indptr.astype(index)), shape=(n, n))
