"""The built index of a published snapshot is kept on disk beside it: a new process reads it instead of building,
and a snapshot published again (a re-index) is never answered from the old one."""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from lazyhippo.graph.passage import GraphParams
from lazyhippo.index import run_index
from lazyhippo.query import answer_question
from lazyhippo.query.loader import clear_cache, load_index
from lazyhippo.settings import Settings

SAMPLE = Path(__file__).resolve().parents[1] / "lazyhippo" / "sample_corpus"
NEW_DOC = ("The Quillon Lighthouse was designed by the engineer Marta Velloso in 1902. "
           "Marta Velloso later designed the Quillon harbour wall.")


def _cache_files(settings: Settings) -> list[Path]:
    return sorted((settings.home / "published" / ".index-cache").glob(f"{settings.namespace}-*.pickle"))


def test_a_new_process_reads_the_cached_index_and_a_new_snapshot_replaces_it(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SAMPLE, src)
    settings = Settings(home=tmp_path / "home", source=str(src))
    run_index(settings)
    clear_cache()
    built = load_index(settings)
    assert not built.stats.get("cached") and len(_cache_files(settings)) == 1

    clear_cache()  # as a new process: only the disk cache is left
    cached = load_index(settings)
    assert cached.stats["cached"]
    assert cached.chunks.ids == built.chunks.ids and cached.graph.node_ids == built.graph.node_ids
    for part in ("chunks", "entities", "facts", "communities"):  # vectors read back from the snapshot
        a, b = getattr(cached, part).vecs, getattr(built, part).vecs
        assert np.array_equal(a.q, b.q) and np.array_equal(a.scale, b.scale), part
    assert cached.chunks.texts == built.chunks.texts and cached.facts.texts == built.facts.texts
    assert (cached.graph.transition32 != built.graph.transition32).nnz == 0
    assert (cached.graph.columns32 != built.graph.columns32).nnz == 0
    assert np.array_equal(cached.graph.transition32.data, built.graph.transition32.data)
    assert {k: list(v) for k, v in cached.entities.name_index.items()} == \
           {k: list(v) for k, v in built.entities.name_index.items()}
    question = "Who succeeded Ada Fenwick as director of the Marlow Observatory?"
    clear_cache()
    from_cache = answer_question(settings, question, route="local").to_dict()
    assert from_cache["citations"] and load_index(settings).stats["cached"]
    clear_cache()
    other = load_index(settings, GraphParams(synonym_weight=0.25))  # a query option's graph: a file of its own
    assert not other.stats.get("cached") and len(_cache_files(settings)) == 2

    (src / "quillon.txt").write_text(NEW_DOC)
    run_index(settings)  # publishes a new snapshot
    clear_cache()
    fresh = load_index(settings)
    assert not fresh.stats.get("cached") and len(fresh.chunks.ids) > len(built.chunks.ids)
    assert len(_cache_files(settings)) == 1  # the old snapshot's caches are gone
    answer = answer_question(settings, "Who designed the Quillon Lighthouse?", route="local").to_dict()
    assert "Quillon" in " ".join(c["title"] for c in answer["citations"] + answer["closest"])


def test_an_unreadable_cache_is_built_again(tmp_path):
    settings = Settings(home=tmp_path / "home", source=str(SAMPLE))
    run_index(settings)
    clear_cache()
    n_chunks = load_index(settings).n_chunks
    (cache,) = _cache_files(settings)
    cache.write_bytes(cache.read_bytes()[:1000])  # truncated
    clear_cache()
    idx = load_index(settings)
    assert not idx.stats.get("cached") and idx.n_chunks == n_chunks
    clear_cache()
    assert load_index(settings).stats["cached"]  # written again whole


def test_other_graph_parameters_on_a_loaded_index_rebuild_the_graph_only(tmp_path):
    settings = Settings(home=tmp_path / "home", source=str(SAMPLE))
    run_index(settings)
    clear_cache()
    base = load_index(settings)
    other = load_index(settings, GraphParams(synonym_weight=0.25))
    assert other.chunks is base.chunks and other.graph is not base.graph


