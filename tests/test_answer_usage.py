"""LLM tokens of answers and chat recorded in the home's `token_usage` table (usage.sqlite) from every surface:
the query job (with its run id), `lazyhippo chat` (one id per conversation) and the servers."""

from __future__ import annotations

import httpx
from typer.testing import CliRunner

from lazyhippo.serve.pool import IndexPool
from lazyhippo.settings import Settings
from lazyhippo.stores.usage import answer_usage, record_answer_usage
from lazyhippo_dagster.cli import app
from lazyhippo_dagster.runner import execute, run_config
from tests.loopback import FakeOpenAI
from tests.test_chat import FOLLOW_UP, HISTORY, _reply
from tests.test_serve import home, running  # noqa: F401 - fixture

ANSWERED = [{"namespace": "default", "operation": "answer", "model": "fake-model", "rows": 1, "prompt_tokens": 100,
             "completion_tokens": 20}]


def test_answers_record_their_tokens_on_every_surface(home, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("LAZYHIPPO_LLM", raising=False)
    with FakeOpenAI(_reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        cfg = run_config({"lazyhippo": {"home": str(home), "llm_model": "fake-model"}},
                         ops={"answer_question": {"config": {"question": "Who founded the Marlow Observatory?",
                                                             "route": "local"}}})
        run = execute("query", home, cfg)
        assert run.success
        assert answer_usage(home, run_id=run.run_id) == ANSWERED

        monkeypatch.setenv("LAZYHIPPO_LLM_MODEL", "fake-model")
        out = CliRunner().invoke(app, ["chat", "--home", str(home), "--route", "local"],
                                 input="Who founded the Marlow Observatory?\nWho succeeded her?\n\n")
        assert out.exit_code == 0, out.output

        pool = IndexPool(Settings(home=home, llm="openai", llm_model="fake-model"), settle_seconds=0.3).start()
        try:
            with running(pool) as url:
                r = httpx.post(f"{url}/api/query", json={"question": FOLLOW_UP, "route": "local", "history": HISTORY},
                               timeout=120)
                assert r.status_code == 200
        finally:
            pool.stop()
    import sqlite3

    rows = sqlite3.connect(home / "usage.sqlite").execute(
        "SELECT run_id, stage, prompt_tokens, completion_tokens FROM token_usage ORDER BY recorded_at, rowid").fetchall()
    job, chat_first, chat_rewrite, chat_answer, http_rewrite, http_answer = rows
    assert job == (run.run_id, "answer", 100, 20)
    assert chat_first[0].startswith("chat-") and chat_first[0] == chat_rewrite[0] == chat_answer[0]
    assert {chat_first[1], chat_rewrite[1], chat_answer[1]} == {"answer", "chat"}  # the follow-up was rewritten
    assert http_rewrite[0] is None and {http_rewrite[1], http_answer[1]} == {"chat", "answer"}
    total = {u["operation"]: u["rows"] for u in answer_usage(home, "default")}
    assert total == {"answer": 4, "chat": 2}


def test_a_failed_usage_write_never_fails_the_answer(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the home should be")
    usage = [{"operation": "answer", "model": "m", "prompt_tokens": 1, "completion_tokens": 1}]
    assert record_answer_usage(blocked, "default", None, usage) == 0
    assert record_answer_usage(tmp_path, "default", None, usage) == 1 and answer_usage(tmp_path)[0]["rows"] == 1
