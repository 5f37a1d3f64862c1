"""Community levels coarse to fine: Leiden (one run per resolution) and Louvain (its own passes) on the embedded
store and on Neo4j + GDS, nested into a tree, stored with their parents and summarized per level."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lazyhippo.graph import algorithms as graph
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.warehouse import connect
from tests.services_fixtures import namespaces, neo4j_store  # noqa: F401 - fixtures

RESOLUTIONS = (0.1, 0.5, 1.0)


def _clustered_graph(seed: int = 3):
    """Eight dense groups of eight, groups paired into four looser blocks: a graph with a clear hierarchy."""
    rng = np.random.default_rng(seed)
    ids = [f"e{i:02d}" for i in range(64)]
    edges = []
    for i in range(64):
        for j in range(i + 1, 64):
            same_group, same_block = i // 8 == j // 8, i // 16 == j // 16
            if (same_group and rng.random() < 0.7) or (same_block and rng.random() < 0.08) or rng.random() < 0.01:
                edges.append((ids[i], ids[j], 1.0 + float(rng.random())))
    return ids, edges


def _assert_nested(comm: graph.Communities, ids: list[str]) -> None:
    levels = comm.hierarchy
    assert levels[-1].membership == comm.membership and levels[-1].modularity == comm.modularity
    counts = [len(set(level.membership.values())) for level in levels]
    assert counts == sorted(counts) and counts[0] < counts[-1], counts  # coarse to fine
    for coarse, fine in zip(levels, levels[1:]):
        parent: dict[int, int] = {}
        for n in ids:  # every fine community lies inside exactly one coarse community
            assert parent.setdefault(fine.membership[n], coarse.membership[n]) == coarse.membership[n]


@pytest.mark.parametrize("algorithm", ["leiden", "louvain"])
def test_embedded_levels_are_nested_coarse_to_fine(algorithm):
    ids, edges = _clustered_graph()
    comm = graph.detect_communities(ids, edges, algorithm, resolutions=RESOLUTIONS)
    assert len(comm.hierarchy) == (3 if algorithm == "leiden" else min(3, comm.levels))
    assert len(comm.hierarchy) >= 2
    _assert_nested(comm, ids)
    one = graph.detect_communities(ids, edges, algorithm, resolutions=(1.0,))
    assert len(one.hierarchy) == 1


def test_bad_resolutions_name_the_setting():
    for bad in ((), (1.0, 0.5), (0.0, 1.0), "a,b"):
        with pytest.raises(ValueError, match="community resolutions"):
            Settings(community_resolutions=bad)
    assert Settings(community_resolutions="0.2,1").community_resolutions == (0.2, 1.0)


def test_index_stores_levels_with_parents_and_summaries(tmp_path):
    from lazyhippo.index import run_index

    settings = Settings(home=tmp_path, namespace="levels", source=str(SAMPLE_CORPUS))
    out = run_index(settings)
    assert len(out["communities"].per_level) == 3
    assert out["communities"].figures()["levels"] == 3  # the run page's metadata: the levels stored
    assert run_index(settings)["communities"].figures()["levels"] == 3  # and when an unchanged graph reuses them
    with connect(settings) as con:
        rows = con.execute("SELECT community_id, level, size, parent_id FROM communities WHERE namespace = 'levels'").fetchall()
        summarized = {c for (c,) in con.execute("SELECT community_id FROM community_summaries").fetchall()}
        finest = dict(con.execute("SELECT entity_id, community_id FROM entity_scores").fetchall())
    by_id = {c: (level, size, parent) for c, level, size, parent in rows}
    assert {level for level, _, _ in by_id.values()} == {0, 1, 2}
    assert set(finest.values()) == {c for c, (level, _, _) in by_id.items() if level == 2}
    for c, (level, size, parent) in by_id.items():
        assert (parent is None) == (level == 0)
        if parent is not None:
            assert by_id[parent][0] == level - 1 and by_id[parent][1] >= size
    for level in (0, 1, 2):  # every level partitions all the entities
        assert sum(size for lv, size, _ in by_id.values() if lv == level) == len(finest)
    assert summarized == set(by_id)


@pytest.mark.services
@pytest.mark.parametrize("algorithm", ["leiden", "louvain"])
def test_gds_levels_agree_with_embedded(algorithm, neo4j_store, namespaces):  # noqa: F811
    ids, edges = _clustered_graph()
    emb = graph.detect_communities(ids, edges, algorithm, resolutions=RESOLUTIONS)
    gds = neo4j_store.communities(namespaces("levels"), ids, edges, algorithm, resolutions=RESOLUTIONS)
    _assert_nested(gds, ids)
    assert len(gds.hierarchy) == len(emb.hierarchy)
    assert abs(emb.modularity - gds.modularity) <= 0.05, (emb.modularity, gds.modularity)
    assert all(level.modularity > 0.2 for level in gds.hierarchy)  # coarse levels: another optimizer, as good a split
    g = graph.weighted_igraph(ids, edges)  # the modularity both stores report is igraph's
    for level in gds.hierarchy:
        assert g.modularity([level.membership[n] for n in ids], weights="weight") == pytest.approx(level.modularity, abs=1e-9)


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory):
    from lazyhippo.index import run_index

    settings = Settings(home=tmp_path_factory.mktemp("sample"), source=str(SAMPLE_CORPUS))
    run_index(settings)
    return settings


def test_the_entity_graph_arrives_merged_as_node_positions(sample_index, monkeypatch):
    """DuckDB maps the ends to node positions: Python gets integer pairs, never an id string per edge, and the
    graph is the one merging the id-string edges gives, pair for pair and weight for weight (same bits), also
    when the edges arrive in batches of a few rows (at 100,000 documents: 16 batches of a million)."""
    import lazyhippo.stages.communities as stage
    from lazyhippo.stages.communities import entity_graph

    monkeypatch.setattr(stage, "EDGE_BATCH", 5)

    with connect(sample_index) as con:
        nodes, merged = entity_graph(con, sample_index.namespace)
        edges = con.execute("SELECT source_id, target_id, weight::DOUBLE FROM relations UNION ALL "
                            "SELECT source_id, target_id, score::DOUBLE FROM knn_edges ORDER BY 1, 2").fetchall()
    assert isinstance(merged, graph.MergedGraph) and merged.pairs.dtype == np.int32 and len(merged) > 50
    expected = graph.merged_undirected(nodes, edges)
    np.testing.assert_array_equal(merged.pairs, expected.pairs)
    assert merged.weights.tobytes() == expected.weights.tobytes()
    assert graph.merged_undirected(nodes, merged) is merged  # the stores take it as it is


def test_summaries_read_only_each_communitys_hubs(sample_index, monkeypatch):
    """A summary needs its community's MAX_HUBS hubs: DuckDB ranks the members and sends those (and ties with
    the last), not every member of every level; the summaries are those of all the members."""
    import lazyhippo.stages.community_summaries as cs
    from lazyhippo.stages.summaries import MAX_HUBS, summarize_extractive
    from lazyhippo.stores.warehouse import community_members

    sent = []
    monkeypatch.setattr(cs, "community_members", lambda *a, **k: sent.append(community_members(*a, **k)) or sent[-1])
    ns = sample_index.namespace
    with connect(sample_index) as con:
        cs.build_community_summaries(sample_index, con)
        stored = con.execute("SELECT community_id, title, summary, hub_entities FROM community_summaries "
                             "WHERE namespace = ? ORDER BY community_id", [ns]).fetchall()
        every = community_members(con, ns, "m.community_id, e.name, e.description, s.pagerank, e.degree")
    members: dict[str, list[dict]] = {}
    for c, name, desc, pr, deg in every:
        members.setdefault(c, []).append({"name": name, "description": desc or "", "score": pr * 1000 + deg})
    assert len(sent[0]) < len(every) and len(sent[0]) <= len(members) * MAX_HUBS + 5
    assert stored == sorted((s.community_id, s.title, s.summary, s.hub_entities)
                            for s in (summarize_extractive(c, ms) for c, ms in members.items()))


def _merged_graph(seed: int = 5, n: int = 2000, m: int = 300_000) -> graph.MergedGraph:
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    return graph.merge_positions(n, a, b, rng.random(m))


def test_merging_sorted_batches_sums_as_merging_the_whole():
    """Rows arriving ordered by pair in batches: a pair whose rows a batch ends in the middle of (here every
    batch of 7) is summed in one pass, so the sums are the bits merge_positions gives on all the rows at once."""
    rng = np.random.default_rng(11)
    n, m = 60, 2000
    a, b, w = rng.integers(0, n, m), rng.integers(0, n, m), rng.random(m) * 10.0 ** rng.integers(-6, 6, m)
    by_ends = np.lexsort((b, a))  # as the rows were merged before: ordered by (source, target) position
    a, b, w = a[by_ends], b[by_ends], w[by_ends]
    whole = graph.merge_positions(n, a, b, w)
    keep = a != b
    lo, hi, a, w = np.minimum(a, b)[keep], np.maximum(a, b)[keep], a[keep], w[keep]
    order = np.lexsort((a, hi, lo))  # by pair, then by the source's position, as DuckDB sends them
    lo, hi, w = lo[order].astype(np.int32), hi[order].astype(np.int32), w[order]
    batches = [(lo[i:i + 7], hi[i:i + 7], w[i:i + 7]) for i in range(0, len(w), 7)]
    merged = graph.merge_sorted(iter(batches), m)
    np.testing.assert_array_equal(merged.pairs, whole.pairs)
    assert merged.weights.tobytes() == whole.weights.tobytes() and merged.pairs.dtype == np.int32
    assert len(graph.merge_sorted(iter([]), 0)) == 0
    assert len(merged) < m
    for array in (merged.pairs, merged.weights):  # the rows merged away are not held: no view of the capacity
        assert array.base is None or array.base.nbytes == array.nbytes


def test_the_symmetric_adjacency_is_scipys_sum_of_both_triangles_in_its_own_memory(monkeypatch):
    """symmetric_csr places both directions straight into the result's arrays, a block of pairs at a time (here
    blocks of 997, so rows span blocks): the same matrix, bit for bit, as scipy's upper + upper.T, while the
    memory it allocates stays close to the result's (the sum of two matrices takes about twice more)."""
    import tracemalloc

    import scipy.sparse as sp

    merged, n = _merged_graph(m=20_000), 2005  # five isolated nodes
    upper = sp.csr_matrix((merged.weights, (merged.pairs[:, 0], merged.pairs[:, 1])), shape=(n, n))
    expected = (upper + upper.T).tocsr()
    monkeypatch.setattr(graph, "CSR_BLOCK", 997)
    tracemalloc.start()
    try:
        adjacency = graph.symmetric_csr(n, merged)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert adjacency.has_canonical_format and adjacency.indices.dtype == np.int32
    for part in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(adjacency, part), getattr(expected, part))
    assert adjacency.data.tobytes() == expected.data.tobytes()
    result = adjacency.data.nbytes + adjacency.indices.nbytes + adjacency.indptr.nbytes
    assert peak < 1.3 * result, (peak, result)


