"""Personalized PageRank over the entity+passage graph, and the hook other graph stores plug into.

The embedded path runs a sparse power iteration on the in-memory CSR matrix of `GraphIndex`. Another
graph store (Neo4j: the same iteration over its served graph) implements `PPRBackend` and is passed to
the query functions as `ppr=`: the routes only ever see a score per node index.
"""

from __future__ import annotations

import functools
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import scipy.sparse as sp

from lazyhippo.settings import environment


@dataclass(frozen=True)
class PPRResult:
    scores: np.ndarray   # one score per node, sums to 1
    iterations: int
    residual: float      # L1 change of the last iteration


def transition_matrix(adjacency: sp.spmatrix) -> tuple[sp.csr_matrix, np.ndarray]:
    """Column-stochastic transpose of a row-normalized adjacency (M = D^-1 A, transposed) and the dangling mask.

    `M @ p` moves the mass of each node to its neighbours in proportion to edge weight.
    """
    a = sp.csr_matrix(adjacency, dtype=np.float64)
    out_w = np.asarray(a.sum(axis=1)).ravel()
    dangling = out_w <= 0
    inv = np.zeros_like(out_w)
    inv[~dangling] = 1.0 / out_w[~dangling]
    m = (sp.diags(inv) @ a).T.tocsr()
    return m, dangling


def personalized_pagerank(transition: sp.csr_matrix, personalization: np.ndarray, damping: float = 0.5,
                          tol: float = 1e-6, max_iter: int = 100, dangling: np.ndarray | None = None,
                          matvec: Callable[[np.ndarray], np.ndarray] | None = None,
                          columns: sp.csc_matrix | None = None) -> PPRResult:
    """Power iteration p <- d * (M p + dangling mass * s) + (1 - d) * s, with s the normalized personalization.

    `transition` is column-stochastic (see `transition_matrix`); mass stuck on dangling nodes returns to
    the seeds, so the result always sums to 1. `damping` is the probability of following an edge.
    Stops when the L1 change drops below `tol` or after `max_iter` iterations. `matvec` may replace
    `transition @ p` (e.g. a row-blocked parallel product). `columns`, the same matrix in CSC form (sorted
    indices, as `transition`), lets an iteration whose vector is sparse (the first: only the seeds) read
    only those columns: every node's sum takes the same terms in the same order (the skipped ones are
    zeros), so the result is the same to the bit.
    """
    n = transition.shape[0]
    s = np.clip(_checked(personalization, n, damping), 0.0, None)
    total = s.sum()
    if total <= 0:  # no seed: plain PageRank from the uniform vector
        s = np.full(n, 1.0 / max(n, 1))
    else:
        s = s / total
    if dangling is None:
        col_sums = np.asarray(transition.sum(axis=0)).ravel()
        dangling = col_sums <= 0
    dtype = transition.dtype if transition.dtype in (np.float32, np.float64) else np.float64
    s = s.astype(dtype)
    p = s.copy()
    dangling_idx = np.flatnonzero(dangling)
    base = (1.0 - damping) * s
    residual, it = float("inf"), 0
    sparse = columns is not None  # the support only grows: once an iteration reads most columns, all do
    for it in range(1, max_iter + 1):
        lost = float(p[dangling_idx].sum()) if dangling_idx.size else 0.0
        if sparse:
            support = np.flatnonzero(p != 0)  # on the mask: 10x faster than on the floats
            sparse = 8 * int((columns.indptr[support + 1] - columns.indptr[support]).sum()) < columns.nnz
        if sparse:
            nxt = columns[:, support] @ p[support]
        else:
            nxt = matvec(p) if matvec is not None else transition @ p
        nxt *= damping
        nxt += base
        if lost:
            nxt += (damping * lost) * s
        residual = float(np.abs(nxt - p).sum())
        p = nxt
        if residual < tol:
            break
    p = p.astype(np.float64)
    p /= max(p.sum(), 1e-300)
    return PPRResult(p, it, residual)


def _checked(personalization: np.ndarray, n: int, damping: float) -> np.ndarray:
    """The personalization as a float64 vector; ValueError on a damping outside [0, 1) or a length other than `n`."""
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    s = np.asarray(personalization, dtype=np.float64).ravel()
    if s.shape[0] != n:
        raise ValueError(f"personalization has {s.shape[0]} entries for {n} nodes")
    return s