def test_the_cache_keeps_vectors_as_int8_and_one_copy_of_the_graph_structure(tmp_path):
    """Vectors stay in the warehouse's int8 form (a quarter of float32) and are made float32 only where read, to
    the same values the warehouse gives; the adjacency, the transition and its column form share one structure."""
    import duckdb

    from lazyhippo.stores.warehouse import read_vectors, snapshot_path

    settings = Settings(home=tmp_path / "home", source=str(SAMPLE))
    run_index(settings)
    clear_cache()
    load_index(settings)
    clear_cache()
    idx = load_index(settings)
    assert idx.stats["cached"]
    for vecs in (idx.chunks.vecs, idx.entities.vecs, idx.facts.vecs):
        assert vecs.q.dtype == np.int8 and vecs.scale.dtype == np.float32
    with duckdb.connect(str(snapshot_path(settings)), read_only=True) as con:
        ids, stored = read_vectors(con, settings.namespace, "entity")
    rows = [idx.entities.pos[e] for e in ids]
    assert np.array_equal(idx.entities.vecs[rows], stored)
    q = stored[0]
    assert np.allclose(idx.entities.vecs @ q, idx.entities.vecs.dense() @ q, atol=1e-5)
    g = idx.graph
    assert g.transition32.indices is g.adjacency.indices and g.columns32.indices is g.adjacency.indices
    assert (g.columns32 != g.transition32.tocsc()).nnz == 0  # the column form is still the transition's


def test_the_cache_file_leaves_out_what_the_snapshot_stores_and_the_transition(tmp_path):
    """Vectors and texts are the snapshot's rows and the transition follows from the adjacency: the file holds
    neither, and a load reads or derives them again (a snapshot that lacks a row of the file rebuilds)."""
    import duckdb

    from lazyhippo.query.loader import _unpickled
    from lazyhippo.stores.warehouse import snapshot_path

    settings = Settings(home=tmp_path / "home", source=str(SAMPLE))
    run_index(settings)
    clear_cache()
    built = load_index(settings)
    (cache,) = _cache_files(settings)
    slim = _unpickled(cache)
    assert slim.chunks.vecs is None and slim.entities.vecs is None and slim.facts.vecs is None
    assert slim.chunks.texts is None and slim.facts.texts is None
    assert slim.graph.transition32 is None and slim.graph.columns32 is None
    # no matrix twice: the facts by entity are the transpose of the entities by fact, the passages' community
    # coverage a product of the mentions; and the graph's node ids and positions are the parts' own
    assert slim.facts.by_entity is None and slim.communities.coverage is None
    assert slim.graph.node_ids.entities is slim.entities.ids and slim.graph.node_pos.chunks is slim.chunks.pos
    assert slim.chunks.ids == built.chunks.ids and slim.graph.adjacency.nnz == built.graph.adjacency.nnz
    clear_cache()
    cached = load_index(settings)
    assert cached.stats["cached"] and (cached.facts.by_entity != built.facts.by_entity).nnz == 0
    assert np.array_equal(cached.communities.coverage, built.communities.coverage)
    assert dict(cached.graph.node_pos) == {**built.entities.pos, **{c: built.n_entities + i for i, c in
                                                                     enumerate(built.chunks.ids)}}
    assert list(cached.graph.node_ids) == built.entities.ids + built.chunks.ids
    whole = pickle.dumps(replace(built, graph=replace(built.graph, matvec32=None)), protocol=5)
    assert cache.stat().st_size < len(whole) - sum(len(t) for t in built.chunks.texts + built.facts.texts)

    snapshot = snapshot_path(settings)
    stat = snapshot.stat()
    with duckdb.connect(str(snapshot)) as con:  # the snapshot loses a fact the cache names
        con.execute("DELETE FROM facts WHERE fact_id = ?", [built.facts.ids[0]])
    os.utime(snapshot, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    clear_cache()
    assert not load_index(settings).stats.get("cached")


def test_the_walks_transition_is_transition_matrix_to_the_bit():
    """The transition derived from the adjacency's arrays equals `transition_matrix` in float32, by rows and by
    columns, on an asymmetric matrix too."""
    import scipy.sparse as sp

    from lazyhippo.graph.ppr import transition_matrix
    from lazyhippo.query.loader import _transitions

    a = sp.random(200, 200, density=0.05, format="lil", random_state=3)
    a[5, :] = 0  # a dangling node
    a = a.tocsr()
    a.data[:] = np.random.default_rng(0).random(a.nnz) * 7 + 0.1
    m, dangling = transition_matrix(a)
    rows, cols, degree = _transitions(a)
    expected = m.astype(np.float32)
    for got, want in ((rows, expected), (cols, expected.tocsc())):
        assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        assert np.array_equal(got.data, want.data)
    assert np.array_equal(degree <= 0, dangling)
