"""Graph-wide stages recompute only what an update touched, and give what a full recompute gives."""

from __future__ import annotations

import shutil

import numpy as np

from lazyhippo.graph.algorithms import (
    Edges,
    KnnBasis,
    detect_communities,
    knn_edges,
    knn_stale_sources,
    merged_undirected,
    pagerank,
    weighted_igraph,
)
from lazyhippo.index import run_index, run_stage
from lazyhippo.settings import Settings
from lazyhippo.stages.communities import entity_graph
from lazyhippo.stages.incremental import FINGERPRINT_SQL, PARAMS, fingerprint, read_details, read_inputs, write_inputs
from lazyhippo.stages.lifecycle import delete_documents
from lazyhippo.stages.merge import record_merge
from lazyhippo.stores.graphs import EmbeddedGraphStore
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import connect, transaction
from tests.test_lifecycle import copy_corpus, doc_id_of, graph_difference, graph_snapshot


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def basis(items, edges, changed) -> KnnBasis:
    """The previous search as the warehouse gives it to an update (incremental.plan_knn, in SQL)."""
    lists = {i: (0, 1.0) for i in items}
    for e in edges:
        lists[e.source] = (lists[e.source][0] + 1, min(lists[e.source][1], e.score))
    return KnnBasis(lists, {e.source for e in edges if e.target in changed})


def as_rows(edges) -> list[tuple]:
    return sorted((e.source, e.target, e.rank, round(e.score, 5)) for e in edges)


def test_knn_searched_again_for_stale_sources_only_equals_a_full_search():
    rng = np.random.default_rng(7)
    # clustered vectors, so neighbour lists are dense above the cutoff and changes ripple into other lists
    centres = rng.normal(size=(12, 24))
    x = unit(centres[rng.integers(0, 12, 600)] + 0.35 * rng.normal(size=(600, 24)))
    ids = [f"e{i:04d}" for i in range(600)]
    top_k, cutoff = 6, 0.8
    before = knn_edges(ids, x, top_k, cutoff)

    gone = set(ids[10:20])
    changed = set(ids[100:105])
    vec = {i: v for i, v in zip(ids, x) if i not in gone}
    for i in changed:  # moved next to another item: enters lists that did not hold it
        vec[i] = unit((x[ids.index(i) + 300] + 0.01 * rng.normal(size=24))[None])[0]
    for n in range(8):  # new items near existing ones
        vec[f"e{n:04d}x"] = unit((x[200 + n] + 0.02 * rng.normal(size=24))[None])[0]
    new_ids = sorted(vec)
    new_x = np.stack([vec[i] for i in new_ids])
    moved = changed | gone | {i for i in new_ids if i.endswith("x")}
    stale = knn_stale_sources(new_ids, new_x, top_k, cutoff, moved, basis(ids, before, moved))
    assert 0 < len(stale) < len(new_ids) // 2, "a small change must leave most lists alone"
    kept = [e for e in before if e.source in set(new_ids) - {new_ids[i] for i in stale}]
    incremental = kept + knn_edges(new_ids, new_x, top_k, cutoff, stale)
    full = knn_edges(new_ids, new_x, top_k, cutoff)
    assert as_rows(incremental) == as_rows(full)
    # and the reason it works is not that nothing changed: old lists differ from new ones
    assert as_rows(before) != as_rows(full)


def connect_rows(settings: Settings, sql: str) -> list[tuple]:
    with connect(settings) as con:
        return sorted(con.execute(f"{sql} WHERE namespace = ?", [settings.namespace]).fetchall())


def knn_table(settings: Settings) -> list[tuple]:
    return connect_rows(settings, "SELECT source_id, target_id, rank, round(score, 5) FROM knn_edges")


def scores(settings: Settings) -> list[tuple]:
    return connect_rows(settings, "SELECT entity_id, community_id, pagerank FROM entity_scores")


def test_an_update_searches_few_entities_and_gives_the_edges_of_a_full_search(tmp_path):
    settings = Settings(home=tmp_path / "h", source=str(copy_corpus(tmp_path / "c")), knn_cutoff=0.5)
    first = run_index(settings)
    assert first["knn_edges"].searched == first["knn_edges"].entities  # nothing to start from
    again = run_index(settings)
    assert again["knn_edges"].searched == 0 and again["chunks"].rechunked_documents == 0  # unchanged: no work
    path = tmp_path / "c" / "tomas_reyes.txt"
    path.write_text(path.read_text() + "\nTomas Reyes later sailed with the Eastbridge Harbour Guild to Port Alder.\n")
    update = run_index(settings)
    assert update["chunks"].rechunked_documents == 1
    assert update["chunks"].tokens_total > again["chunks"].tokens_total  # the new sentence is in
    out = update["knn_edges"]
    assert 0 < out.searched < out.entities
    incremental = knn_table(settings)
    with connect(settings) as con:  # forget the recorded search: the next one is a full one
        con.execute("DELETE FROM stage_inputs WHERE namespace = ?", [settings.namespace])
        full = run_stage("knn_edges", settings, con, EmbeddedGraphStore())
    assert full.searched == full.entities
    assert incremental == knn_table(settings) and incremental


