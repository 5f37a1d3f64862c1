"""The query index build's transient memory: its largest arrays (the graph's entries, BM25's token pairs) are
built in place, not by concatenating and widening copies, with the very same results."""

import tracemalloc

import numpy as np
import scipy.sparse as sp

from lazyhippo.graph.passage import EntityEdges, GraphParams, passage_adjacency
from lazyhippo.query.lexical import FlatBM25


def _peak(fn):
    """fn's result and the most memory it held at once beyond what was held before it, by tracemalloc (which
    numpy's allocations report to)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def _reference_adjacency(params, n_e, n_c, rel, syn, m, is_title):
    """The adjacency as concatenated pieces, each edge group both ways, summed by scipy: what the build must
    give bit for bit."""
    def both(i, j, w):
        return np.concatenate([i, j]), np.concatenate([j, i]), np.concatenate([w, w])

    keep = (rel.source >= 0) & (rel.target >= 0) & (rel.source != rel.target)
    missing = np.isnan(rel.weight)
    keep &= np.where(missing, 1.0, rel.weight) >= params.relation_min_weight
    weight = np.where(missing | (rel.weight == 0), 1.0, rel.weight)
    r = both(rel.source[keep], rel.target[keep], params.relation_weight * np.minimum(weight[keep], params.relation_cap))
    keep = (syn.source >= 0) & (syn.target >= 0) & (syn.source != syn.target) & (syn.weight >= params.synonym_min_score)
    s = both(syn.source[keep], syn.target[keep], params.synonym_weight * syn.weight[keep])
    mw = params.mention_weight * np.log1p(m.data) + params.title_mention_weight * is_title
    rows = np.concatenate([r[0], s[0], m.row + n_e, m.col]).astype(np.int64)
    cols = np.concatenate([r[1], s[1], m.col, m.row + n_e]).astype(np.int64)
    vals = np.concatenate([r[2], s[2], mw, mw]).astype(np.float64)
    a = sp.csr_matrix((vals, (rows, cols)), shape=(n_e + n_c, n_e + n_c))
    a.sum_duplicates()
    return a


def test_passage_adjacency_is_built_without_copies_of_its_entries(monkeypatch):
    """Placed into the CSR arrays a block at a time (here 997 entries, so blocks end inside rows and groups), the
    matrix is scipy's sum of the COO entries, bit for bit."""
    from lazyhippo.graph import passage

    monkeypatch.setattr(passage, "_PLACE_BLOCK", 997)
    rng = np.random.default_rng(0)
    n_e, n_c, n_r = 30_000, 10_000, 300_000
    rel = EntityEdges(rng.integers(-1, n_e, n_r).astype(np.int32), rng.integers(0, n_e, n_r).astype(np.int32),
                      np.where(rng.random(n_r) < 0.1, np.nan, rng.random(n_r) * 3))  # some without a weight
    syn = EntityEdges(rng.integers(0, n_e, 20_000), rng.integers(0, n_e, 20_000), 0.85 + 0.15 * rng.random(20_000))
    m = sp.coo_matrix((rng.integers(1, 4, 60_000).astype(np.float32),
                       (rng.integers(0, n_c, 60_000), rng.integers(0, n_e, 60_000))), shape=(n_c, n_e))
    m.sum_duplicates()
    is_title = rng.random(m.nnz) < 0.05
    params = GraphParams()
    a, peak = _peak(lambda: passage_adjacency(params, n_e, n_c, [""] * n_e, rel, syn, m, is_title))
    ref = _reference_adjacency(params, n_e, n_c, rel, syn, m, is_title)
    for part in ("indptr", "indices", "data"):
        assert getattr(a, part).tobytes() == getattr(ref, part).tobytes()
    # concatenated pieces widened to int64 took 5.6 times the finished matrix; as COO beside the CSR, 2.3
    assert peak < 2 * (a.data.nbytes + a.indices.nbytes + a.indptr.nbytes)


