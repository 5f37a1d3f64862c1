"""The global route over community levels and its fallback cascade (communities -> hub entities of the best
communities seeding PPR -> local route)."""

from __future__ import annotations

import numpy as np

from lazyhippo.models.embedders import get_embedder
from lazyhippo.query import QueryConfig, answer_question, load_index, retrieve
from lazyhippo.query.communities import matched_communities
from lazyhippo.query.config import GlobalParams
from lazyhippo.query.types import PreparedQuery

THEMES_Q = "What are the main themes of this collection?"
SPECIFIC_Q = "Which shipping firm carried grain to the Baltic ports?"


def _query(settings, text):
    idx = load_index(settings)
    return idx, PreparedQuery(idx, text, get_embedder(settings.embedder))


def test_step_one_communities_answer_when_they_hold_evidence(sample_settings):
    res = answer_question(sample_settings, SPECIFIC_Q, route="global", llm=None)
    assert res.diagnostics["fallback"] == "none" and res.diagnostics["kept"] >= 1
    assert res.context and "No relevant information" not in res.answer


def test_step_two_hub_entities_of_the_best_communities_seed_ppr(sample_settings):
    strict = QueryConfig().with_(global_={"min_evidence": 10.0})  # no chunk can be evidence: the map keeps none
    idx, q = _query(sample_settings, SPECIFIC_Q)
    matched, _, _ = matched_communities(idx, q, strict.global_)
    assert matched  # communities match, they just hold no evidence
    res = answer_question(sample_settings, SPECIFIC_Q, route="global", llm=None, config=strict)
    assert res.diagnostics["fallback"] == "community_seeds" and res.diagnostics["hub_seeds"] > 0
    assert res.context and "No relevant information" not in res.answer
    # the hubs really seed the walk: without them the graph's own scores (no BM25 fusion, which on nine documents
    # settles the first eight places alone) are those of the local route (step three); with them the walk's mass
    # moves, whether or not it reorders nine documents' passages
    graph_order = {"lexical_weight": 0.0, "chunks_per_document": 0}
    seeded = [(c.chunk_id, c.score) for c in retrieve(sample_settings, SPECIFIC_Q, route="global", top_k=8,
                                                      config=strict.with_(local=graph_order))]
    plain = [(c.chunk_id, c.score) for c in retrieve(sample_settings, SPECIFIC_Q, route="local", top_k=8,
                                                     config=QueryConfig().with_(local=graph_order))]
    assert seeded and seeded != plain


def test_step_three_local_route_when_no_community_matches(sample_settings):
    question = "Who succeeded the founder of the Marlow Observatory as its director?"
    none = QueryConfig().with_(global_={"min_similarity": 100.0, "keyword_weight": 0.0})
    idx, q = _query(sample_settings, question)
    assert any(set(q.keywords) & toks for toks in idx.communities.tokens)  # a shared keyword still matches ...
    assert answer_question(sample_settings, question, route="global", llm=None, config=none).diagnostics["fallback"] != "local"
    unmatched = "Qwzx plorbs vintage dirigibles?"  # ... no shared word and no similar summary: nothing matches
    idx, q = _query(sample_settings, unmatched)
    assert not matched_communities(idx, q, none.global_)[0]
    res = answer_question(sample_settings, unmatched, route="global", llm=None, config=none)
    assert res.diagnostics["fallback"] == "local" and res.diagnostics["hub_seeds"] == 0 and res.context
    local = [c.chunk_id for c in retrieve(sample_settings, unmatched, route="local", top_k=8)]
    assert [c.chunk_id for c in retrieve(sample_settings, unmatched, route="global", top_k=8, config=none)] == local


def test_coarse_level_first_finer_when_the_coarse_match_is_weak(sample_settings):
    idx, q = _query(sample_settings, THEMES_Q)
    levels = idx.communities.levels
    assert set(levels.tolist()) == {0, 1, 2} and np.count_nonzero(levels == 0) == 2
    _, scores, level = matched_communities(idx, q, GlobalParams(level_min_score=-1.0, top_communities=2))
    assert level == 0  # any coarse match is strong enough
    weak = float(scores[levels == 0].max()) + 1e-6
    top, _, level = matched_communities(idx, q, GlobalParams(level_min_score=weak, top_communities=2))
    assert level > 0 and all(levels[ci] == level for ci in top)
    _, _, level = matched_communities(idx, q, GlobalParams(level_min_score=100.0, top_communities=2))
    assert level == levels.max()  # nothing is strong: the finest level answers
    # a level with fewer communities than the map step takes is too coarse to choose from: finer
    _, _, level = matched_communities(idx, q, GlobalParams(level_min_score=-1.0, top_communities=3))
    assert level == 1
    res = answer_question(sample_settings, THEMES_Q, route="global", llm=None)
    assert res.diagnostics["level"] == 2 and len(res.diagnostics["communities"]) >= 2
