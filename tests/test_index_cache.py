"""The built index of a published snapshot is kept on disk beside it: a new process reads it instead of building,
and a snapshot published again (a re-index) is never answered from the old one."""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

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
    assert cached.chunks.texts == built.chunks.texts and list(cached.facts.texts) == list(built.facts.texts)
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


def test_a_cache_of_the_older_layout_is_built_again(tmp_path):
    """A file of the layout before compression (header of offsets, arrays raw, the pickles as they are), which
    the older reader read whole, is read as absent and written again in the current layout."""
    import struct

    from lazyhippo.query.loader import _MAGIC, _PARTS, _unpickled

    settings = Settings(home=tmp_path / "home", source=str(SAMPLE))
    run_index(settings)
    clear_cache()
    load_index(settings)
    (cache,) = _cache_files(settings)
    slim = _unpickled(cache)
    pickles = b"".join(pickle.dumps(part, protocol=5)  # arrays in band: no out-of-band buffer to list
                       for part in (replace(slim, **dict.fromkeys(_PARTS)), *(getattr(slim, n) for n in _PARTS)))
    cache.write_bytes(struct.pack("<QQQ", 24, len(pickles), 0) + pickles)
    clear_cache()
    assert not load_index(settings).stats.get("cached")
    assert cache.read_bytes()[:len(_MAGIC)] == _MAGIC
    clear_cache()
    assert load_index(settings).stats["cached"]


def test_the_cache_compresses_the_arrays_compression_shrinks_and_maps_the_others(tmp_path):
    """Each array is stored zstd-compressed when that saves a tenth of it or more, else raw at an aligned offset
    (mapped at load); the pickles are compressed too; a cached load's arrays are writable like built ones."""
    import pyarrow as pa

    from lazyhippo.query.loader import _ALIGN, _HEADER, _PACKED_AT_MOST

    settings, built, cached = _built_and_cached(tmp_path)
    (cache,) = _cache_files(settings)
    data = cache.read_bytes()
    _, at, n_stream, n_buffers = _HEADER.unpack_from(data)
    spans = np.frombuffer(data, dtype=np.uint64, count=3 * n_buffers, offset=at + n_stream).reshape(-1, 3)
    codec = pa.Codec("zstd", compression_level=3)
    assert 0 < (spans[:, 2] > 0).sum() < n_buffers
    for o, n, packed in spans.tolist():
        if packed:
            assert packed <= _PACKED_AT_MOST * n
            assert codec.decompress(data[o:o + packed], decompressed_size=n, asbytes=True) != data[o:o + n]
        elif n:
            assert o % _ALIGN == 0 and len(codec.compress(data[o:o + n], asbytes=True)) > _PACKED_AT_MOST * n
    stream = pa.CompressedInputStream(pa.BufferReader(data[at:at + n_stream]), "zstd").read()
    assert len(stream) > n_stream
    assert len(data) < len(stream) + spans[:, 1].sum()
    assert cached.graph.adjacency.indptr.flags.writeable and cached.mentions.counts.indices.flags.writeable


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
    assert g.transition32.indices is g.columns32.indices and g.transition32.indptr is g.columns32.indptr
    assert (g.columns32 != g.transition32.tocsc()).nnz == 0  # the column form is still the transition's


def _built_and_cached(tmp_path) -> tuple:
    """The sample corpus's settings and index, as built and as read from the cache the build wrote."""
    settings = Settings(home=tmp_path / "home", source=str(SAMPLE))
    run_index(settings)
    clear_cache()
    built = load_index(settings)
    clear_cache()
    cached = load_index(settings)
    assert cached.stats["cached"] and not built.stats.get("cached")
    return settings, built, cached


