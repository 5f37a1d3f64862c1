"""Rows of a vector matrix whose cosine with a query can reach a threshold, found by reading a quarter of it.

The query's products with a large matrix (2Wiki: 37k entities x 256 float32, 38 MB, larger than the cache) cost
memory bandwidth, not arithmetic. The rows are projected once, at load, on the leading principal axes of the
matrix; a row's product with a query is the product of their projections plus that of what the projections
leave out, and Cauchy-Schwarz bounds the second by the product of the two left-out norms. Only rows whose bound
reaches the threshold are read in full, so the rows that pass are the ones a full product would pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MARGIN = 1e-3  # float32 rounding of the projections is ~1e-6: a row this far below the threshold is still read


@dataclass(frozen=True)
class CosineBound:
    axes: np.ndarray   # (dim, k) the matrix's leading principal axes (uncentered), orthonormal columns
    head: np.ndarray   # (n, k) each row projected on them
    rest: np.ndarray   # (n,) norm of each row outside the projection

    @classmethod
    def of(cls, vecs: np.ndarray, k: int = 64) -> "CosineBound":
        """64 axes of 256 dims leave most rows about half their norm: a query phrase reads ~5 rows in full on
        2Wiki's entities (at most ~800), besides the 9.5 MB of projections."""
        vecs = np.asarray(vecs, dtype=np.float32)
        k = min(k, vecs.shape[1])
        _, eig = np.linalg.eigh((vecs.T @ vecs).astype(np.float64))  # ascending eigenvalues
        axes = np.ascontiguousarray(eig[:, ::-1][:, :k], dtype=np.float32)
        head = vecs @ axes
        rest = np.sqrt(np.maximum(np.einsum("ij,ij->i", vecs, vecs, dtype=np.float64) -
                                  np.einsum("ij,ij->i", head, head, dtype=np.float64), 0.0))
        return cls(axes, head, rest)

    def candidates(self, query: np.ndarray, threshold: float) -> np.ndarray:
        """Ascending indices of every row whose product with `query` may be `threshold` or more."""
        query = np.asarray(query, dtype=np.float32)
        qh = query @ self.axes
        q_rest = np.sqrt(max(float(np.dot(query, query)) - float(np.dot(qh, qh)), 0.0))
        return np.flatnonzero(self.head @ qh + self.rest * q_rest >= threshold - MARGIN)
