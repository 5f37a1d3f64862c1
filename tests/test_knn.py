"""The KNN search above the exact search's size: an approximate index whose edges are rescored exactly."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lazyhippo.graph import algorithms
from lazyhippo.graph.algorithms import KnnBasis, StoredVectors, knn_edges, knn_stale_sources
from lazyhippo.stores.warehouse import int8_rows


def clustered(n: int, dim: int = 32, centres: int = 40, noise: float = 0.45, seed: int = 5) -> np.ndarray:
    """Unit vectors around random centres: dense neighbourhoods above the cutoff, as entity names give."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, dim))
    x = c[rng.integers(0, centres, n)] + noise * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def pairs(edges) -> set[tuple[str, str]]:
    return {(e.source, e.target) for e in edges}


@pytest.fixture
def approximate(monkeypatch):
    """Every search above 100 items goes through the approximate index; counts the indexes built."""
    built = []
    real = algorithms.approximate_index
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", 100)
    monkeypatch.setattr(algorithms, "approximate_index", lambda v: built.append(len(v)) or real(v))
    return built


def test_approximate_search_finds_the_exact_edges_with_true_scores(approximate):
    x = clustered(4000)
    ids = [f"e{i:05d}" for i in range(len(x))]
    top_k, cutoff = 5, 0.7
    found = knn_edges(ids, x, top_k, cutoff)
    assert approximate == [len(x)]  # the approximate index did the search
    algorithms.KNN_EXACT_MAX = len(x)
    exact = knn_edges(ids, x, top_k, cutoff)
    assert approximate == [len(x)] and len(exact) > 10_000  # no index this time; lists are full above the cutoff
    assert len(pairs(found) & pairs(exact)) >= 0.97 * len(exact)
    pos = {n: i for i, n in enumerate(ids)}
    by_source: dict[str, list] = {}
    for e in found:
        assert e.source != e.target and e.score >= cutoff
        assert abs(e.score - float(x[pos[e.source]].astype(np.float64) @ x[pos[e.target]].astype(np.float64))) < 1e-12
        by_source.setdefault(e.source, []).append(e)
    for edges in by_source.values():
        assert [e.rank for e in edges] == list(range(1, len(edges) + 1)) and len(edges) <= top_k
        assert all(a.score >= b.score for a, b in zip(edges, edges[1:]))


def on_one_thread(search):
    """`search()` with faiss (and the exact search, which follows its setting) on one thread, then as before."""
    import faiss

    threads = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(1)
        return search()
    finally:
        faiss.omp_set_num_threads(threads)


def test_approximate_search_is_the_same_whatever_the_threads(approximate):
    x = clustered(3000, seed=9)
    ids = [f"e{i:05d}" for i in range(len(x))]
    first = knn_edges(ids, x, 4, 0.6)
    one = on_one_thread(lambda: knn_edges(ids, x, 4, 0.6))
    assert first == one == knn_edges(ids, x, 4, 0.6) and len(approximate) == 3


def test_stored_vectors_give_the_bits_of_the_float_matrix(monkeypatch):
    """The stage keeps vectors in their int8 form and makes unit rows by blocks: the exact search, the
    exact search by blocks of items and the stale lists come out as from the whole float32 matrix."""
    from lazyhippo.models.embedders import normalize

    rng = np.random.default_rng(2)
    codes, scales = int8_rows(clustered(1500) * rng.uniform(0.5, 2.0, size=(1500, 1)).astype(np.float32))
    stored = StoredVectors(codes, scales)
    dense = normalize(codes.astype(np.float32) * scales[:, None])
    ids = [f"e{i:05d}" for i in range(len(codes))]
    assert np.array_equal(np.asarray(stored), dense) and np.array_equal(stored.unit(np.array([7, 3])), dense[[7, 3]])
    full = knn_edges(ids, dense, 6, 0.6)
    assert knn_edges(ids, stored, 6, 0.6) == full
    rows = list(range(1499, 399, -1))  # two blocks of 1,024 sources, last first
    monkeypatch.setattr(algorithms, "ROW_BLOCK", 256)  # items in six blocks
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", 1400)  # 1,500 items, 1,100 x 1,500 pairs: exact by blocks
    monkeypatch.setattr(algorithms, "approximate_index", lambda v: pytest.fail("no approximate index for these rows"))
    assert knn_edges(ids, stored, 6, 0.6, rows) == sorted((e for e in full if int(e.source[1:]) >= 400),
                                                          key=lambda e: (-int(e.source[1:]), e.rank))
    changed = set(ids[:40])
    previous = KnnBasis({i: (6, 0.9) for i in ids}, set())
    monkeypatch.setattr(algorithms, "ROW_BLOCK", 1 << 16)
    whole = knn_stale_sources(ids, dense, 6, 0.6, changed, previous)
    monkeypatch.setattr(algorithms, "ROW_BLOCK", 256)
    assert knn_stale_sources(ids, stored, 6, 0.6, changed, previous) == whole and len(whole) > 40


