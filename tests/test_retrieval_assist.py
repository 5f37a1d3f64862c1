"""LLM-assisted local retrieval: recognition memory filters the matched facts, iterative multi-hop asks for
the missing piece (at most 3 retrievals); off unless a caller opts in; a timeout, an error or an open
breaker falls back to the offline ranking; tokens are counted. Mechanics against the real local LLM server
and against scripted loopback endpoints for the failures."""

from __future__ import annotations

import json
import time

import pytest

from lazyhippo.models.llm import LLMConfig, OpenAIChat
from lazyhippo.query import retrieve
from lazyhippo.query.assist import RetrievalAssist, fuse_rounds, iterate
from lazyhippo.query.rerank import CircuitBreaker
from tests.loopback import FakeOpenAI, OpenAIProxy
from tests.services_fixtures import llm_server  # noqa: F401 - fixture

QUESTION = "Who succeeded the founder of the Marlow Observatory as its director?"


def client(base_url: str, model: str = "m", timeout: float = 30.0) -> OpenAIChat:
    return OpenAIChat(LLMConfig(model, base_url=base_url, api_key="none", timeout=timeout, max_retries=0))


def ids(chunks) -> list[str]:
    return [c.chunk_id for c in chunks]


def test_fuse_rounds_and_iterate_stop_at_the_round_limit():
    assert fuse_rounds([["a", "b", "c"], ["c", "d"]])[:2] == ["c", "a"]  # in both rounds beats first of one
    assert fuse_rounds([["a", "b"]]) == ["a", "b"]

    class Scripted:
        rounds = 3

        def __init__(self, steps):
            self.steps = iter(steps)

        def next_search(self, question, passages):
            return next(self.steps)

    asked: list[str] = []
    search = lambda text: asked.append(text) or [text]  # noqa: E731
    results, searches = iterate("q", search, str, str, Scripted(["a", "b", "c", "d"]))
    assert asked == ["q", "q a", "q b"] and searches == ["a", "b"]  # 3 retrievals at most
    assert set(results) == {"q", "q a", "q b"}
    asked.clear()
    assert iterate("q", search, str, str, Scripted(["a", "a"]))[1] == ["a"] and asked == ["q", "q a"]  # no repeats
    asked.clear()
    assert iterate("q", search, str, str, Scripted([None]))[0] == ["q"] and asked == ["q"]  # done after one
    with pytest.raises(ValueError, match="rounds must be 1, 2 or 3"):
        RetrievalAssist(client("http://127.0.0.1:9/v1"), rounds=4)


def test_recognition_and_bridge_steps_shape_the_ranking(qsettings):
    """A scripted endpoint: recognition keeps no fact, the bridge step names one search then says done.
    Both prompts reach it, the ranking differs from the offline one, tokens are counted per step."""
    bridges: list[str] = []

    def reply(prompt: str) -> str:
        if "Candidate facts" in prompt:
            return json.dumps({"keep": []})
        bridges.append(prompt)
        return json.dumps({"done": False, "search": "Corran Shipping Company"}) if len(bridges) == 1 else '{"done": true}'

    offline = retrieve(qsettings, QUESTION, top_k=5)
    with FakeOpenAI(reply) as fake:
        assist = RetrievalAssist(client(fake.base_url), rounds=3)
        diag: dict = {}
        chunks = retrieve(qsettings, QUESTION, top_k=5, assist=assist, diagnostics=diag)
    steps = diag["assist"]["steps"]
    assert steps[0] == "recognition: ok" and "bridge: ok" in steps
    assert diag["assist"]["rounds"] == 2 and diag["assist"]["searches"] == ["Corran Shipping Company"]
    assert not any("fact" in link for link in diag["links"])  # recognition dropped every fact
    usage = {u["operation"]: u for u in diag["assist"]["usage"]}
    assert usage["recognition"]["prompt_tokens"] > 0 and usage["bridge"]["calls"] >= 1
    assert ids(chunks) != ids(offline) and [c.score for c in chunks] == sorted((c.score for c in chunks), reverse=True)


def test_without_an_assist_the_local_route_calls_no_llm(qsettings, monkeypatch):
    with FakeOpenAI(lambda p: "{}") as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        retrieve(qsettings, QUESTION, top_k=5)
        assert fake.prompts == []


def test_timeouts_fall_back_to_the_offline_ranking_and_open_the_breaker(qsettings):
    def slow(prompt: str) -> str:
        time.sleep(1.0)
        return '{"keep": [1]}'

    offline = retrieve(qsettings, QUESTION, top_k=5)
    with FakeOpenAI(slow) as fake:
        assist = RetrievalAssist(client(fake.base_url), timeout=0.2, breaker=CircuitBreaker(failure_threshold=2, cooldown=60))
        diag: dict = {}
        assert ids(retrieve(qsettings, QUESTION, top_k=5, assist=assist, diagnostics=diag)) == ids(offline)
        assert diag["assist"]["steps"][:2] == ["recognition: fallback (timeout after 0.2s)", "bridge: fallback (timeout after 0.2s)"]
        assert assist.breaker.state == "open"
        calls = len(fake.prompts)
        assert ids(retrieve(qsettings, QUESTION, top_k=5, assist=assist, diagnostics=diag)) == ids(offline)
        assert diag["assist"]["steps"] == ["recognition: skipped (breaker open)", "bridge: skipped (breaker open)"]
        time.sleep(1.0)
        assert len(fake.prompts) == calls  # an open breaker sends nothing


@pytest.fixture(scope="module")
def qsettings(sample_settings):
    return sample_settings


@pytest.mark.services
def test_assisted_retrieval_against_the_local_llm_server(qsettings, llm_server):  # noqa: F811
    """The real server: both steps are sent and answered (a 270M model's choices are not judged), tokens
    are counted, at most 3 retrievals, and a stopped server falls back to the offline ranking."""
    base_url, model = llm_server
    with OpenAIProxy(base_url) as proxy:
        assist = RetrievalAssist(client(proxy.base_url, model, timeout=120), timeout=120)
        diag: dict = {}
        chunks = retrieve(qsettings, QUESTION, top_k=5, assist=assist, diagnostics=diag)
    assert chunks and 1 <= diag["assist"]["rounds"] <= 3
    assert any(p.startswith("Question:") and "Candidate facts" in p for p in proxy.prompts)
    assert sum("Passages retrieved so far" in p for p in proxy.prompts) <= 2
    usage = {u["operation"]: u for u in diag["assist"]["usage"]}
    assert usage["recognition"]["prompt_tokens"] > 0 and usage["recognition"]["completion_tokens"] > 0
    offline = retrieve(qsettings, QUESTION, top_k=5)
    with OpenAIProxy(base_url, stop_when=lambda p: True) as proxy:
        assist = RetrievalAssist(client(proxy.base_url, model, timeout=30), timeout=30)
        assert ids(retrieve(qsettings, QUESTION, top_k=5, assist=assist, diagnostics=diag)) == ids(offline)
    assert all("fallback" in s for s in diag["assist"]["steps"])