def test_an_index_holds_the_walks_transitions_not_the_float64_adjacency_nor_a_dense_coverage(tmp_path):
    """Built or read from the cache, the graph holds the float64 adjacency only as its triangle (no per-edge array
    of float64) and the passages' community coverage sparse; both still give the matrices they stood for."""
    import scipy.sparse as sp

    from lazyhippo.query.loader import _Triangle

    settings, built, cached = _built_and_cached(tmp_path)
    for idx in (built, cached):
        g = idx.graph
        per_edge = [v for part in vars(g).values() for v in (vars(part).values() if sp.issparse(part) else [part])
                    if isinstance(v, np.ndarray) and len(v) >= g.edges]
        assert isinstance(g.adjacency, _Triangle) and not [v for v in per_edge if v.dtype == np.float64]
        a = g.adjacency_matrix()
        assert a.nnz == g.edges and np.array_equal(np.asarray(a.sum(axis=1)).ravel(), g.degree)
        coverage = idx.communities.coverage
        assert sp.issparse(coverage) and coverage.shape == (idx.n_chunks, len(idx.communities.ids))
        members = np.zeros((idx.n_entities, coverage.shape[1]), dtype=np.float32)
        for c, m in enumerate(idx.communities.members):
            members[m, c] = 1
        assert np.array_equal(coverage.toarray(), (idx.mentions.counts > 0).astype(np.float32).toarray() @ members)
    assert (cached.graph.adjacency_matrix() != built.graph.adjacency_matrix()).nnz == 0


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
    # the facts' texts as spans of the passages' texts, which the snapshot gives
    assert slim.chunks.texts is None and slim.facts.texts.within is None and not len(slim.facts.texts.whole)
    assert slim.graph.transition32 is None and slim.graph.columns32 is None
    # no matrix twice: the facts by entity are the transpose of the entities by fact, the passages' community
    # coverage a product of the mentions; and the graph's node ids and positions are the parts' own
    assert slim.facts.by_entity is None and slim.communities.coverage is None
    assert slim.graph.node_ids is None and slim.graph.node_pos is None
    # the id -> row maps are the packed ids themselves (and, for ids out of order, their order), no dict
    assert slim.chunks.pos.ids is slim.chunks.ids and slim.entities.pos.ids is slim.entities.ids
    assert slim.entities.pos.order is None and slim.chunks.doc_pos.doc_ids is slim.chunks.doc_ids
    # what a load derives again: degrees, the entities' document frequencies, the rows' projections
    assert slim.graph.degree is None
    assert slim.entities.df is None and slim.entities.near.head is None and slim.facts.near.head is None
    assert slim.chunks.ids == built.chunks.ids and slim.graph.adjacency.matrix().nnz == built.graph.edges
    clear_cache()
    cached = load_index(settings)
    assert cached.stats["cached"] and (cached.facts.by_entity != built.facts.by_entity).nnz == 0
    assert (cached.communities.coverage != built.communities.coverage).nnz == 0
    assert dict(cached.graph.node_pos) == {**built.entities.pos, **{c: built.n_entities + i for i, c in
                                                                     enumerate(built.chunks.ids)}}
    assert list(cached.graph.node_ids) == [*built.entities.ids, *built.chunks.ids]
    whole = pickle.dumps(replace(built, graph=replace(built.graph, matvec32=None)), protocol=5)
    assert cache.stat().st_size < len(whole) - sum(len(t) for t in [*built.chunks.texts, *built.facts.texts])

    snapshot = snapshot_path(settings)
    stat = snapshot.stat()
    # the snapshot loses a passage the cache names (whose text gives the passage's and its facts' texts)
    with duckdb.connect(str(snapshot)) as con:
        con.execute("DELETE FROM chunks WHERE chunk_id = ?", [built.chunks.ids[int(built.facts.chunk[0])]])
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


def _same(a, b, path: str = "index") -> None:
    """`a` and `b` equal part by part, arrays to the bit and of the same type, dicts in the same order."""
    import scipy.sparse as sp
    from dataclasses import fields, is_dataclass

    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif sp.issparse(a):
        assert type(a) is type(b), path
        for k in ("data", "indices", "indptr"):
            _same(getattr(a, k), getattr(b, k), f"{path}.{k}")
    elif is_dataclass(a):
        for f in fields(a):
            if f.name not in ("loaded_at", "load_seconds", "stats", "matvec32"):
                _same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)) and a and isinstance(a[0], np.ndarray):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif hasattr(a, "vocab_dict"):  # a BM25 index
        assert vars(a).keys() == vars(b).keys(), path
        for k in vars(a):
            _same(getattr(a, k), getattr(b, k), f"{path}.{k}")
    elif hasattr(a, "packed"):  # a Vocabulary
        assert a.packed == b.packed and a.ends == b.ends and a.ids == b.ids and a.crcs == b.crcs, path
    else:
        assert a == b, path


