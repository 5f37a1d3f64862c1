"""The reranker setting against a real HTTP reranker on loopback (it scores by word overlap), on every surface:
the engine from LAZYHIPPO_* variables, the Dagster query job's resource config, `lazyhippo query --rerank`, the
HTTP API and the MCP tool; with the design's safety values (top 20, minimum score 0.1, 2 s timeout, a breaker
opening after 5 failures and half-opening after 60 s)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
from mcp.client import Client
from typer.testing import CliRunner

from lazyhippo.query import answer_question, configured_reranker, retrieve
from lazyhippo.serve.mcp import build_server
from lazyhippo.serve.pool import IndexPool
from lazyhippo.settings import Settings
from lazyhippo_dagster.cli import app
from lazyhippo_dagster.runner import execute, run_config
from tests.loopback import LoopbackJSONServer
from tests.test_mcp import _payload
from tests.test_serve import running

QUESTION = "Who succeeded the founder of the Marlow Observatory as its director?"


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


class OverlapReranker(LoopbackJSONServer):
    """A Cohere-shaped /rerank API scoring each document by the share of the query's words it holds; `mode`
    makes it slow (3 s, past the 2 s timeout) or failing (HTTP 503)."""

    def __init__(self):
        self.mode = "ok"
        super().__init__(self._route)

    def _route(self, path: str, body: dict) -> tuple[int, dict]:
        if self.mode == "fail":
            return 503, {"error": "overloaded"}
        if self.mode == "slow":
            time.sleep(3.0)
        query = _words(body["query"])
        results = [{"index": i, "relevance_score": len(query & _words(d)) / len(query)}
                   for i, d in enumerate(body["documents"])]
        return 200, {"results": sorted(results, key=lambda r: -r["relevance_score"])}

    @property
    def url(self) -> str:
        return self.root + "/v1/rerank"


@pytest.fixture
def reranker(monkeypatch):
    with OverlapReranker() as server:
        monkeypatch.setenv("LAZYHIPPO_RERANK_URL", server.url)
        monkeypatch.setenv("LAZYHIPPO_RERANK_MODEL", "overlap")
        monkeypatch.setenv("LAZYHIPPO_RERANK_API_KEY", "rerank-key")
        yield server


def _overlap(question: str, chunk) -> float:
    q = _words(question)
    return len(q & _words(f"{chunk.title}\n{chunk.text}")) / len(q)


def test_the_rerank_setting_reorders_the_best_20_by_the_http_reranker(sample_settings, reranker, monkeypatch):
    monkeypatch.setenv("LAZYHIPPO_RERANK", "http")
    settings = Settings.from_env(home=sample_settings.home)
    assert settings.rerank == "http"
    res = answer_question(settings, QUESTION, route="local", llm=None)
    diag = res.diagnostics["rerank"]
    assert diag["status"] == "ran" and diag["top_n"] == 20 and diag["breaker"] == "closed"
    sent = reranker.requests[-1]
    candidates = len(retrieve(sample_settings, QUESTION, top_k=50))  # the small sample yields fewer than 20
    assert sent["model"] == "overlap" and sent["query"] == QUESTION and len(sent["documents"]) == min(20, candidates)
    scores = [_overlap(QUESTION, c) for c in res.context]
    assert scores == sorted(scores, reverse=True) and scores[0] == max(
        len(_words(QUESTION) & _words(d)) / len(_words(QUESTION)) for d in sent["documents"])
    assert all(c.channels["rerank"] >= 0.1 for c in res.context if "rerank" in c.channels)  # min score 0.1
    plain = answer_question(sample_settings, QUESTION, route="local", llm=None)
    assert plain.diagnostics["rerank"] == {"status": "off"}
    assert [c.chunk_id for c in res.context] != [c.chunk_id for c in plain.context]


def test_a_slow_reranker_times_out_after_2_seconds_and_keeps_the_retrieval_order(sample_settings, reranker):
    settings = sample_settings.with_(rerank="http", rerank_top_n=7)  # its own stage: a fresh breaker
    plain = answer_question(sample_settings, QUESTION, route="local", llm=None)
    reranker.mode = "slow"
    t0 = time.perf_counter()
    res = answer_question(settings, QUESTION, route="local", llm=None)
    took = time.perf_counter() - t0
    assert res.diagnostics["rerank"]["status"] == "timeout" and 2.0 <= took < 2.9
    assert [c.chunk_id for c in res.context] == [c.chunk_id for c in plain.context]


def test_a_failing_reranker_opens_the_breaker_after_5_failures_and_half_opens_after_60_s(sample_settings, reranker):
    settings = sample_settings.with_(rerank="http", rerank_top_n=9)
    stage = configured_reranker(settings)
    now = [1000.0]
    stage.breaker.clock = lambda: now[0]
    reranker.mode = "fail"
    plain = [c.chunk_id for c in retrieve(settings, QUESTION, reranker=None)]
    for _ in range(5):
        assert [c.chunk_id for c in retrieve(settings, QUESTION)] == plain  # each failure keeps the order
    assert len(reranker.requests) == 5 and stage.breaker.state == "open"
    res = answer_question(settings, QUESTION, route="local", llm=None)
    assert res.diagnostics["rerank"]["status"] == "skipped" and len(reranker.requests) == 5 and res.citations
    now[0] += 59
    assert answer_question(settings, QUESTION, route="local", llm=None).diagnostics["rerank"]["status"] == "skipped"
    now[0] += 1
    assert stage.breaker.state == "half_open"
    reranker.mode = "ok"
    res = answer_question(settings, QUESTION, route="local", llm=None)
    assert res.diagnostics["rerank"]["status"] == "ran" and stage.breaker.state == "closed"


def test_failures_count_per_query_and_each_answer_says_so(sample_settings, reranker):
    settings = sample_settings.with_(rerank="http", rerank_top_n=11)
    reranker.mode = "fail"
    statuses = [answer_question(settings, QUESTION, route="local", llm=None).diagnostics["rerank"]
                for _ in range(6)]
    assert [s["status"] for s in statuses] == ["failed"] * 5 + ["skipped"]
    assert "503" in statuses[0]["detail"] and statuses[4]["breaker"] == "open"


def test_rerank_http_without_an_endpoint_is_a_clear_error(sample_settings, monkeypatch):
    monkeypatch.delenv("LAZYHIPPO_RERANK_URL", raising=False)
    with pytest.raises(ValueError, match="LAZYHIPPO_RERANK_URL"):
        answer_question(sample_settings.with_(rerank="http"), QUESTION, llm=None)
    monkeypatch.setenv("LAZYHIPPO_RERANK", "cohere")
    with pytest.raises(ValueError, match="LAZYHIPPO_RERANK"):
        Settings.from_env()


def test_the_query_job_and_the_cli_rerank_when_configured(sample_settings, reranker, tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    cfg = run_config({"lazyhippo": {"home": str(sample_settings.home), "rerank": "http", "rerank_top_n": 5}},
                     ops={"answer_question": {"config": {"question": QUESTION, "route": "local"}}})
    data = execute("query", sample_settings.home, cfg).output_for_node("answer_question")
    assert data["diagnostics"]["rerank"]["status"] == "ran" and len(reranker.requests[-1]["documents"]) == 5
    out = CliRunner().invoke(app, ["query", QUESTION, "--home", str(sample_settings.home), "--route", "local",
                                   "--rerank", "http", "--rerank-top-n", "6", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout[out.stdout.index("{"):])
    assert data["diagnostics"]["rerank"]["status"] == "ran" and len(reranker.requests[-1]["documents"]) == 6
    bad = CliRunner().invoke(app, ["query", QUESTION, "--home", str(sample_settings.home), "--rerank", "cohere"])
    assert bad.exit_code == 2 and "--rerank" in bad.output


def test_the_http_api_and_the_mcp_tool_rerank_with_the_server_setting(sample_settings, reranker):
    pool = IndexPool(sample_settings.with_(rerank="http", rerank_top_n=10), settle_seconds=0.3, poll_seconds=0.1).start()
    try:
        with running(pool) as url:
            r = httpx.post(f"{url}/api/query", json={"question": QUESTION, "route": "local"}, timeout=120)
            assert r.status_code == 200 and r.json()["diagnostics"]["rerank"]["status"] == "ran"
            assert len(reranker.requests[-1]["documents"]) == 10
            off = httpx.post(f"{url}/api/query", json={"question": QUESTION, "route": "local", "rerank": "none"},
                             timeout=120)
            assert off.status_code == 200 and off.json()["diagnostics"]["rerank"] == {"status": "off"}
            unusable = httpx.post(f"{url}/api/query", json={"question": QUESTION, "rerank": "cross-encoder"},
                                  timeout=120)  # no cross-encoder model in the folder LAZYHIPPO_RERANK_MODEL names
            assert unusable.status_code == 400 and "LAZYHIPPO_RERANK_MODEL" in unusable.json()["error"]

        async def call() -> dict:
            async with Client(build_server(pool)) as client:
                return _payload(await client.call_tool("lazyhippo_retrieve", {"query": QUESTION, "limit": 3}))

        n = len(reranker.requests)
        out = asyncio.run(call())
        assert out["rerank"] == "ran" and len(out["passages"]) == 3 and len(reranker.requests) == n + 1
        assert len(reranker.requests[-1]["documents"]) == 10  # top_n candidates reranked, 3 returned
    finally:
        pool.stop()