def pushed_pagerank(columns: sp.csc_matrix, personalization: np.ndarray, damping: float = 0.5,
                    eps: float = 1e-7, dangling: np.ndarray | None = None, max_rounds: int = 200) -> PPRResult:
    """The same walk as `personalized_pagerank` (`columns`: its transition by column), by forward push (Andersen,
    Chung and Lang 2006): a node holding at least `eps` residual mass per edge it has waits in a queue; popped, it
    keeps (1 - damping) of its residual as its score and sends the rest along its edges at once (a dangling node's
    back to the seeds at the end of a round), so the next node popped already moves what it received. Its cost
    follows the mass, not the graph: a power iteration reads every edge each step, where most nodes of a large
    graph carry next to nothing. Every node ends with less than `eps` per edge left unpushed, so its score is at
    most that far below the power iteration's fixed point (before the sum is normalized to 1). `iterations` counts
    rounds (a round: the nodes queued when it began), at most `max_rounds`; `residual` is the mass left unpushed.
    The loop is compiled (numba, imported on the first walk) and runs without the GIL on this thread's scratch
    vectors, which it leaves zeroed by resetting only the nodes it reached."""
    n = columns.shape[1]
    given = _checked(personalization, n, damping)
    if not eps > 0:  # a floor of 0 marks a node the walk has not reached
        raise ValueError(f"eps must be positive, got {eps}")
    seeds = np.flatnonzero(given > 0)
    weights = given[seeds] / given[seeds].sum()
    if not len(seeds):  # no seed: plain PageRank from the uniform vector
        seeds, weights = np.arange(n), np.full(n, 1.0 / max(n, 1))
    if dangling is None:
        dangling = np.diff(columns.indptr) == 0
    elif len(dangling) != n:  # the compiled loop reads it unchecked
        raise ValueError(f"dangling mask has {len(dangling)} entries for {n} nodes")
    p = np.zeros(n)
    rounds, total = _push_kernel()(columns.indptr, columns.indices, columns.data, np.asarray(dangling, dtype=np.bool_),
                                   seeds, weights, float(damping), float(eps), int(max_rounds), p, *_scratch(n))
    return PPRResult(p, rounds, max(1.0 - total, 0.0))


def _push(indptr, indices, data, dangling, seeds, weights, damping, eps, max_rounds, p, node, queue, reached):
    """The queue's loop of `pushed_pagerank`: adds each popped node's kept mass to `p`, divides `p` by their sum
    and returns (rounds, that sum). `node` holds per node its residual and, once a walk reaches it, its floor
    (eps per edge; 0: not reached), side by side so that pushing along an edge touches one cache line; it starts
    and ends zeroed. A node waits in `queue` (a ring of one slot per node) from the moment its residual reaches
    its floor until it is popped, which sets it back to 0: it joins the queue only when an addition crosses its
    floor. `reached` lists the nodes whose floor was set."""
    n = len(node)
    head = tail = waiting = n_reached = 0
    for i in range(len(seeds)):
        s = seeds[i]
        node[s, 1] = eps * max(indptr[s + 1] - indptr[s], 1)
        reached[n_reached] = s
        n_reached += 1
        node[s, 0] = weights[i]
        if weights[i] >= node[s, 1]:
            queue[tail] = s
            tail += 1
            waiting += 1
    if tail == n:
        tail = 0
    rounds = 0
    kept = 0.0
    while waiting and rounds < max_rounds:
        rounds += 1
        lost = 0.0
        for _ in range(waiting):  # the nodes waiting as the round begins
            u = queue[head]
            head += 1
            if head == n:
                head = 0
            waiting -= 1
            mass = node[u, 0]
            node[u, 0] = 0.0
            p[u] += (1.0 - damping) * mass
            kept += (1.0 - damping) * mass
            if dangling[u]:
                lost += mass
                continue
            sent = damping * mass
            for k in range(indptr[u], indptr[u + 1]):
                v = indices[k]
                floor = node[v, 1]
                if floor == 0.0:
                    floor = node[v, 1] = eps * max(indptr[v + 1] - indptr[v], 1)
                    reached[n_reached] = v
                    n_reached += 1
                before = node[v, 0]
                node[v, 0] = before + sent * data[k]
                if before < floor <= node[v, 0]:
                    queue[tail] = v
                    tail += 1
                    if tail == n:
                        tail = 0
                    waiting += 1
        if lost > 0.0:
            for i in range(len(seeds)):
                s = seeds[i]
                before = node[s, 0]
                node[s, 0] = before + damping * lost * weights[i]
                if before < node[s, 1] <= node[s, 0]:
                    queue[tail] = s
                    tail += 1
                    if tail == n:
                        tail = 0
                    waiting += 1
    total = max(kept, 1e-300)
    for i in range(n_reached):  # only a reached node has a score: normalized here, no pass over every node
        v = reached[i]
        p[v] /= total
        node[v, 0] = 0.0
        node[v, 1] = 0.0
    return rounds, kept