def test_an_update_above_the_exact_size_keeps_the_approximate_lists_it_cannot_change(tmp_path, monkeypatch):
    """The stage with the approximate index (its size lowered to the sample corpus): a full search builds the
    index from the stored vectors, an update searches only the stale lists, and the edges stay close to a
    full approximate search."""
    from lazyhippo.graph import algorithms

    built = []
    real = algorithms.approximate_index
    monkeypatch.setattr(algorithms, "KNN_EXACT_MAX", 10)
    monkeypatch.setattr(algorithms, "approximate_index", lambda v: built.append(len(v)) or real(v))
    settings = Settings(home=tmp_path / "h", source=str(copy_corpus(tmp_path / "c")), knn_cutoff=0.5)
    first = run_index(settings)["knn_edges"]
    assert built == [first.entities] and first.edges > 0
    path = tmp_path / "c" / "tomas_reyes.txt"
    path.write_text(path.read_text() + "\nTomas Reyes later sailed with the Eastbridge Harbour Guild to Port Alder.\n")
    update = run_index(settings)["knn_edges"]
    assert 0 < update.searched < update.entities
    incremental = knn_table(settings)
    with connect(settings) as con:
        con.execute("DELETE FROM stage_inputs WHERE namespace = ?", [settings.namespace])
        full = run_stage("knn_edges", settings, con, EmbeddedGraphStore())
    assert full.searched == full.entities and built[-1] == full.entities
    assert len(set(incremental) & set(knn_table(settings))) >= 0.95 * full.edges


def test_recorded_inputs_rewrite_only_the_rows_that_changed(tmp_path):
    """write_inputs replaces a stage's record by its differences: unchanged rows stay where they were (their
    rowid), changed and new ones are written, gone ones deleted; other stages and namespaces are untouched."""
    settings = Settings(home=tmp_path)
    rowids = "SELECT item_id, rowid FROM stage_inputs WHERE namespace = ? AND stage = ?"
    with connect(settings) as con:
        write_inputs(con, "ns", "knn_edges", {"a": "1", "b": "2", "c": "3", PARAMS: "10:0.6"})
        write_inputs(con, "ns", "chunks", {"a": "x"})
        write_inputs(con, "other", "knn_edges", {"a": "1"})
        before = dict(con.execute(rowids, ["ns", "knn_edges"]).fetchall())
        with transaction(con):
            write_inputs(con, "ns", "knn_edges", {"a": "1", "b": "9", "d": "4", PARAMS: "10:0.6"})
        after = dict(con.execute(rowids, ["ns", "knn_edges"]).fetchall())
        f = fingerprint
        assert read_inputs(con, "ns", "knn_edges") == {"a": f("1"), "b": f("9"), "d": f("4"), PARAMS: f("10:0.6")}
        assert after["a"] == before["a"] and after[PARAMS] == before[PARAMS] and after["b"] != before["b"]
        assert read_inputs(con, "ns", "chunks") == {"a": f("x")} and read_inputs(con, "other", "knn_edges") == {"a": f("1")}
        write_inputs(con, "ns", "knn_edges", {})
        assert read_inputs(con, "ns", "knn_edges") == {}
        with transaction(con):  # a detail is kept as given; changing it alone rewrites the row
            write_inputs(con, "ns", "entities", {"c1": ("h1", "e_a e_b"), "c2": ("h2", ""), PARAMS: "p"})
            write_inputs(con, "ns", "entities", {"c1": ("h1", "e_a"), "c2": ("h2", ""), PARAMS: "p"})
        assert read_details(con, "ns", "entities") == {"c1": "e_a", "c2": ""}
        assert read_inputs(con, "ns", "entities") == {"c1": f("h1"), "c2": f("h2"), PARAMS: f("p")}


