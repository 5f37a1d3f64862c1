"""The local route's multi_hop option: expansion as deep as its levels, capped in nodes, stopping early when a hop
brings fewer than `min_new_nodes` new nodes; and the README's example through it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp

from lazyhippo.query import QueryOptions, answer_question
from lazyhippo.query.config import MultiHopParams
from lazyhippo.query.multihop import SubgraphPPR
from lazyhippo.query.types import hub_entities


def _chain_index(n_entities: int, n_chunks: int, pairs: list[tuple[int, int]]):
    """What SubgraphPPR.expand reads of an index: the graph's structure by column (entities first), entity
    document frequencies and the chunk count."""
    n = n_entities + n_chunks
    rows, cols = zip(*pairs)
    adj = sp.csc_matrix((np.ones(2 * len(pairs)), (rows + cols, cols + rows)), shape=(n, n))
    return SimpleNamespace(graph=SimpleNamespace(columns32=adj), n_entities=n_entities, n_chunks=n_chunks,
                           entities=SimpleNamespace(df=np.ones(n_entities)))


def test_levels_are_passage_levels_and_off_by_default():
    assert [MultiHopParams(levels=n).hops for n in (1, 2, 3)] == [1, 3, 5]
    assert MultiHopParams().levels == 0 and QueryOptions().config().multi_hop.levels == 0
    assert QueryOptions(multi_hop=2).config().multi_hop.levels == 2


def test_expansion_depth_by_type_and_early_stop():
    # entity 0 -> chunks 12..21 (10 new) -> entities 1..9 (9 new) -> chunk 22 (1 new) -> entities 10, 11 (2 new)
    pairs = [(0, 12 + i) for i in range(10)] + [(12 + i, 1 + i) for i in range(9)] + [(9, 22), (10, 22), (11, 22)]
    index = _chain_index(12, 11, pairs)
    start = np.array([0])
    focused = SubgraphPPR(MultiHopParams(levels=1), 1.0)
    assert set(focused.expand(index, start)) == {0, *range(12, 22)} and focused.hops == 1
    wide = SubgraphPPR(MultiHopParams(levels=3, min_new_nodes=0), 1.0)
    assert set(wide.expand(index, start)) == set(range(23)) and wide.hops == 4
    stopping = SubgraphPPR(MultiHopParams(levels=3, min_new_nodes=3), 1.0)
    assert set(stopping.expand(index, start)) == set(range(23)) - {10, 11} and stopping.hops == 3  # +1: the last hop
    chain = _chain_index(10, 11, [(0, 10), (10, 1), (1, 11), (11, 2), (2, 12)])
    short = SubgraphPPR(MultiHopParams(levels=3, min_new_nodes=3), 1.0)
    assert set(short.expand(chain, start)) == {0, 10} and short.hops == 1  # one new node: no second hop
    capped = SubgraphPPR(MultiHopParams(levels=3, max_nodes=5, min_new_nodes=0), 1.0)
    assert set(capped.expand(index, start)) == {0, *range(12, 22)} and capped.hops == 1  # 11 nodes >= 5: no more


def test_option_reports_its_expansion(sample_settings):
    one = answer_question(sample_settings, "Who succeeded the founder of the Marlow Observatory as its director?",
                          route="local", llm=None, config=QueryOptions(multi_hop=1).config())
    two = answer_question(sample_settings, "Who succeeded the founder of the Marlow Observatory as its director?",
                          route="local", llm=None, config=QueryOptions(multi_hop=2).config())
    assert one.route == two.route == "local"
    assert one.diagnostics["multi_hop"]["levels"] == 1 and one.diagnostics["multi_hop"]["hops"] <= 1
    assert two.diagnostics["multi_hop"]["levels"] == 2
    assert two.diagnostics["multi_hop"]["subgraph_nodes"] > one.diagnostics["multi_hop"]["subgraph_nodes"]
    assert "multi_hop" not in answer_question(sample_settings, "Who founded the Marlow Observatory?", llm=None).diagnostics


def test_readme_example_answers_through_the_chain(sample_settings):
    """Founder (Ada Fenwick) -> her successor (Tomas Reyes) within two passage levels: on a corpus of a dozen passages
    both are named in a large share of them, and the walk must still go through them."""
    result = answer_question(sample_settings, "Who succeeded the founder of the Marlow Observatory as its director?",
                             route="local", llm=None, config=QueryOptions(multi_hop=2).config())
    assert "Tomas Reyes" in result.answer and "succeeded her as director" in result.answer
    assert "Tomas Reyes" in {c["title"] for c in result.citations}
    assert result.diagnostics["multi_hop"]["levels"] == 2


def test_hubs_are_the_most_named_entities_of_any_corpus():
    small = SimpleNamespace(n_chunks=13, entities=SimpleNamespace(df=np.array([10, 9, 8, 3, 3, 2, 1] + [1] * 20, dtype=float)))
    assert list(np.flatnonzero(hub_entities(small, 0.05, 0.01))) == [0]  # not every entity named in 3 passages
    # a large corpus: the share of passages decides, as before (top 1% of entities is a lower bar here)
    df = np.r_[np.full(9_900, 3.0), np.linspace(4, 600, 100)]
    large = SimpleNamespace(n_chunks=6_000, entities=SimpleNamespace(df=df))
    assert np.array_equal(hub_entities(large, 0.05, 0.01), df > 300)
    assert hub_entities(small, 0.05).sum() == 5  # the share alone (the bridge's rule): all in 3 passages or more


def test_a_graph_held_by_its_columns_only_walks_the_same_subgraph(sample_settings, monkeypatch):
    """From `PUSH_MIN_EDGES` entries on, the index holds the transition by columns only (the push reads nothing
    else), built or cached; the multi_hop walk then reads those columns as rows, to the same scores but for float32
    rounding."""
    from lazyhippo.graph import ppr
    from lazyhippo.query.loader import clear_cache, load_index

    clear_cache()
    full = load_index(sample_settings)
    p = np.zeros(len(full.graph.node_ids))
    p[[0, full.n_entities + 1]] = 1.0  # an entity and a passage
    expected = SubgraphPPR(MultiHopParams(levels=2), 1.0).run(full, p, 0.5, 1e-8, 200)
    monkeypatch.setattr(ppr, "PUSH_MIN_EDGES", 1)
    try:
        for how in ("cached", "built"):
            clear_cache()
            columns = load_index(sample_settings)
            g = columns.graph
            assert bool(columns.stats.get("cached")) == (how == "cached")
            assert g.transition32 is None and g.matvec32 is None and (g.columns32 != full.graph.columns32).nnz == 0
            walk = SubgraphPPR(MultiHopParams(levels=2), 1.0)
            scores = walk.run(columns, p, 0.5, 1e-8, 200)
            assert len(walk.nodes) > 2 and np.array_equal(scores > 0, expected > 0)
            assert np.abs(scores - expected).sum() < 1e-5
            for cache in (sample_settings.home / "published" / ".index-cache").glob("*.pickle"):
                cache.unlink()  # the second load builds
    finally:
        clear_cache()
