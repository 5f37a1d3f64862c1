"""Conversation history through the query job's config, `lazyhippo chat`, the HTTP API and the MCP tool to the LLM
(also the local llama.cpp server, in French), and token usage as metadata, in the body and in response headers."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from mcp.client import Client
from typer.testing import CliRunner

from lazyhippo.serve.mcp import build_server
from lazyhippo.serve.pool import IndexPool
from lazyhippo.settings import Settings
from lazyhippo_dagster.cli import app
from lazyhippo_dagster.runner import execute, run_config
from tests.loopback import FakeOpenAI, OpenAIProxy
from tests.services_fixtures import llm_server  # noqa: F401 - fixture
from tests.test_mcp import _payload
from tests.test_serve import running

HISTORY = [{"role": "user", "content": "Who founded the Marlow Observatory?"},
           {"role": "assistant", "content": "Ada Fenwick founded it [1]."}]


def test_query_job_carries_history_and_reports_token_usage(sample_settings, tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("LAZYHIPPO_LLM", raising=False)

    def reply(prompt: str) -> str:
        if prompt.startswith("Rewrite the last question"):
            return "Who succeeded Ada Fenwick as director of the Marlow Observatory?"
        return "Tomas Reyes succeeded her [1][42]."

    with FakeOpenAI(reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        cfg = run_config({"lazyhippo": {"home": str(sample_settings.home), "llm_model": "fake-model"}},
                         ops={"answer_question": {"config": {"question": "Who succeeded her?", "route": "local",
                                                             "history": HISTORY}}})
        result = execute("query", sample_settings.home, cfg)
    assert result.success
    data = result.output_for_node("answer_question")
    answer_call = server.requests[-1]["messages"]
    assert answer_call[1:3] == HISTORY and "Who succeeded her?" in answer_call[-1]["content"]
    assert data["history"] == HISTORY and data["diagnostics"]["search_question"].startswith("Who succeeded Ada")
    assert "Tomas Reyes" in {c["title"] for c in data["context"]}  # retrieval used the standalone question
    assert data["answer"] == "Tomas Reyes succeeded her [1]." and data["diagnostics"]["citations_removed"] == 1
    assert {(u["operation"], u["prompt_tokens"]) for u in data["usage"]} == {("chat", 100), ("answer", 100)}
    meta = next(e for e in result.all_events if e.event_type_value == "STEP_OUTPUT").event_specific_data.metadata
    assert meta["llm_prompt_tokens"].value == 200 and meta["history_turns"].value == 2
    assert meta["llm_usage"].schema.columns[0].name == "operation"


def test_chat_cli_carries_history_offline(sample_settings, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = CliRunner().invoke(app, ["chat", "--home", str(sample_settings.home), "--route", "local"],
                             input="Who founded the Marlow Observatory?\nWho succeeded her as director?\n\n")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "0 earlier turns sent" in text and "2 earlier turns sent" in text
    assert "Tomas Reyes" in text.split("2 earlier turns sent")[0].rsplit("lazyhippo>", 1)[-1]



def test_chat_cli_takes_the_query_settings(sample_settings, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    home = str(sample_settings.home)
    out = CliRunner().invoke(app, ["chat", "--home", home, "--route", "local", "--chunk-selection", "weight",
                                   "--max-related-chunks", "1"], input="Who founded the Marlow Observatory?\n\n")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "rerank off" in text and text.count("(c_") == 1 and "[2]" not in text  # one related chunk, cited
    bad = CliRunner().invoke(app, ["chat", "--home", home, "--chunk-selection", "random"], input="\n")
    said = " ".join(bad.output.replace("│", " ").split())
    assert bad.exit_code == 2 and "--chunk-selection" in said and "'random' is not one of" in said

# ---------------------------------------------------------------- every surface sends the history to the LLM

FOLLOW_UP = "Who succeeded her?"


def _reply(prompt: str) -> str:
    if prompt.startswith("Rewrite the last question"):
        return "Who succeeded Ada Fenwick as director of the Marlow Observatory?"
    return "Tomas Reyes succeeded her [1]."


def _llm_pool(sample_settings, monkeypatch, base_url: str, model: str) -> IndexPool:
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    settings = Settings(home=sample_settings.home, llm="openai", llm_model=model)
    return IndexPool(settings, settle_seconds=0.3, poll_seconds=0.1).start()


def test_the_http_api_sends_the_history_to_the_llm_and_reports_tokens_in_headers(sample_settings, monkeypatch):
    with FakeOpenAI(_reply) as server:
        pool = _llm_pool(sample_settings, monkeypatch, server.base_url, "fake-model")
        try:
            with running(pool) as url:
                r = httpx.post(f"{url}/api/query", json={"question": FOLLOW_UP, "route": "local", "history": HISTORY},
                               timeout=120)
        finally:
            pool.stop()
    assert r.status_code == 200, r.text
    answer_call = server.requests[-1]["messages"]
    assert answer_call[1:3] == HISTORY and FOLLOW_UP in answer_call[-1]["content"]
    data = r.json()
    assert data["history"] == HISTORY and data["answer"].startswith("Tomas Reyes")
    assert {(u["operation"], u["model"], u["prompt_tokens"], u["completion_tokens"]) for u in data["usage"]} == \
        {("chat", "fake-model", 100, 20), ("answer", "fake-model", 100, 20)}
    assert data["tokens"] == {"input": 200, "output": 40}
    assert r.headers["X-Token-Input"] == "200" and r.headers["X-Token-Output"] == "40"


def test_the_mcp_answer_tool_sends_the_history_to_the_llm(sample_settings, monkeypatch):
    async def call(pool, **args) -> object:
        async with Client(build_server(pool)) as client:
            return await client.call_tool("lazyhippo_answer", args)

    with FakeOpenAI(_reply) as server:
        pool = _llm_pool(sample_settings, monkeypatch, server.base_url, "fake-model")
        try:
            out = _payload(asyncio.run(call(pool, question=FOLLOW_UP, history=HISTORY, route="local")))
            bad = asyncio.run(call(pool, question=FOLLOW_UP, history=[{"role": "system", "content": "x"}]))
        finally:
            pool.stop()
    answer_call = server.requests[-1]["messages"]
    assert answer_call[1:3] == HISTORY and FOLLOW_UP in answer_call[-1]["content"]
    assert out["answer"] == "Tomas Reyes succeeded her [1]." and out["history_turns"] == 2
    assert out["citations"][0]["n"] == 1 and out["tokens"] == {"input": 200, "output": 40}
    assert bad.is_error and "role 'user' or 'assistant'" in bad.content[0].text


@pytest.mark.services
def test_a_french_question_with_history_reaches_the_local_llm_server(sample_settings, llm_server, monkeypatch):  # noqa: F811
    """Through the HTTP API to the real llama.cpp server (a proxy records what it is sent): the system prompt asks
    for the question's language, the French turns and question arrive as sent, the answer and its tokens come back."""
    base_url, model = llm_server
    history = [{"role": "user", "content": "Qui a fondé l'Observatoire de Marlow ?"},
               {"role": "assistant", "content": "Ada Fenwick l'a fondé en 1931 [1]."}]
    question = "Qui lui a succédé comme directeur ?"
    with OpenAIProxy(base_url) as proxy:
        pool = _llm_pool(sample_settings, monkeypatch, proxy.base_url, model)
        try:
            with running(pool) as url:
                r = httpx.post(f"{url}/api/query", json={"question": question, "route": "local", "top_k": 3,
                                                         "budget": 1500, "history": history}, timeout=600)
        finally:
            pool.stop()
    assert r.status_code == 200, r.text
    data = r.json()
    sent = proxy.requests[-1]["messages"]
    assert sent[0]["role"] == "system" and "in the language of the question" in sent[0]["content"]
    assert sent[1:3] == history and sent[-1]["content"].endswith(f"Question: {question}\nAnswer:")
    assert data["answer"] and data["llm"] == model and data["history"] == history
    assert {u["operation"] for u in data["usage"]} == {"chat", "answer"}
    assert int(r.headers["X-Token-Input"]) == sum(u["prompt_tokens"] for u in data["usage"]) > 0
    assert int(r.headers["X-Token-Output"]) == sum(u["completion_tokens"] for u in data["usage"]) > 0