def test_a_cached_load_is_the_built_index_to_the_bit(tmp_path):
    """Everything a load derives again from the compact cache (the adjacency from its triangle, BM25 scores from
    term counts, the nearest-row projections from the vectors, id maps, degrees, document frequencies) is what
    building gives: every array to the bit, every map in the same order."""
    settings, built, cached = _built_and_cached(tmp_path)
    _same(built, cached)
    for lexical in (cached.lexical, cached.facts.lexical):
        assert lexical.vocab is lexical.bm25.vocab_dict  # the vocabulary held once
    # the fact ids and entity names packed (a query reads few of them), read as the warehouse's
    from lazyhippo.query.packing import Texts
    from lazyhippo.stores.warehouse import connect

    with connect(settings, read_only=True) as con:
        facts = [f for (f,) in con.execute("SELECT fact_id FROM facts ORDER BY fact_id").fetchall()]
        names = [n for (n,) in con.execute("SELECT name FROM entities ORDER BY entity_id").fetchall()]
    for idx in (built, cached):
        assert isinstance(idx.facts.ids, Texts) and isinstance(idx.entities.names, Texts)
        assert list(idx.facts.ids) == facts and list(idx.entities.names) == names


def test_the_adjacency_is_cached_as_a_triangle_and_rebuilt_to_the_bit():
    """A structurally symmetric matrix whose mirrored values may differ in the last bit (duplicate edges summed in
    another order), with an explicit zero: stored as its upper triangle with coded values in under a third of the
    CSR's bytes, and rebuilt with the same structure and bits."""
    import scipy.sparse as sp

    from lazyhippo.query.loader import _Triangle
    from lazyhippo.query.packing import Ascending

    rng = np.random.default_rng(5)
    n = 3000
    i, j = rng.integers(0, n, 40000), rng.integers(0, n, 40000)
    keep = i != j
    w = rng.choice(np.log1p(np.arange(1, 200)), len(i))[keep]  # few distinct weights, as mention and relation edges
    a = sp.csr_matrix((np.concatenate([w, w + 1e-13 * (rng.random(len(w)) < 0.01)]),
                       (np.concatenate([i[keep], j[keep]]), np.concatenate([j[keep], i[keep]]))), shape=(n, n))
    a.sum_duplicates()
    a.data[a.indices == 0] = 0.0  # explicit zeros stay
    assert (a != a.T).nnz > 0  # not symmetric to the bit
    tri = _Triangle.of(a)
    assert isinstance(tri, _Triangle) and isinstance(tri.offsets, Ascending) and len(tri.fixed_at) > 0
    stored = tri.indptr.nbytes + tri.values.nbytes + tri.codes.nbytes + tri.fixed_at.nbytes + tri.fixed.nbytes + \
        sum(x.nbytes for x in (tri.offsets.low, tri.offsets.at, tri.offsets.whole))
    assert stored < (a.data.nbytes + a.indices.nbytes + a.indptr.nbytes) / 3
    b = tri.matrix()
    _same(a, b, "adjacency")
    assert b.has_sorted_indices
    lower = sp.tril(a, -1).tocsr()  # not structurally symmetric: kept as it is
    assert _Triangle.of(lower) is lower