def test_small_inputs_keep_top_k_and_cutoff(approximate):
    x = clustered(150, dim=16, centres=3)
    ids = [f"e{i:03d}" for i in range(len(x))]
    assert knn_edges(ids, x, 0, 0.0) == [] and knn_edges(ids[:1], x[:1], 3, 0.0) == []
    edges = knn_edges(ids, x, 200, 0.95)  # more neighbours asked than items: the candidates bound the lists
    assert approximate and edges and all(e.score >= 0.95 and e.source != e.target for e in edges)
    assert len({(e.source, e.target) for e in edges}) == len(edges)


@pytest.mark.parametrize("exact_max", [1000, 500])  # stale lists searched exactly by blocks; through the index
def test_an_update_above_the_exact_size_searches_its_stale_lists_only(monkeypatch, exact_max):
    """Above KNN_EXACT_MAX the lists an update leaves alone are those of the previous approximate search, the
    stale ones are searched again (exactly while stale lists x items stays within KNN_EXACT_MAX squared, else
    through the approximate index): the result is close to a full approximate search, and new and moved
    items get their neighbours."""
    from tests.test_incremental import as_rows, basis, unit

    rng = np.random.default_rng(11)
    x = clustered(3000, dim=48, centres=60, noise=0.5, seed=4)
    ids = [f"e{i:05d}" for i in range(len(x))]
    top_k, cutoff = 5, 0.6
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", exact_max)
    before = knn_edges(ids, x, top_k, cutoff)
    vec = {i: v for i, v in zip(ids, x) if i not in set(ids[10:20])}
    changed = set(ids[100:110])
    for i in changed:  # moved next to another item
        vec[i] = unit((x[ids.index(i) + 1500] + 0.01 * rng.normal(size=48))[None])[0]
    for n in range(10):  # new items near existing ones
        vec[f"e{n:05d}x"] = unit((x[2000 + n] + 0.02 * rng.normal(size=48))[None])[0]
    new_ids = sorted(vec)
    new_x = np.stack([vec[i] for i in new_ids])
    moved = changed | set(ids[10:20]) | {i for i in new_ids if i.endswith("x")}
    stale = knn_stale_sources(new_ids, new_x, top_k, cutoff, moved, basis(ids, before, moved))
    assert 20 < len(stale) < len(new_ids) // 4
    built = []
    real = algorithms.approximate_index
    monkeypatch.setattr(algorithms, "approximate_index", lambda v: built.append(len(v)) or real(v))
    redone = knn_edges(new_ids, new_x, top_k, cutoff, stale)
    assert built == ([] if len(stale) * len(new_ids) <= exact_max ** 2 else [len(new_ids)])
    assert built == ([] if exact_max == 1000 else [len(new_ids)])  # both ways are taken
    kept = [e for e in before if e.source in set(new_ids) - {new_ids[i] for i in stale}]
    incremental = as_rows(kept + redone)
    full = as_rows(knn_edges(new_ids, new_x, top_k, cutoff))
    assert len(set(incremental) & set(full)) >= 0.98 * len(full) and as_rows(before) != full
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", len(new_ids))
    exact = knn_edges(new_ids, new_x, top_k, cutoff, [new_ids.index(i) for i in sorted(moved) if i in vec])
    mine = {(e.source, e.target) for e in redone}
    assert exact and len(mine & pairs(exact)) >= 0.95 * len(exact)  # the moved and new items' own lists


