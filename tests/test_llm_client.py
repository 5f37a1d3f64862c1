"""The LLM client and the LLM stages' logic, against scripted loopback servers and fakes (no model)."""

from __future__ import annotations

import threading
import time

import pytest

from lazyhippo.models.llm import (
    Completion,
    LLMConfig,
    LLMError,
    LLMUnavailable,
    MalformedOutput,
    OpenAIChat,
    parallel_map,
    parse_json,
)
from lazyhippo.query.answer import bound_history, check_citations
from lazyhippo.stages.summaries import DescriptionParams, summarize_descriptions
from lazyhippo.stores.cache import JsonCache
from tests.loopback import LoopbackJSONServer


def _reply(body: dict, text: str) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def _client(server, **kw) -> OpenAIChat:
    return OpenAIChat(LLMConfig("m", base_url=server.root + "/v1", api_key="k",
                                **{"timeout": 5, "max_retries": 3, "backoff_max": 0.05, **kw}))


def test_retries_with_backoff_on_429_and_5xx_then_succeeds():
    statuses = [429, 503, 200]

    def route(path, body):
        status = statuses.pop(0)
        return (status, _reply(body, "ok")) if status == 200 else (status, {"error": {"message": "busy"}})

    with LoopbackJSONServer(route) as server:
        llm = _client(server)
        assert llm.complete("hi", operation="answer").text == "ok"
        assert len(server.requests) == 3 and not statuses
        assert llm.meter.since({}) == [{"operation": "answer", "model": "m", "calls": 1, "prompt_tokens": 7,
                                        "completion_tokens": 3}]


def test_gives_up_as_unavailable_and_rejects_without_retrying():
    with LoopbackJSONServer(lambda p, b: (500, {"error": {"message": "down"}})) as server:
        with pytest.raises(LLMUnavailable, match="after 3 attempts"):
            _client(server, max_retries=2).complete("hi")
        assert len(server.requests) == 3
    with LoopbackJSONServer(lambda p, b: (401, {"error": {"message": "bad key"}})) as server:
        with pytest.raises(LLMError, match="rejected the API key"):
            _client(server).complete("hi")
        assert len(server.requests) == 1


def test_steps_down_from_json_schema_to_json_mode_to_the_tolerant_parser():
    def route(path, body):
        fmt = body.get("response_format", {}).get("type")
        if fmt:
            return 400, {"error": {"message": f"response_format {fmt} is not supported"}}
        return 200, _reply(body, 'Sure! ```json\n{"answer": "yes", "score": 80,}\n```')

    with LoopbackJSONServer(route) as server:
        llm = _client(server)
        data, _ = llm.complete_json("q", {"type": "object"}, operation="answer")
        assert data == {"answer": "yes", "score": 80}
        kinds = [r.get("response_format", {}).get("type") for r in server.requests]
        assert kinds == ["json_schema", "json_object", None]
        llm.complete_json("q", {"type": "object"}, operation="answer")  # remembered: no more refused formats
        assert [r.get("response_format") for r in server.requests[3:]] == [None]


def test_malformed_json_is_retried_warmer_then_raised():
    with LoopbackJSONServer(lambda p, b: (200, _reply(b, "{broken"))) as server:
        with pytest.raises(MalformedOutput, match="after 3 attempts"):
            _client(server).complete_json("q", {"type": "object"}, operation="extraction")
        assert [r["temperature"] for r in server.requests] == [0.0, 0.4, 0.8]


def test_concurrency_is_bounded():
    live, peak, lock = [0], [0], threading.Lock()

    def route(path, body):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return 200, _reply(body, "ok")

    with LoopbackJSONServer(route) as server:
        llm = _client(server, concurrency=2)
        out = parallel_map(lambda i: llm.complete(str(i)).text, range(8), workers=6)
        assert out == ["ok"] * 8 and peak[0] == 2


def test_parallel_map_stops_calling_after_a_fatal_error():
    calls = []

    def fn(i):
        calls.append(i)
        if i == 1:
            raise LLMUnavailable("down")
        return i

    out = parallel_map(fn, range(5), workers=1, stop_on=LLMError)
    assert out[0] == 0 and all(isinstance(o, LLMUnavailable) for o in out[1:]) and calls == [0, 1]


def test_parse_json_is_tolerant_but_not_blind():
    assert parse_json('noise {"a": "x}y", "b": [1, 2,],} trailing') == {"a": "x}y", "b": [1, 2]}
    for bad in ("no json here", '{"a": 1', "[1, 2]"):
        with pytest.raises(ValueError):
            parse_json(bad)


class _CountingLLM:
    model = "fake"

    def __init__(self):
        self.prompts: list[str] = []

    def complete(self, prompt, **kw):
        self.prompts.append(prompt)
        return Completion(f"summary {len(self.prompts)}", self.model, 1, 1)


def test_description_map_reduce_joins_short_batches_long_recurses_and_caches(tmp_path):
    cache = JsonCache(tmp_path / "c.sqlite")
    llm = _CountingLLM()
    assert summarize_descriptions(llm, "the entity", "X", ["a b", "c d", "a b"], cache) == "a b | c d"
    assert not llm.prompts  # under the thresholds: joined, no call
    many = [f"fact number {i} about the thing, with some words" for i in range(40)]
    p = DescriptionParams(join_tokens=30, join_count=3, batch_tokens=60, max_depth=3)
    out = summarize_descriptions(llm, "the entity", "X", many, cache, p)
    first = len(llm.prompts)
    assert first > 3 and out.startswith("summary")  # batches, then their summaries summarized
    assert all(len(pr) < 1200 for pr in llm.prompts)  # each call within the batch limit
    assert summarize_descriptions(llm, "the entity", "X", many, cache, p) == out and len(llm.prompts) == first  # cached
    shallow = summarize_descriptions(_CountingLLM(), "the entity", "Y", many, cache, DescriptionParams(
        join_tokens=30, join_count=3, batch_tokens=60, max_depth=1))
    assert shallow.count("|") >= 1  # depth limit reached: joined and cut, no further rounds
    cache.close()


def test_history_is_bounded_newest_first_and_validated():
    turns = [{"role": "user", "content": "one " * 50}, {"role": "assistant", "content": "two " * 50},
             {"role": "user", "content": "three"}]
    assert bound_history(turns, 60) == turns[1:]
    assert bound_history(turns, 1000) == turns
    with pytest.raises(ValueError, match="role"):
        bound_history([{"role": "system", "content": "x"}], 100)


def test_citations_outside_the_context_are_removed_and_counted():
    assert check_citations("A [1]. B [7][2]. C [3, 9].", {1, 2, 3}) == ("A [1]. B [2]. C [3].", [1, 2, 3], 2)


def test_llm_extractor_without_an_endpoint_is_a_clear_error():
    from lazyhippo.settings import Settings
    from lazyhippo.stages.extractions import make_extractor

    with pytest.raises(ValueError, match="extractor 'llm' needs an LLM endpoint"):
        make_extractor(Settings(extractor="llm", llm="none"))