def test_sorted_indices_pack_into_uint16_differences():
    """Differences of 65536 and more (a row's first column, a long gap) are kept whole; whatever the blocks of
    the cumulative sum, the indices come back the same."""
    import scipy.sparse as sp

    from lazyhippo.query.packing import Ascending

    rng = np.random.default_rng(2)
    rows = [np.unique(rng.integers(0, 2_000_000, rng.integers(0, 200))) for _ in range(400)]
    a = sp.csr_matrix((np.ones(sum(map(len, rows))), np.concatenate(rows).astype(np.int32),
                       np.concatenate([[0], np.cumsum([len(r) for r in rows])])), shape=(400, 2_000_000))
    packed = Ascending.of(a.indices, a.indptr)
    assert isinstance(packed, Ascending) and 0 < len(packed.at) < a.nnz / 4
    assert packed.low.nbytes + packed.at.nbytes + packed.whole.nbytes < 0.75 * a.indices.nbytes
    for block in (Ascending.BLOCK, 997):
        with_block = Ascending(packed.low, packed.at, packed.whole, packed.dtype)
        object.__setattr__(with_block, "BLOCK", block)
        _same(a.indices, with_block.array(a.indptr), f"indices by {block}")
    shuffled = a.indices.copy()
    shuffled[a.indptr[1]:a.indptr[2]] = shuffled[a.indptr[1]:a.indptr[2]][::-1]
    assert Ascending.of(shuffled, a.indptr) is shuffled  # not ascending: kept as it is


def test_packed_texts_read_in_arrow_over_their_own_buffers():
    import pyarrow as pa

    from lazyhippo.query.packing import Texts

    strings = ["Zürich", "", "東京", "e-1"]
    packed = Texts.of_arrow([pa.chunked_array([pa.array(strings[:2]), pa.array(strings[2:])])])
    arrow = packed.arrow()
    assert arrow.to_pylist() == strings == list(packed)
    assert arrow.buffers()[2].address == packed.data.ctypes.data  # no copy of the bytes
    # 32-bit and 64-bit offsets, a slice past the first rows and a null (an empty text) read alike
    for kind in (pa.string(), pa.large_string()):
        sliced = pa.array(["x", *strings, None, "z"], type=kind).slice(1, 5)
        assert list(Texts.of_arrow([sliced])) == [*strings, ""]


def test_bm25_is_pickled_as_term_counts_and_scores_the_same():
    """The BM25 index pickles its term counts in uint8 and its indices in uint16 differences, not float32 scores
    and int32 indices, and unpickled scores every query as before, bit for bit."""
    from lazyhippo.query.lexical import Lexical

    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(3000)]
    docs = [" ".join(rng.choice(words, rng.integers(1, 80))) for _ in range(4000)] + ["", "w1 w1 w1 w1"]
    lex = Lexical.build(docs)
    data = pickle.dumps(lex, protocol=5)
    s = lex.bm25.scores
    assert len(data) < 0.5 * (4 * len(lex.bm25.counts) + s["indices"].nbytes + s["indptr"].nbytes) + 40 * len(lex.vocab)
    back = pickle.loads(data)
    _same(lex.bm25, back.bm25, "bm25")
    assert back.vocab is back.bm25.vocab_dict and back.size == lex.size
    for query in (["w1"], ["w3", "w7", "nothing"], ["w2999", "w1", "w10"]):
        assert np.array_equal(lex.scores(query), back.scores(query))


def test_bm25_vocabulary_is_the_token_map():
    """The packed vocabulary answers as the dict of tokens it is made from: every token's id (two of them with
    the same CRC-32), membership, length, its tokens, a missing token (one with a CRC-32 held), and the same after
    pickling."""
    from zlib import crc32

    from lazyhippo.query.lexical import Vocabulary

    assert crc32(b"plumless") == crc32(b"buckeroo")
    tokens = ["zeta", "", "Ærø", "a", "ab", "東京", "b", "aa", "w10", "w1", "plumless", "buckeroo"]
    vocab = {t: i for i, t in enumerate(tokens)}
    packed = Vocabulary.of(vocab)
    for v in (packed, pickle.loads(pickle.dumps(packed, protocol=5))):
        assert len(v) == len(vocab) and set(v) == set(vocab) and dict(v) == vocab
        assert all(v[t] == i and t in v and v.get(t) == i for t, i in vocab.items())
        for missing in ("w", "zz", "東", "aaa", "0"):
            assert missing not in v and v.get(missing) is None and v.get(missing, -1) == -1
        with pytest.raises(KeyError):
            v["w"]
    assert len(Vocabulary.of({})) == 0 and "a" not in Vocabulary.of({})
    assert "buckeroo" not in Vocabulary.of({"plumless": 0}) and Vocabulary.of({"plumless": 0})["plumless"] == 0