def test_bench_knn_times_a_search_on_a_copy_and_scores_an_approximate_one(sample_settings, tmp_path):
    """`lazyhippo bench knn`: the exact search and the approximate one on copies of an indexed home, and the
    share of the exact edges the approximate search found."""
    import json
    import shutil

    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app

    exact_max = algorithms.KNN_EXACT_MAX
    ns = sample_settings.namespace
    runs = {}
    for name, extra in (("exact", []), ("approx", ["--exact-max", "0"])):
        home = tmp_path / name
        shutil.copytree(sample_settings.home, home, ignore=shutil.ignore_patterns("*.lock"))
        out = CliRunner().invoke(app, ["bench", "knn", "run", str(home), ns, "--edges", str(tmp_path / f"{name}.parquet"), *extra])
        assert out.exit_code == 0, out.output
        runs[name] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["exact"]["entities"] == runs["approx"]["entities"] > 0 and runs["exact"]["edges"] > 0
    out = CliRunner().invoke(app, ["bench", "knn", "recall", str(tmp_path / "exact.parquet"), str(tmp_path / "approx.parquet")])
    assert out.exit_code == 0, out.output
    recall = json.loads(out.stdout.strip().splitlines()[-1])
    assert recall["exact_edges"] == runs["exact"]["edges"] and 0.9 <= recall["found"] <= 1.0
    assert algorithms.KNN_EXACT_MAX == exact_max  # `--exact-max` held for its run only, not for later searches


def brute_force(x: np.ndarray, top_k: int, cutoff: float) -> list[tuple[int, int, float, int]]:
    """The reference: every pair's float64 cosine (at most 1), the top k of each row, ties to the lower index."""
    s = np.minimum(x.astype(np.float64) @ x.astype(np.float64).T, 1.0)
    np.fill_diagonal(s, -np.inf)
    out = []
    for i in range(len(x)):
        order = np.lexsort((np.arange(len(x)), -s[i]))[:top_k]
        out += [(i, int(j), float(s[i, j]), r + 1) for r, j in enumerate(order) if s[i, j] >= cutoff]
    return out


def rows_of(ids: list[str], edges) -> list[tuple[int, int, float, int]]:
    pos = {n: i for i, n in enumerate(ids)}
    return [(pos[e.source], pos[e.target], e.score, e.rank) for e in edges]


def tied_vectors(first: int, stored: bool):
    """900 clustered vectors with thirteen copies from `first` on and a zero vector at 500 (a cosine of 0 with
    everything): ids, the vectors as searched (int8 codes when `stored`), and the float rows they stand for."""
    from lazyhippo.models.embedders import normalize

    x = clustered(900, dim=24, centres=30, noise=0.6, seed=3)
    x[first + 1:first + 13] = x[first]
    x[500] = 0.0
    ids = [f"e{i:04d}" for i in range(len(x))]
    if not stored:
        return ids, x, x
    codes, scales = int8_rows(x)
    return ids, StoredVectors(codes, scales), normalize(codes.astype(np.float32) * scales[:, None])