def test_fingerprints_are_64_bit_integers_equal_in_python_and_sql(tmp_path):
    """stage_inputs and embeddings.text_hash hold 64-bit integers (hex text took four times the room): the
    first 64 bits of sha256, the same from Python and from SQL, and distinct for distinct texts."""
    texts = ["", "a", "Ada Fenwick", "model:123", "é" * 40]
    with connect(Settings(home=tmp_path)) as con:
        types = dict(con.execute("SELECT table_name || '.' || column_name, data_type FROM duckdb_columns() WHERE "
                                 "column_name IN ('fingerprint', 'text_hash')").fetchall())
        assert types == {"stage_inputs.fingerprint": "UBIGINT", "embeddings.text_hash": "UBIGINT"}
        sql = [con.execute(f"SELECT {FINGERPRINT_SQL.format('?')}", [t]).fetchone()[0] for t in texts]
    assert sql == [fingerprint(t) for t in texts] and len(set(sql)) == len(texts)


class SeedSpy(EmbeddedGraphStore):
    """The embedded store, keeping the starting partitions community detection was given."""

    initial = None

    def communities(self, namespace, node_ids, edges, algorithm, initial=None, resolutions=(1.0,)):
        self.initial = initial
        return super().communities(namespace, node_ids, edges, algorithm, initial, resolutions)


def test_communities_are_reused_when_the_graph_is_unchanged_and_refined_after_a_small_change(tmp_path):
    settings = Settings(home=tmp_path / "h", source=str(copy_corpus(tmp_path / "c")))
    first = run_index(settings)["communities"]
    assert not first.reused and not first.seeded
    before = scores(settings)
    again = run_index(settings)["communities"]
    assert again.reused and again.levels == first.levels and scores(settings) == before
    path = tmp_path / "c" / "tomas_reyes.txt"  # one new entity among ~150: the previous partition is a good start
    path.write_text(path.read_text() + "\nTomas Reyes once visited Quillmore.\n")
    spy = SeedSpy()
    out = run_index(settings, store=spy)
    # every level starts from its own previous partition, not only the finest
    assert len(spy.initial) == len(settings.community_resolutions) > 1 and all(spy.initial)
    assert out["entities"].entities > len(before)
    update = out["communities"]
    assert update.seeded and not update.reused
    after = scores(settings)
    with connect(settings) as con:
        nodes, edges = entity_graph(con, settings.namespace)
    assert [r[0] for r in after] == sorted(nodes)  # every entity has a community and a PageRank
    fresh = detect_communities(nodes, edges, settings.community_algorithm)
    assert update.modularity >= 0.97 * fresh.modularity
    pr = pagerank(nodes, edges)
    assert all(abs(p - pr[e]) < 1e-9 for e, _, p in after)  # PageRank is the whole current graph's



def test_the_igraph_graph_is_the_merged_graph():
    """weighted_igraph adds the merged pairs as one index array: the same edges, in the same order, the same
    weights as the pairs and sums of merged_undirected."""
    rng = np.random.default_rng(7)
    nodes = [f"e{i:04d}" for i in range(500)]
    pairs = rng.integers(0, len(nodes) + 20, size=(3000, 2))  # some ends unknown
    names = np.array(nodes + [f"x{i}" for i in range(20)], dtype=object)
    edges = Edges(names[pairs[:, 0]], names[pairs[:, 1]], rng.random(len(pairs)))
    g, merged = weighted_igraph(nodes, edges), merged_undirected(nodes, edges)
    assert g.vcount() == len(nodes) and not g.is_directed()
    assert g.get_edgelist() == [tuple(p) for p in merged.pairs.tolist()] and g.es["weight"] == merged.weights.tolist()
    assert weighted_igraph(nodes, []).ecount() == 0
    import pyarrow as pa  # entity_graph hands the ends over as DuckDB's Arrow columns: the same merged graph

    arrow = Edges(pa.chunked_array([list(edges.sources[:1000]), list(edges.sources[1000:])]),
                  pa.chunked_array([list(edges.targets)]), edges.weights)
    same = merged_undirected(nodes, arrow)
    assert np.array_equal(same.pairs, merged.pairs) and np.array_equal(same.weights, merged.weights)


def test_the_merged_graph_drops_self_loops_and_unknown_ends_and_sums_parallel_edges():
    rows = [("a", "b", 1.0), ("b", "a", 0.5), ("a", "a", 2.0), ("a", "x", 1.0), ("c", "b", 0.25)]
    for edges in (rows, Edges.of(rows)):
        merged = merged_undirected(["a", "b", "c"], edges)
        assert merged.pairs.tolist() == [[0, 1], [1, 2]] and merged.weights.tolist() == [1.5, 0.25]
    assert len(merged_undirected(["a"], [])) == 0


