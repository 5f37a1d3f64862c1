"""Chunk selection of the local routes: graph (PPR, the default, unchanged), and LightRAG's vector and weight picks
among the chunks of the question's entities, as a query setting on every surface."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from mcp.client import Client

from lazyhippo.models.embedders import get_embedder
from lazyhippo.query import DEFAULT_CONFIG, QueryOptions, answer_question, load_index, retrieve
from lazyhippo.query.config import ChunkSelectionParams, config_for
from lazyhippo.query.local import local_scores
from lazyhippo.query.types import PreparedQuery
from lazyhippo.serve.mcp import build_server
from lazyhippo.serve.pool import IndexPool
from lazyhippo.settings import Settings
from lazyhippo_dagster.runner import execute, run_config
from tests.test_mcp import _payload
from tests.test_serve import running

QUESTION = "Who succeeded the founder of the Marlow Observatory as its director?"


def _entity_mass(settings: Settings, question: str) -> tuple[object, PreparedQuery, np.ndarray]:
    idx = load_index(settings)
    q = PreparedQuery(idx, question, get_embedder(settings.embedder, settings.embedding_model))
    return idx, q, local_scores(idx, q, DEFAULT_CONFIG.local).mass


@pytest.mark.parametrize("multi_hop", [None, 2])
def test_vector_selection_ranks_the_entities_chunks_by_similarity(sample_settings, multi_hop):
    settings = sample_settings.with_(chunk_selection="vector", max_related_chunks=4)
    config = QueryOptions(multi_hop=multi_hop).config()
    chunks = retrieve(settings, QUESTION, route="local", top_k=10, config=config)
    idx, q, mass = _entity_mass(sample_settings, QUESTION)
    top = {int(e) for e in np.argsort(-mass, kind="stable")[:ChunkSelectionParams().entities] if mass[e] > 0}
    assert 0 < len(chunks) <= 4
    for c in chunks:  # every chunk mentions one of the question's entities, scored by its similarity
        assert top & set(idx.mentions.counts[idx.chunks.pos[c.chunk_id]].indices.tolist())
        assert c.score == pytest.approx(float(q.dense[idx.chunks.pos[c.chunk_id]]), abs=1e-6)
    assert [c.score for c in chunks] == sorted((c.score for c in chunks), reverse=True)
    if multi_hop is None:  # a different order than the graph's
        graph = retrieve(sample_settings, QUESTION, route="local", top_k=10)
        assert [c.chunk_id for c in chunks] != [c.chunk_id for c in graph[:len(chunks)]]


def test_weight_selection_ranks_by_the_mass_of_the_entities_a_chunk_mentions(sample_settings):
    chunks = retrieve(sample_settings.with_(chunk_selection="weight"), QUESTION, top_k=30)
    idx, _, mass = _entity_mass(sample_settings, QUESTION)
    top = [e for e in np.argsort(-mass, kind="stable")[:20] if mass[e] > 0]
    for c in chunks:
        mentioned = set(idx.mentions.counts[idx.chunks.pos[c.chunk_id]].indices.tolist())
        assert c.score == pytest.approx(sum(mass[e] for e in top if e in mentioned), rel=1e-6)
    assert [c.score for c in chunks] == sorted((c.score for c in chunks), reverse=True)
    assert len(chunks) <= 20  # max_related_chunks by default


def test_the_default_is_the_graph_order_untouched(sample_settings):
    assert config_for(sample_settings) is DEFAULT_CONFIG and config_for(Settings.from_env()) is DEFAULT_CONFIG
    explicit = DEFAULT_CONFIG.with_(selection={"mode": "graph"})
    assert [c.chunk_id for c in retrieve(sample_settings, QUESTION, top_k=20)] == \
        [c.chunk_id for c in retrieve(sample_settings, QUESTION, top_k=20, config=explicit)]
    assert config_for(sample_settings.with_(chunk_selection="graph")) is DEFAULT_CONFIG


def test_selection_from_the_environment_the_job_the_http_api_and_the_mcp_tool(sample_settings, tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYHIPPO_CHUNK_SELECTION", "vector")
    monkeypatch.setenv("LAZYHIPPO_MAX_RELATED_CHUNKS", "3")
    env = Settings.from_env(home=sample_settings.home)
    res = answer_question(env, QUESTION, route="local", llm=None)
    assert res.diagnostics["chunk_selection"] == {"mode": "vector", "related": 3, "max_related_chunks": 3}
    monkeypatch.setenv("LAZYHIPPO_MAX_RELATED_CHUNKS", "three")
    with pytest.raises(ValueError, match="LAZYHIPPO_MAX_RELATED_CHUNKS"):
        Settings.from_env()
    monkeypatch.delenv("LAZYHIPPO_CHUNK_SELECTION")
    monkeypatch.delenv("LAZYHIPPO_MAX_RELATED_CHUNKS")

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    cfg = run_config({"lazyhippo": {"home": str(sample_settings.home), "chunk_selection": "weight",
                                    "max_related_chunks": 2}},
                     ops={"answer_question": {"config": {"question": QUESTION, "route": "local"}}})
    data = execute("query", sample_settings.home, cfg).output_for_node("answer_question")
    assert data["diagnostics"]["chunk_selection"]["mode"] == "weight" and len(data["context"]) <= 2

    pool = IndexPool(sample_settings, settle_seconds=0.3, poll_seconds=0.1).start()
    try:
        with running(pool) as url:
            r = httpx.post(f"{url}/api/query", json={"question": QUESTION, "route": "local",
                                                     "chunk_selection": "vector", "max_related_chunks": 2}, timeout=120)
            assert r.status_code == 200 and r.json()["diagnostics"]["chunk_selection"]["mode"] == "vector"
            assert len(r.json()["context"]) <= 2
            bad = httpx.post(f"{url}/api/query", json={"question": QUESTION, "chunk_selection": "random"}, timeout=120)
            assert bad.status_code == 422 and "chunk_selection" in bad.text

        async def call(**args) -> dict:
            async with Client(build_server(pool)) as client:
                return _payload(await client.call_tool("lazyhippo_retrieve", {"query": QUESTION, **args}))

        vector = asyncio.run(call(chunk_selection="vector", limit=5))
        expected = retrieve(sample_settings.with_(chunk_selection="vector"), QUESTION, top_k=5)
        assert [p["chunk_id"] for p in vector["passages"]] == [c.chunk_id for c in expected]
    finally:
        pool.stop()