@pytest.mark.parametrize("top_k,cutoff", [(3, 0.6), (5, 0.3), (4, -1.0), (40, 0.9)])
@pytest.mark.parametrize("stored", [False, True])
def test_exact_search_equals_brute_force(monkeypatch, top_k, cutoff, stored):
    """Up to KNN_EXACT_MAX the search finds exactly what comparing every pair in float64 finds: exact copies
    tie by the dozen (more than the candidates' slack) and go to the lower index, rows have fewer items above
    the cutoff than k or none, and blocks of sources are small enough that a row's candidates span several."""
    ids, vectors, x = tied_vectors(99, stored)  # thirteen copies: ties at every rank
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", len(x))
    monkeypatch.setattr(algorithms, "KNN_BLOCK_PAIRS", 64 * len(x))  # 64 sources a block
    found = rows_of(ids, knn_edges(ids, vectors, top_k, cutoff))
    reference = brute_force(x, top_k, cutoff)
    assert [r[::3] + r[1:2] for r in found] == [r[::3] + r[1:2] for r in reference] and found
    assert np.allclose([r[2] for r in found], [r[2] for r in reference], rtol=0, atol=1e-12)
    assert [t for s, t, _, _ in found if s == 99][:3] == [100, 101, 102]
    assert knn_edges(ids, vectors, top_k, cutoff, [400, 99, 7]) == [
        e for i in (400, 99, 7) for e in knn_edges(ids, vectors, top_k, cutoff) if e.source == ids[i]]


@pytest.mark.parametrize("stored", [False, True])
def test_exact_search_is_the_same_whatever_the_threads(monkeypatch, stored):
    x = clustered(2000, dim=64, seed=8)
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", len(x))
    ids = [f"e{i:05d}" for i in range(len(x))]
    vectors = StoredVectors(*int8_rows(x)) if stored else x
    first = knn_edges(ids, vectors, 3, 0.6)
    one = on_one_thread(lambda: knn_edges(ids, vectors, 3, 0.6))
    assert first == one and len(first) > 1000


@pytest.mark.parametrize("top_k,cutoff", [(3, 0.6), (4, -1.0), (40, 0.9)])
@pytest.mark.parametrize("stored", [False, True])
def test_an_update_above_the_exact_size_finds_the_brute_force_edges(monkeypatch, top_k, cutoff, stored):
    """Above KNN_EXACT_MAX an update's stale rows are still searched exactly while rows x items stays within its
    square, items by blocks: a row's best among earlier blocks meets the next block's items, copies tying across
    a block boundary go to the lower index, and the edges are those of comparing every pair in float64."""
    ids, vectors, x = tied_vectors(249, stored)  # thirteen copies across the items' block boundary at 256
    rows = [261, 500, 7, 249, 899, 0, *range(880, 600, -4)]  # 76 rows, not in order
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", 300)  # 76 rows x 900 items: within 300 squared
    monkeypatch.setattr(algorithms, "ROW_BLOCK", 128)  # items in eight blocks
    monkeypatch.setattr(algorithms, "KNN_BLOCK_PAIRS", 16 * 128)  # 16 rows a block
    monkeypatch.setattr(algorithms, "approximate_index", lambda v: pytest.fail("no approximate index for these rows"))
    found = rows_of(ids, knn_edges(ids, vectors, top_k, cutoff, rows))
    reference = brute_force(x, top_k, cutoff)
    reference = [r for i in rows for r in reference if r[0] == i]
    assert [r[::3] + r[1:2] for r in found] == [r[::3] + r[1:2] for r in reference] and found
    assert np.allclose([r[2] for r in found], [r[2] for r in reference], rtol=0, atol=1e-12)
    assert [t for s, t, _, _ in found if s == 261][:3] == [249, 250, 251]


def _anonymous_mb() -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no Anonymous line in smaps_rollup")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="reads Linux's /proc")
def test_exact_search_keeps_no_block_of_products_once_done():
    """The search's session is cached for the process (a run's later steps, its query index build): the products
    of a block (KNN_BLOCK_PAIRS of them) must not stay allocated after the search."""
    import ctypes
    import gc

    small = StoredVectors(*int8_rows(clustered(50)))
    list(algorithms.knn_batches(small, 5, 0.5))  # the session and its libraries loaded
    vectors = StoredVectors(*int8_rows(clustered(6000, dim=64)))
    before = _anonymous_mb()
    assert sum(len(b.sources) for b in algorithms.knn_batches(vectors, 5, 0.5)) > 0
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    assert _anonymous_mb() - before < 25
