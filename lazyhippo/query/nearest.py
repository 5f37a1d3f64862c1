"""A query's products with the rows of a vector matrix, computed in full only where they can matter.

The query's products with a large matrix (2Wiki: 37k entities and 21k facts x 256, 9.5 and 5.4 MB in int8, larger
than the cache) cost memory bandwidth, not arithmetic. The rows are projected once, at load, on the leading
principal axes of the matrix; a row's product with a query is the product of their projections plus that of what
the projections leave out, and Cauchy-Schwarz bounds the second by the product of the two left-out norms (and
the projections' int8 rounding the same way). Only
the rows whose bound lets them pass a threshold, or rank among the best k, are read in full, so the rows that pass
or rank are the ones a full product gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

MARGIN = 1e-3  # float32 rounding of the projections is ~1e-6: a row this far below the threshold is still read


@dataclass(frozen=True)
class Int8Rows:
    """Row vectors kept as the warehouse stores them, int8 and a float32 scale per row (a quarter of float32, in
    memory and in the index cache): a row is made float32 only when read, and a product with every row goes by
    blocks, so no float32 copy of the matrix is ever held."""

    q: np.ndarray      # (n, dim) int8
    scale: np.ndarray  # (n,) float32; 0 for an item without a vector

    BLOCK = 8192       # rows made float32 at once by a product: 8 MB at 256 dimensions

    @classmethod
    def zeros(cls, n: int, dim: int) -> "Int8Rows":
        return cls(np.zeros((n, dim), dtype=np.int8), np.zeros(n, dtype=np.float32))

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def __len__(self) -> int:
        return len(self.q)

    def __getitem__(self, rows) -> np.ndarray:
        """float32 rows, the values `dense()` holds at them."""
        return self.q[rows].astype(np.float32) * self.scale[rows, None]

    def dense(self) -> np.ndarray:
        return self.q.astype(np.float32) * self.scale[:, None]

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        """Every row's product with the vector `x` (the scale applied to the product, not to each entry)."""
        x = np.asarray(x, dtype=np.float32)
        out = np.empty(len(self.q), dtype=np.float32)
        for a in range(0, len(self.q), self.BLOCK):
            out[a:a + self.BLOCK] = self.q[a:a + self.BLOCK].astype(np.float32) @ x
        out *= self.scale
        return out


APPROX_MIN_ROWS = 250_000  # matrices this large are searched by their clusters (100,000 documents: 1.1M facts)


@dataclass(frozen=True)
class Clusters:
    """An inverted file: the rows grouped by the nearest of ~sqrt(n) k-means centroids, so a query reads the
    rows of the clusters nearest it (`ROW_SHARE` of the rows; clusters are uneven, so counted in rows) instead of
    them all. Approximate: a row in a cluster
    not probed is missed. Kept as one permutation of the rows and the clusters' offsets in it, not a copy."""

    centroids: np.ndarray  # (c, dim) float32
    order: np.ndarray      # row indices, cluster by cluster (int32)
    starts: np.ndarray     # (c + 1,) where each cluster's rows begin in `order`

    ROW_SHARE = 1 / 16     # of the rows a query reads: those of its nearest clusters, up to this many
    MIN_PROBE = 8          # clusters read at least

    @classmethod
    def of(cls, vecs: "np.ndarray | Int8Rows", rows: Callable[[int, int], np.ndarray]) -> "Clusters":
        """k-means (faiss, fixed seed) on a sample of 64 rows per centroid, then every row to its nearest."""
        import faiss

        n, dim = vecs.shape
        c = max(1, int(np.sqrt(n)))
        sample = np.unique(np.linspace(0, n - 1, min(n, 64 * c)).astype(np.int64))
        kmeans = faiss.Kmeans(dim, c, niter=10, seed=1234, spherical=True, max_points_per_centroid=64)
        kmeans.train(np.ascontiguousarray(rows_at(vecs, sample)))
        label = np.empty(n, dtype=np.int64)
        for a in range(0, n, Int8Rows.BLOCK):
            label[a:a + Int8Rows.BLOCK] = np.argmax(rows(a, min(a + Int8Rows.BLOCK, n)) @ kmeans.centroids.T, axis=1)
        order = np.argsort(label, kind="stable").astype(np.int32)
        starts = np.concatenate([[0], np.cumsum(np.bincount(label, minlength=c))])
        return cls(np.ascontiguousarray(kmeans.centroids, dtype=np.float32), order, starts)

    @classmethod
    def of_large(cls, vecs: "np.ndarray | Int8Rows") -> "Clusters | None":
        """The clusters of `vecs` from `APPROX_MIN_ROWS` rows, to be searched by; None below: read them all."""
        return cls.of(vecs, lambda a, b: rows_at(vecs, slice(a, b))) if len(vecs) >= APPROX_MIN_ROWS else None

    def rows(self, query: np.ndarray, ascending: bool = True) -> np.ndarray:
        """Indices of the rows of the clusters nearest `query`, ascending or cluster by cluster."""
        near = np.argsort(-(self.centroids @ query), kind="stable")
        sizes = np.cumsum(np.diff(self.starts)[near])
        probe = max(self.MIN_PROBE, int(np.searchsorted(sizes, self.ROW_SHARE * self.starts[-1])) + 1)
        rows = np.concatenate([self.order[self.starts[c]:self.starts[c + 1]] for c in near[:probe]])
        return np.sort(rows) if ascending else rows