def test_knn_and_pagerank_are_the_same_bits_whatever_the_threads():
    """Two indexes of one corpus (a Celery worker and a laptop, or a run and its re-run) hold the same graph:
    faiss's BLAS scores and igraph's parallel PageRank change in their last digits with the thread count and
    from run to run, enough to swap near-tied hubs and so community titles and summaries."""
    import faiss
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(3)
    x = unit(rng.normal(size=(3000, 64)))
    ids = [f"e{i:05d}" for i in range(len(x))]
    threads = faiss.omp_get_max_threads()
    try:
        with threadpool_limits(1):
            faiss.omp_set_num_threads(1)
            one = knn_edges(ids, x, 10, 0.0)
    finally:
        faiss.omp_set_num_threads(threads)
    assert knn_edges(ids, x, 10, 0.0) == one
    pairs = rng.integers(0, len(ids), size=(20000, 2))
    edges = [(ids[a], ids[b], float(w)) for (a, b), w in zip(pairs, rng.random(len(pairs)))]
    first = pagerank(ids, edges)
    assert all(pagerank(ids, edges) == first for _ in range(3))
    assert abs(sum(first.values()) - 1.0) < 1e-12
    ref = weighted_igraph(ids, edges).pagerank(weights="weight", damping=0.85)  # the same PageRank as igraph's
    assert max(abs(first[i] - r) for i, r in zip(ids, ref)) < 1e-12


GRAPH_TABLES = ("entities", "relations", "mentions", "facts")
KEYS = {"entities": "entity_id", "relations": "relation_id", "mentions": "chunk_id, entity_id", "facts": "fact_id"}


def graph_tables(settings: Settings) -> dict[str, list[tuple]]:
    snap = graph_snapshot(settings)
    with connect(settings) as con:  # no key twice: a scoped rebuild that inserted a row again would show here
        for t in GRAPH_TABLES:
            assert con.execute(f"SELECT count(*) - count(DISTINCT ({KEYS[t]})) FROM {t} WHERE namespace = ?",
                               [settings.namespace]).fetchone()[0] == 0, t
    return {t: snap[t] for t in GRAPH_TABLES}


def test_an_update_rebuilds_the_graph_tables_of_its_entities_only_and_gives_a_fresh_index(tmp_path):
    """An edited, a new and a deleted document: entities, relations, mentions and facts equal, row for row,
    those of a fresh index of the final corpus (nothing dropped, nothing twice), though the update rebuilt
    only the rows of the entities its documents name."""
    corpus = copy_corpus(tmp_path / "c")
    settings = Settings(home=tmp_path / "h", source=str(corpus))
    first = run_index(settings)["entities"]
    assert first.scoped_entities is None  # nothing recorded: rebuilt whole
    assert run_index(settings)["entities"].scoped_entities == 0  # unchanged: nothing rebuilt
    before = graph_tables(settings)
    path = corpus / "tomas_reyes.txt"  # an existing entity gains a relation, a new one appears
    path.write_text(path.read_text() + "\nTomas Reyes later sailed with the Corran Shipping Company to Port Alder.\n")
    (corpus / "lena_holt.txt").write_text("Lena Holt was a clockmaker in Eastbridge. Lena Holt repaired the clock "
                                          "of the Marlow Observatory for Ada Fenwick.\n")
    gone = doc_id_of(settings, "corran_shipping.txt")
    with connect(settings) as con:
        delete_documents(settings, con, [gone], EmbeddedGraphStore(),
                         LocalObjectStore(settings.export_dir))
    (corpus / "corran_shipping.txt").unlink()
    out = run_index(settings)["entities"]
    assert 0 < out.scoped_entities < out.entities
    after = graph_tables(settings)
    assert after != before
    fresh = Settings(home=tmp_path / "fresh", source=str(shutil.copytree(corpus, tmp_path / "c2")))
    assert run_index(fresh)["entities"].scoped_entities is None
    assert not graph_difference(after, graph_tables(fresh))


def test_recorded_merges_rebuild_the_graph_tables_whole(tmp_path):
    """A merge folds entities across the whole graph: with one recorded, updates take the full path."""
    settings = Settings(home=tmp_path / "h", source=str(copy_corpus(tmp_path / "c")))
    run_index(settings)
    with connect(settings) as con:
        record_merge(con, settings.namespace, ["Tomas Reyes"], "Ada Fenwick", "concatenate")
    assert run_index(settings)["entities"].scoped_entities is None