_SCRATCH = threading.local()


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's residuals and floors, queue and reached list for a push over `n` nodes (`_push`), which its walks
    reuse and leave zeroed: new ones per walk cost their page faults wherever a walk reaches new nodes (20 walks
    at 100,000 documents run alone: 13% of their CPU)."""
    held = getattr(_SCRATCH, "push", None)
    if held is None or len(held[0]) != n:
        held = _SCRATCH.push = (np.zeros((n, 2)), np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32))
    return held


@functools.cache
def _push_kernel() -> Callable:
    """`_push` compiled, its machine code cached beside this module (or in the user's cache folder) so that a new
    process loads it instead of compiling it again; without any writable folder it is compiled once per process."""
    import numba

    try:
        return numba.njit(nogil=True, cache=True)(_push)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(nogil=True)(_push)


class PPRBackend(Protocol):
    """Anything that turns a personalization vector over GraphIndex node indices into PPR scores."""

    name: str

    def run(self, index, personalization: np.ndarray, damping: float, tol: float, max_iter: int) -> np.ndarray: ...


_POOL: ThreadPoolExecutor | None = None
_BLAS = None


def one_blas_thread(fn: Callable) -> Callable:
    """Run `fn` with one BLAS thread: a query's products are small, and OpenBLAS's own threads spinning
    against other processes made them several times slower (`lazyhippo bench query` on 2Wiki: local p50
    20-30 ms with the default threads, 15 ms with one, in the same minute)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global _BLAS
        if _BLAS is None or _BLAS[0] != len(sys.modules):  # an import since may have loaded another BLAS
            from threadpoolctl import ThreadpoolController

            _BLAS = (len(sys.modules), ThreadpoolController())
        with _BLAS[1].limit(limits=1, user_api="blas"):
            return fn(*args, **kwargs)
    return wrapper


def parallel_matvec(matrix: sp.csr_matrix, threads: int | None = None, min_nnz: int = 1_500_000):
    """`p -> matrix @ p` split into row blocks run on a thread pool (scipy's sparse kernels release the
    GIL); None when the matrix is small, one core is all there is, or `LAZYHIPPO_THREADS=1` (a server
    worker, whose cores already run other queries). Below ~1.5M non-zeros the threads' hand-offs cost
    what they save (2 cores: 1.1x on 2Wiki's 0.6M, and `bench query` local p50 24-25 ms serial against
    27 ms threaded; 1.3x at 2M, 1.7x at 8M)."""
    global _POOL
    threads = threads or environment().compute_threads()
    if threads < 2 or matrix.nnz < min_nnz:
        return None
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lazyhippo-ppr")
    # blocks with equal nnz, so each thread gets the same work
    cuts = np.searchsorted(matrix.indptr, np.linspace(0, matrix.nnz, threads + 1)[1:-1])
    bounds = [0, *[int(c) for c in cuts], matrix.shape[0]]
    blocks = [_rows(matrix, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]

    def matvec(p: np.ndarray) -> np.ndarray:
        futures = [_POOL.submit(b.dot, p) for b in blocks]
        return np.concatenate([f.result() for f in futures])

    matvec.blocks = blocks
    return matvec


def _rows(matrix: sp.csr_matrix, a: int, b: int) -> sp.csr_matrix:
    """Rows a..b-1 of `matrix` as views of its arrays (scipy's slice copies them: a second copy of the graph)."""
    lo, hi = int(matrix.indptr[a]), int(matrix.indptr[b])
    block = sp.csr_matrix((b - a, matrix.shape[1]), dtype=matrix.dtype)  # filled below: the constructor copies
    block.data, block.indices, block.indptr = matrix.data[lo:hi], matrix.indices[lo:hi], matrix.indptr[a:b + 1] - lo
    return block


PUSH_MIN_EDGES = 8_000_000  # walks on graphs this large go by forward push (10,000 documents: 2M edges)
PUSH_EPS_PER_TOL = 1e-4     # push's mass left per edge, per unit of the power iteration's stopping change


class EmbeddedPPR:
    """The walk on the index's precomputed float32 transition (the default); float32 halves the memory traffic
    of the product, results are renormalized in float64. A power iteration, whose every step reads the whole
    graph, up to `PUSH_MIN_EDGES`; above, forward push, whose cost follows the mass (100,000 documents, 38M
    edges: 5x faster, the same 10 best passages on 20 questions; docs/benchmarks.md)."""

    name = "embedded"

    def run(self, index, personalization, damping, tol, max_iter):
        g = index.graph
        if g.columns32.nnz >= PUSH_MIN_EDGES:
            return pushed_pagerank(g.columns32, personalization, damping, tol * PUSH_EPS_PER_TOL,
                                   dangling=g.dangling).scores
        return personalized_pagerank(g.transition32, personalization, damping, tol, max_iter,
                                     dangling=g.dangling, matvec=g.matvec32, columns=g.columns32).scores


def get_ppr_backend(ppr: PPRBackend | Callable | None) -> PPRBackend:
    """None -> embedded; a plain function f(index, personalization, damping, tol, max_iter) is wrapped."""
    if ppr is None:
        return EmbeddedPPR()
    if hasattr(ppr, "run"):
        return ppr  # type: ignore[return-value]
    if callable(ppr):
        fn = ppr

        class _Fn:
            name = getattr(fn, "__name__", "custom")

            def run(self, index, personalization, damping, tol, max_iter):
                return np.asarray(fn(index, personalization, damping, tol, max_iter), dtype=np.float64)

        return _Fn()
    raise TypeError(f"ppr must be a PPRBackend, a function or None, not {type(ppr).__name__}")