def test_community_detection_makes_no_python_object_per_edge():
    """The weights go to igraph as an array, not as an edge attribute (a float object per edge: 500 MB at 15
    million edges): Python's own allocations while detecting stay far below one object per edge."""
    import tracemalloc

    merged = _merged_graph()
    ids = [f"e{i:04d}" for i in range(2000)]
    tracemalloc.start()
    try:
        comm = graph.detect_communities(ids, merged, "leiden", resolutions=RESOLUTIONS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(comm.hierarchy) == 3
    assert peak < 8 * len(merged), peak  # a list of floats alone is 32 bytes an edge


def test_leiden_levels_are_the_same_on_every_run_and_keep_the_planted_groups():
    """igraph's C Leiden with a fixed seed: the same partition on every run, each level's modularity the one
    igraph computes for it, and the planted groups of the clustered graph kept whole at resolution 1."""
    ids, edges = _clustered_graph()
    first = graph.detect_communities(ids, edges, "leiden", resolutions=RESOLUTIONS)
    assert graph.detect_communities(ids, edges, "leiden", resolutions=RESOLUTIONS) == first
    g = graph.weighted_igraph(ids, edges)
    for level in first.hierarchy:
        labels = [level.membership[n] for n in ids]
        assert g.modularity(labels, weights="weight") == pytest.approx(level.modularity, abs=1e-12)
    community = {}
    for i, n in enumerate(ids):  # no planted group is split
        assert community.setdefault(i // 8, first.membership[n]) == first.membership[n]
    assert len(set(first.membership.values())) >= 4 and first.modularity > 0.5


def test_louvain_levels_are_igraphs_own_passes():
    """Louvain is unchanged by the weights going in as an array: the levels are igraph's multilevel passes on
    the graph with its weight attribute, label for label."""
    import igraph as ig

    ids, edges = _clustered_graph()
    comm = graph.detect_communities(ids, edges, "louvain", resolutions=RESOLUTIONS)
    ig.set_random_number_generator(random.Random(42))
    passes = graph.weighted_igraph(ids, edges).community_multilevel(weights="weight", return_levels=True)
    expected = graph.nested([p.membership for p in reversed(passes[-len(RESOLUTIONS):])])
    for level, labels in zip(comm.hierarchy, expected):
        assert [level.membership[n] for n in ids] == graph.renumbered_by_size(labels)


def test_pagerank_is_the_transition_matrix_power_iteration_to_the_bit():
    """PageRank builds its transition from the merged pairs without COO triplets of both directions: the
    scores are the bits of the power iteration on ppr.transition_matrix of the symmetric adjacency."""
    import scipy.sparse as sp

    from lazyhippo.graph.ppr import personalized_pagerank, transition_matrix

    merged, n = _merged_graph(m=20_000), 2000
    ids = [f"e{i:04d}" for i in range(n)]
    a, b = merged.pairs[:, 0], merged.pairs[:, 1]
    both = (np.concatenate([a, b]), np.concatenate([b, a]))
    adjacency = sp.csr_matrix((np.concatenate([merged.weights, merged.weights]), both),
                              shape=(n + 5, n + 5))  # five isolated nodes: dangling
    transition, dangling = transition_matrix(adjacency)
    expected = personalized_pagerank(transition, np.ones(n + 5), 0.85, tol=1e-13, max_iter=1000,
                                     dangling=dangling).scores
    scores = graph.pagerank(ids + [f"z{i}" for i in range(5)], merged)
    assert np.array(list(scores.values())).tobytes() == expected.tobytes()


def test_the_previous_partition_is_read_a_level_at_a_time(sample_index, monkeypatch):
    """A seeded run reads the stored members one level at a time (all levels' rows at once were 1 GB of
    Python tuples at 100,000 documents) and starts each level from that level's previous partition."""
    import lazyhippo.stages.communities as stage
    from lazyhippo.stages.incremental import seed_membership
    from lazyhippo.stores.warehouse import community_members

    sent = []
    monkeypatch.setattr(stage, "community_members", lambda *a, **k: sent.append(community_members(*a, **k)) or sent[-1])
    ns = sample_index.namespace
    with connect(sample_index) as con:
        nodes = [e for (e,) in con.execute("SELECT entity_id FROM entities WHERE namespace = ? ORDER BY entity_id",
                                           [ns]).fetchall()]
        seeds = stage._seeds(con, ns, nodes, 3)
        every = community_members(con, ns, "m.level, m.entity_id, m.community_id", "m.level")
        assert stage._seeds(con, ns, nodes, 2) is None  # another number of levels: from scratch
    assert len(sent) == 3 and all(len(rows) == len(nodes) for rows in sent)
    assert seeds == [seed_membership(nodes, {e: c for lv, e, c in every if lv == level}) for level in range(3)]
    assert all(seeds)


def test_the_entity_graph_sums_both_directions_and_counts_a_relation_without_weight_as_one():
    """Relations and KNN edges in either direction merge into one undirected pair; a relation whose weight is
    NULL counts 1.0 (as on the Neo4j store), self-loops and ends that are not entities drop out."""
    import duckdb

    from lazyhippo.stages.communities import entity_graph
    from lazyhippo.sql import SQL_DIR

    con = duckdb.connect()
    con.execute((SQL_DIR / "schema.sql").read_text())
    con.execute("INSERT INTO entities (namespace, entity_id, name, norm_name) VALUES "
                "('n', 'a', 'A', 'a'), ('n', 'b', 'B', 'b'), ('n', 'c', 'C', 'c'), ('other', 'z', 'Z', 'z')")
    con.execute("INSERT INTO relations (namespace, source_id, target_id, weight) VALUES "
                "('n', 'a', 'b', NULL), ('n', 'c', 'b', 2.0), ('n', 'a', 'a', 5.0), "
                "('n', 'a', 'x', 1.0), ('other', 'z', 'z', 1.0)")
    con.execute("INSERT INTO knn_edges VALUES ('n', 'b', 'a', 0.5, 1), ('n', 'c', 'b', 0.25, 1)")
    nodes, merged = entity_graph(con, "n")
    assert nodes == ["a", "b", "c"]
    assert merged.pairs.tolist() == [[0, 1], [1, 2]] and merged.weights.tolist() == [1.5, 2.25]


def test_duckdbs_cache_of_the_edge_read_is_given_back_before_the_communities_are_detected(sample_index, monkeypatch):
    """The edges' read (a sort and two joins over every edge row) leaves DuckDB's blocks cached up to its cap
    (~430 MB at 50,000 documents): they go back before igraph takes its own copy of the graph."""
    import lazyhippo.stages.communities as stage
    from lazyhippo.stores.graphs import EmbeddedGraphStore
    from lazyhippo.stores.warehouse import release_cache

    events = []
    monkeypatch.setattr(stage, "release_cache", lambda con: events.append("release") or release_cache(con))

    class Recording(EmbeddedGraphStore):
        def communities(self, *args, **kwargs):
            events.append("detect")
            return super().communities(*args, **kwargs)

    with connect(sample_index) as con:
        con.execute("DELETE FROM stage_inputs WHERE namespace = ? AND stage = 'communities'", [sample_index.namespace])
        stage.build_communities(sample_index, con, Recording())
    assert events == ["release", "detect"]