READ_BLOCK = 1024  # rows gathered and made float32 at once by `products`: 1 MB at 256 dimensions, in the cache


def products(vecs: "np.ndarray | Int8Rows", rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """`vecs[rows] @ query` by blocks of rows gathered into the same two buffers, int8 and float32, so nothing the
    size of the rows read is allocated or leaves the cache, and int8 rows take their scale on the product, as
    `Int8Rows @` does (68k of the 1.1M fact rows: 5 against 23 ms of CPU). The products differ from
    `vecs[rows] @ query` in the last bits, so only the clustered searches use it: below `APPROX_MIN_ROWS` every
    product is the one it was."""
    query = np.asarray(query, dtype=np.float32)
    out = np.empty(len(rows), dtype=np.float32)
    if not isinstance(vecs, Int8Rows):
        for a in range(0, len(rows), READ_BLOCK):
            np.matmul(rows_at(vecs, rows[a:a + READ_BLOCK]), query, out=out[a:a + READ_BLOCK])
        return out
    codes = np.empty((min(READ_BLOCK, len(rows)), vecs.shape[1]), dtype=np.int8)
    block = np.empty(codes.shape, dtype=np.float32)
    for a in range(0, len(rows), READ_BLOCK):
        part = rows[a:a + READ_BLOCK]
        k = len(part)
        np.take(vecs.q, part, axis=0, out=codes[:k])
        np.copyto(block[:k], codes[:k], casting="unsafe")
        np.matmul(block[:k], query, out=out[a:a + k])
    out *= vecs.scale[rows]
    return out


def rows_at(vecs: "np.ndarray | Int8Rows", rows) -> np.ndarray:
    return vecs[rows] if isinstance(vecs, Int8Rows) else np.asarray(vecs[rows], dtype=np.float32)


@dataclass(frozen=True)
class CosineBound:
    axes: np.ndarray   # (dim, k) the matrix's leading principal axes (uncentered), orthonormal columns
    head: Int8Rows     # (n, k) each row projected on them, in int8 with a scale per row
    rest: np.ndarray   # (n,) norm of each row outside the projection
    error: np.ndarray  # (n,) norm of the difference between each row's projection and its int8 form
    clusters: Clusters | None = None  # from `APPROX_MIN_ROWS` rows: searched by clusters, the bound unused

    @classmethod
    def of(cls, vecs: "np.ndarray | Int8Rows", k: int) -> "CosineBound":
        """The bound of `vecs` on their `k` leading axes: the more axes, the more read at load and per query,
        the tighter the bound and the fewer rows read in full. Computed by blocks of rows, never all of them in
        float32 at once (a million int8 rows would take 1 GB so)."""
        n, dim = vecs.shape
        k = min(k, dim)
        if n >= APPROX_MIN_ROWS:
            return cls(np.zeros((dim, 0), dtype=np.float32), Int8Rows.zeros(0, 0), np.zeros(0), np.zeros(0),
                       Clusters.of(vecs, lambda a, b: rows_at(vecs, slice(a, b))))
        gram = np.zeros((dim, dim))
        for a in range(0, n, Int8Rows.BLOCK):
            block = rows_at(vecs, slice(a, a + Int8Rows.BLOCK))
            gram += block.T @ block
        _, eig = np.linalg.eigh(gram)  # ascending eigenvalues
        return cls.on(vecs, np.ascontiguousarray(eig[:, ::-1][:, :k], dtype=np.float32))

    @classmethod
    def on(cls, vecs: "np.ndarray | Int8Rows", axes: np.ndarray) -> "CosineBound":
        """The bound of `vecs` on the given orthonormal `axes`. The projections are kept in int8 (a quarter of
        float32); the error that leaves is bounded as the left-out part is, and added to it."""
        from lazyhippo.stores.warehouse import int8_rows

        n, k = len(vecs), axes.shape[1]
        stored, rest, error = Int8Rows.zeros(n, k), np.zeros(n), np.zeros(n)
        for a in range(0, n, Int8Rows.BLOCK):
            b = min(a + Int8Rows.BLOCK, n)
            block = rows_at(vecs, slice(a, b))
            head = block @ axes
            rest[a:b] = np.sqrt(np.maximum(np.einsum("ij,ij->i", block, block, dtype=np.float64) -
                                           np.einsum("ij,ij->i", head, head, dtype=np.float64), 0.0))
            stored.q[a:b], stored.scale[a:b] = int8_rows(head)
            error[a:b] = np.linalg.norm(head.astype(np.float64) - stored[a:b], axis=1)
        return cls(axes, stored, rest, error)

    def _bounds(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's product with `query` over the axes, and how far its full product can be from that."""
        qh = query @ self.axes
        qh_norm2 = float(np.dot(qh, qh))
        q_rest = np.sqrt(max(float(np.dot(query, query)) - qh_norm2, 0.0))
        # v.q = h'.qh + (h - h').qh + r.q_r, and Cauchy-Schwarz bounds the last two terms
        return self.head @ qh, self.rest * q_rest + self.error * np.sqrt(qh_norm2) + MARGIN

    def read(self, vecs: "np.ndarray | Int8Rows", rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """`vecs[rows] @ query` (rows from `candidates`), by blocks when searched by clusters."""
        query = np.asarray(query, dtype=np.float32)
        return products(vecs, rows, query) if self.clusters is not None else vecs[rows] @ query

    def candidates(self, query: np.ndarray, threshold: float, ascending: bool = True) -> np.ndarray:
        """Indices of every row whose product with `query` may be `threshold` or more (by clusters: the rows near
        it, ascending only if asked)."""
        if self.clusters is not None:
            return self.clusters.rows(np.asarray(query, dtype=np.float32), ascending)
        near, slack = self._bounds(np.asarray(query, dtype=np.float32))
        return np.flatnonzero(near + slack >= threshold)

    def top(self, vecs: np.ndarray, query: np.ndarray, k: int, plus: np.ndarray | None = None,
            exact: np.ndarray | None = None) -> np.ndarray:
        """`vecs @ query + plus` (`vecs` the rows projected, `plus` a float32 score per row or None) at every row
        that can rank among the `k` largest and at the rows `exact`; at the others an upper bound below the k-th
        largest value, so the best k are those of the full product. The full product when it is as cheap."""
        query = np.asarray(query, dtype=np.float32)
        n = len(vecs)
        if not 0 < k < n:
            return vecs @ query + plus if plus is not None else vecs @ query
        if self.clusters is not None:
            return self._clustered(vecs, query, k, plus, exact)
        near, slack = self._bounds(query)
        if plus is not None:
            near += plus
        floor = np.partition(near - slack, n - k)[n - k]
        read = near + slack >= floor
        if exact is not None:
            read[exact] = True
        rows = np.flatnonzero(read)
        if 4 * len(rows) > n:
            return vecs @ query + plus if plus is not None else vecs @ query
        out = (near + slack).astype(np.float32)
        part = vecs[rows] @ query
        out[rows] = part + plus[rows] if plus is not None else part
        return out

    def _clustered(self, vecs, query: np.ndarray, k: int, plus: np.ndarray | None, exact: np.ndarray | None
                   ) -> np.ndarray:
        """`top` by clusters: the full score at the rows of the clusters near `query`, the `exact` rows and the
        best 4k of `plus`; -inf at the others."""
        parts = [self.clusters.rows(query, ascending=False)]
        if exact is not None:
            parts.append(np.asarray(exact, dtype=np.int64))
        if plus is not None:
            parts.append(top_indices(plus, 4 * k))
        read = np.zeros(len(vecs), dtype=bool)  # a mask, not np.unique: tens of thousands of rows hash slowly
        for part in parts:
            read[part] = True
        rows = np.flatnonzero(read)
        out = np.full(len(vecs), -np.inf, dtype=np.float32)
        part = products(vecs, rows, query)
        out[rows] = part + plus[rows] if plus is not None else part
        return out


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores, best first (stable for ties)."""
    if k <= 0 or scores.size == 0:
        return np.zeros(0, dtype=np.int64)
    k = min(k, scores.size)
    part = _largest(scores, k)
    return part[np.lexsort((part, -scores[part]))]


def _largest(scores: np.ndarray, k: int) -> np.ndarray:
    """`np.argpartition(-scores, k - 1)[:k]`, searched among the scores at least the k-th largest of every 16th
    one when k is small: a partition of a few hundred instead of all (37k entities: 0.04 against 0.36 ms). When
    a tie at the k-th place leaves the choice of the tied to the partition, the full one chooses, as before."""
    if 32 * k <= scores.size:
        sample = scores[::16]
        floor = np.partition(sample, sample.size - k)[sample.size - k]
        rows = np.flatnonzero(scores >= floor)  # every score of the k largest, and no NaN
        if rows.size >= k:
            sub = scores[rows]
            pick = np.argpartition(-sub, k - 1)[:k]
            kth = sub[pick].min()
            if np.count_nonzero(sub == kth) == np.count_nonzero(sub[pick] == kth):
                return rows[pick]
    return np.argpartition(-scores, k - 1)[:k]
