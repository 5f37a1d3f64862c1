"""Conversation history through the query job's config and `lazyhippo chat`, and token usage as metadata."""

from __future__ import annotations

from typer.testing import CliRunner

from lazyhippo_dagster.cli import app
from lazyhippo_dagster.runner import execute, run_config
from tests.loopback import FakeOpenAI

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