def test_bm25_columns_are_counted_by_blocks_of_texts():
    """Each token's texts and counts, counted a block of texts at a time, are np.unique's of every occurrence's
    (token, text) key, in the build's types."""
    rng = np.random.default_rng(1)
    n_docs, n_vocab = 20_000, 5000
    lengths = rng.integers(0, 200, n_docs)  # some texts without a token
    flat = rng.integers(0, n_vocab, int(lengths.sum())).astype(np.int32)
    bm25 = FlatBM25()
    scores, peak = _peak(lambda: bm25.build_index_from_ids(list(range(n_vocab)), (flat, lengths)))
    keys, counts = np.unique(flat.astype(np.int64) * n_docs + np.repeat(np.arange(n_docs), lengths),
                             return_counts=True)
    assert scores["indices"].tobytes() == (keys % n_docs).astype(np.int32).tobytes()
    indptr = np.concatenate([[0], np.cumsum(np.bincount(keys // n_docs, minlength=n_vocab))])
    assert scores["indptr"].tobytes() == indptr.tobytes()
    assert bm25.counts.tobytes() == counts.astype(np.uint8).tobytes()
    # the sorted int64 keys of all occurrences, with their distinct keys, places and counts, held 7.2 times the
    # (int32) token ids; rows of the texts' distinct pairs beside their columns, 3.1
    assert peak < 4 * flat.nbytes


def test_bm25_counts_by_blocks_are_the_whole_matrix_counts(monkeypatch):
    """Counted a block of distinct pairs at a time (here 37, so every block boundary falls inside some token's
    column), the matrix is the one counted at once, and scores the same, bit for bit."""
    from lazyhippo.query import lexical

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(300)] + ["Ærø", "the"]
    docs = [" ".join(rng.choice(words, rng.integers(0, 50))) for _ in range(300)] + ["", "w1 w1 w1"]
    whole = lexical.Lexical.build(docs)
    monkeypatch.setattr(lexical, "_BLOCK", 37)
    blocked = lexical.Lexical.build(docs)
    assert len(whole.bm25.counts) > 37 * 100
    for part in ("indices", "indptr"):
        assert np.asarray(blocked.bm25.scores[part]).tobytes() == np.asarray(whole.bm25.scores[part]).tobytes()
    assert blocked.bm25.counts.tobytes() == whole.bm25.counts.tobytes()
    assert blocked.scores(["w1", "the", "w7"]).tobytes() == whole.scores(["w1", "the", "w7"]).tobytes()


def _symmetric(n: int, m: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, n, m), rng.integers(0, n, m)
    w = rng.choice(np.log1p(np.arange(1, 300)), m)
    a = sp.csr_matrix((np.concatenate([w, w]), (np.concatenate([i, j]), np.concatenate([j, i]))), shape=(n, n))
    a.sum_duplicates()
    return a


def test_the_cached_triangle_is_made_without_rebuilding_the_matrix(monkeypatch):
    """Made a block of rows at a time (here 131,072 entries of 2M, the indices packed by 65,536), the triangle
    gives the matrix back bit for bit."""
    from lazyhippo.query import loader
    from lazyhippo.query.packing import Ascending

    monkeypatch.setattr(loader, "_TRIANGLE_BLOCK", 1 << 17)
    monkeypatch.setattr(Ascending, "BLOCK", 1 << 16)
    a = _symmetric(200_000, 1_000_000, 4)
    tri, peak = _peak(lambda: loader._Triangle.of(a))
    b = tri.matrix()
    for part in ("indptr", "indices", "data"):
        assert getattr(a, part).tobytes() == getattr(b, part).tobytes()
    # the whole matrix rebuilt beside it to check it took 3.9 times the matrix; its column form with the rows and
    # the masks, 1.5; the column form freed before the rows are made, 1.15; by blocks of rows, 0.56
    assert peak < 0.6 * (a.data.nbytes + a.indices.nbytes + a.indptr.nbytes)


def test_sorted_indices_are_packed_by_blocks(monkeypatch):
    """Packed a block at a time (here 997 indices, so blocks end inside rows), the indices pack as at once, in a
    fraction of the int64 differences of them all."""
    from lazyhippo.query.packing import Ascending

    a = _symmetric(50_000, 1_500_000, 6)
    monkeypatch.setattr(Ascending, "BLOCK", 1 << 16)
    whole, peak = _peak(lambda: Ascending.of(a.indices, a.indptr))
    assert isinstance(whole, Ascending) and np.array_equal(whole.array(a.indptr), a.indices)
    assert peak < 0.7 * a.indices.nbytes  # int64 differences of them all: 6 times
    monkeypatch.setattr(Ascending, "BLOCK", 997)
    blocked = Ascending.of(a.indices, a.indptr)
    for part in ("low", "at", "whole"):
        x, y = getattr(whole, part), getattr(blocked, part)
        assert x.dtype == y.dtype and np.array_equal(x, y), part


def test_community_members_are_read_as_entity_positions_not_id_tuples(tmp_path):
    """Each community's members at every level (an entity is in its finest community and their ancestors), by
    name within one, as positions among the entities ordered by id; read as integer columns: as Python tuples of
    two id strings the pairs took over 150 bytes each, as every (community, entity) pair at once beside the
    result 33."""
    import pyarrow as pa

    from lazyhippo.query.loader import _members
    from lazyhippo.settings import Settings
    from lazyhippo.stores.warehouse import connect, replace_rows

    rng = np.random.default_rng(2)
    n, ns = 6000, "t"
    ids = [f"entity-{i:05d}" for i in rng.permutation(n)]  # stored out of id order
    names = [f"name {rng.integers(10**6)}" for _ in range(n)]
    finest = [f"k2-{i % 60:02d}" for i in range(n)]
    parent = {**{f"k2-{j:02d}": f"k1-{j % 10}" for j in range(60)}, **{f"k1-{j}": f"k0-{j % 2}" for j in range(10)}}
    levels = {c: int(c[1]) for c in [*parent, "k0-0", "k0-1"]}
    summarized = sorted(levels) + ["k9-empty"]  # a summary whose community has no members

    def table(rows):
        return pa.Table.from_pylist([{"namespace": ns, **r} for r in rows])

    with connect(Settings(home=tmp_path / "home"), read_only=False) as con:
        replace_rows(con, "entities", ns, table([{"entity_id": e, "name": m, "norm_name": m, "type": "THING"}
                                                 for e, m in zip(ids, names)]))
        replace_rows(con, "entity_scores", ns, table([{"entity_id": e, "community_id": c, "pagerank": 0.0}
                                                      for e, c in zip(ids, finest)]))
        replace_rows(con, "communities", ns, table([{"community_id": c, "level": lv, "size": 1, "modularity": 0.0, "parent_id": parent.get(c)}
                                                    for c, lv in levels.items()]))
        replace_rows(con, "community_summaries", ns, table([{"community_id": c, "title": c, "summary": "", "hub_entities": []}
                                                            for c in reversed(summarized)]))
        members, peak = _peak(lambda: _members(con, {"ns": ns}, len(summarized)))

    position = {e: i for i, e in enumerate(sorted(ids))}
    expected = {c: [] for c in summarized}
    for e, c in zip(ids, finest):
        while c is not None:
            expected[c].append(e)
            c = parent.get(c)
    by_name = dict(zip(ids, names))
    for c, got in zip(summarized, members):
        want = sorted(expected[c], key=lambda e: (by_name[e], position[e]))
        assert got.tolist() == [position[e] for e in want], c
    pairs = 3 * n
    assert sum(len(m) for m in members) == pairs and len(members[-1]) == 0
    assert peak < 25 * pairs  # the result's 8 bytes a pair, each entity's finest community and rank


def test_bm25_holds_counts_not_scores():
    """A BM25 index holds a byte of term count and four of text position an entry, and its vocabulary packed: the
    float32 score of every entry, a set of every token id and a dict of the tokens took 16 to 20 bytes an entry
    of the 10,000-document home's indexes, and a query scores its tokens' columns only."""
    import sys

    from lazyhippo.query.lexical import Lexical

    rng = np.random.default_rng(5)
    words = [f"token{i}" for i in range(20_000)]
    docs = [" ".join(rng.choice(words, rng.integers(5, 40))) for _ in range(5000)]
    lex = Lexical.build(docs)
    bm25, entries = lex.bm25, len(lex.bm25.counts)
    held = [*vars(bm25).values(), *bm25.scores.values()]
    assert not any(isinstance(v, np.ndarray) and len(v) == entries and v.dtype.kind == "f" for v in held)
    assert not hasattr(bm25, "unique_token_ids_set")
    arrays = sum(v.nbytes for v in held if isinstance(v, np.ndarray))
    vocab = sum(sys.getsizeof(x) for x in (lex.vocab.packed, lex.vocab.ends, lex.vocab.ids, lex.vocab.crcs))
    assert arrays < 5 * entries + 16 * len(lex.vocab) + 4 * lex.size and vocab < 24 * len(lex.vocab)
    scores, peak = _peak(lambda: lex.scores(["token1", "token2"]))
    assert peak < 4 * entries  # the score of every entry is never made


def test_facts_and_vectors_read_by_batches_are_the_index_read_at_once(tmp_path, monkeypatch):
    """The facts' table, the vectors and the graph's edge tables go from DuckDB a batch at a time (here a few rows,
    so facts, their entity lists, vectors and edges span many batches) into the very arrays one batch gives."""
    from pathlib import Path

    from lazyhippo.index import run_index
    from lazyhippo.query import loader
    from lazyhippo.settings import Settings
    from lazyhippo.stores.warehouse import connect

    settings = Settings(home=tmp_path / "home", source=str(Path(loader.__file__).parents[1] / "sample_corpus"))
    run_index(settings)

    def built():
        with connect(settings, read_only=True) as con:
            return loader.build_index(con, settings.namespace, "db", GraphParams())

    whole = built()
    monkeypatch.setattr(loader, "_BATCH_ROWS", 3)
    monkeypatch.setattr(loader, "_VECTOR_BATCH_ROWS", 5)
    monkeypatch.setattr(loader, "_EDGE_BATCH_ROWS", 7)
    batched = built()
    assert whole.graph.edges > 4 * 7 * 2
    for a, b in ((whole.graph.adjacency_matrix(), batched.graph.adjacency_matrix()),
                 (whole.graph.columns32, batched.graph.columns32)):
        for part in ("indptr", "indices", "data"):
            assert getattr(a, part).tobytes() == getattr(b, part).tobytes()
    assert len(whole.facts.ids) > 3 * 5 and whole.facts.entities.nnz > len(whole.facts.ids)
    assert whole.facts.ids.data.tobytes() == batched.facts.ids.data.tobytes()
    assert whole.facts.ids.offsets.tobytes() == batched.facts.ids.offsets.tobytes()
    assert list(whole.facts.texts) == list(batched.facts.texts)
    for part in ("row", "start", "length"):
        assert getattr(whole.facts.texts, part).tobytes() == getattr(batched.facts.texts, part).tobytes()
    for a, b in ((whole.facts.chunk, batched.facts.chunk), (whole.facts.vecs.q, batched.facts.vecs.q),
                 (whole.entities.vecs.q, batched.entities.vecs.q), (whole.chunks.vecs.q, batched.chunks.vecs.q),
                 (whole.entities.vecs.scale, batched.entities.vecs.scale)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    for part in ("indptr", "indices", "data"):
        assert getattr(whole.facts.entities, part).tobytes() == getattr(batched.facts.entities, part).tobytes()
    a, b = whole.facts.lexical.bm25, batched.facts.lexical.bm25
    assert a.counts.tobytes() == b.counts.tobytes() and a.lengths.tobytes() == b.lengths.tobytes()
    assert a.scores["indices"].tobytes() == b.scores["indices"].tobytes()


def test_spans_read_each_text_from_its_passage_or_whole_when_it_is_not_there():
    from lazyhippo.query.packing import Spans, Texts

    passages = Texts.of_bytes([s.encode() for s in ("Zoë Ä. Straße über Köln. 東京は大きい。", "Plain text. Again.")])
    rows = np.array([0, 0, 1, 0, 1, 0])
    texts = ["Straße über Köln.", "東京は大きい。", "Again.", "not in its passage", None, "Zoë Ä."]
    start = np.array([passages[r].find(t) if t else -1 for r, t in zip(rows.tolist(), texts)])
    length = np.array([len(t or "") for t in texts])
    given = [None if s >= 0 else t for s, t in zip(start.tolist(), texts)]  # a placed text is not stored
    parts = [Spans.placed(passages, rows[:3], start[:3], length[:3], given[:3]),
             Spans.placed(passages, rows[3:], start[3:], length[3:], given[3:])]
    spans = Spans.joined(parts)
    assert list(spans) == [*texts[:4], "", texts[5]] and spans[-1] == "Zoë Ä." and spans[1:3] == texts[1:3]
    # character offsets of the `str`, not bytes of its UTF-8; the texts not placed held whole, alone
    assert spans.start.tolist()[:2] == [7, 25] and spans.length.tolist()[3:5] == [-1, -1]
    assert list(spans.whole) == [texts[3], ""]
    assert list(Spans.joined([parts[1], parts[0]])) == [*texts[3:4], "", texts[5], *texts[:3]]


def test_id_maps_are_the_packed_ids_found_by_binary_search():
    """Id -> row over packed ids is the dict of them (the last row of an id given twice), ascending or not, beyond
    Latin-1 too, in a fraction of the dict's bytes; (document, position) -> row likewise."""
    import sys

    from lazyhippo.query.packing import DocRows, Rows, Texts

    ids = ["b", "a", "é", "ab", "€", "a", "", "z𝔸", "aa"]
    rows = Rows.of(Texts.of_bytes([s.encode() for s in ids]))
    assert rows.order is not None and dict(rows) == dict(zip(ids, range(len(ids))))
    assert all(rows[k] == v for k, v in dict(zip(ids, range(len(ids)))).items())
    assert all(rows.get(k) is None for k in ("c", "b\0", "ä", " ", "zz"))
    ascending = [f"e{i:06d}" for i in range(20_000)]
    packed = Texts.of_bytes([s.encode() for s in ascending])
    rows = Rows.of(packed)
    assert rows.order is None and rows["e012345"] == 12345 and "e1" not in rows
    as_dict = dict(zip(ascending, range(len(ascending))))
    assert packed.data.nbytes + packed.offsets.nbytes < (sys.getsizeof(as_dict) + sum(map(sys.getsizeof, as_dict))) / 4
    docs = ["d1", "d1", "d1", "d2", "d3", "d3"]
    where = DocRows.of(docs, np.array([0, 1, 1, 0, 2, 5]))
    assert dict(where) == {("d1", 0): 0, ("d1", 1): 2, ("d2", 0): 3, ("d3", 2): 4, ("d3", 5): 5}
    assert all(where.get(k) is None for k in (("d1", 2), ("d0", 0), ("d3", 3), ("d4", 0)))
    assert DocRows.of(["d2", "d1"], np.array([0, 0])) is None and DocRows.of(docs, np.array([0, 2, 1, 0, 0, 0])) is None


def test_key_rows_are_the_dict_of_groups_found_by_prefix_and_bisection():
    """norm_key -> rows held packed is the dict of each key's rows in row order, a key and its longer or shorter
    neighbours told apart, beyond Latin-1 too, in a fraction of the dict's bytes."""
    import sys

    from lazyhippo.graph.names import norm_key
    from lazyhippo.query.loader import _index_of

    names = ["University of Oslo", "university of bergen", "", "Oslo", "university", "university of oslo",
             "Ōsaka", "universit", "universityy", "z𝔸", "Oslo"]
    index = _index_of(names)
    expected: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if norm_key(name):
            expected.setdefault(norm_key(name), []).append(i)
    assert sorted(index) == sorted(expected) and {k: v.tolist() for k, v in index.items()} == expected
    assert all(k in index for k in expected)
    assert all(index.get(k) is None and k not in index
               for k in ("", "universi", "university of", "university of osl", "university\0", "zz", 3, "oslo "))
    many = [f"university of place {i}" for i in range(20_000)]
    index = _index_of(many)
    assert index["university of place 12345"].tolist() == [12345] and "university of place" not in index
    as_dict = {k: np.array([i]) for i, k in enumerate(many)}
    held = sum(a.nbytes for a in (index.keys_.data, index.keys_.offsets, index.hashes, index.flat, index.offsets))
    assert held < (sys.getsizeof(as_dict) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in as_dict.items())) / 4


def test_texts_read_in_the_tables_order_land_at_their_keys_rows(monkeypatch):
    """Passages are sorted without their texts, which are read afterwards in any order, a few rows at a time,
    straight into one buffer: each text at its key's row, runs of rows in order copied at once, a key the
    ordering does not hold left out."""
    import duckdb

    from lazyhippo.query import loader
    from lazyhippo.query.packing import Texts

    keys = [f"c{i}" for i in range(12)]
    texts = {k: ("Zürich " * (i % 4) + "東京" * (i % 3) + k) for i, k in enumerate(keys)}
    stored = [*keys[5:9], *reversed(keys[:5]), "gone", *keys[9:]]  # a run in order, one reversed, an unknown key
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k VARCHAR, x VARCHAR, o INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(k, texts.get(k, "never read"), i) for i, k in enumerate(stored)])
    monkeypatch.setattr(loader, "_TEXT_BATCH_ROWS", 4)
    packed = Texts.of_bytes([k.encode() for k in keys])
    placed = loader._placed_texts(con, "SELECT k, x FROM t ORDER BY o", {}, packed,
                                  [len(texts[k].encode()) for k in keys])
    assert list(placed) == [texts[k] for k in keys]
