"""The optional LLM extractor: structured JSON, retries on malformed output, failures recorded, cache reuse."""

from __future__ import annotations

import json

import pytest

from lazyhippo.config import Settings
from lazyhippo.index import run_index
from lazyhippo.warehouse import connect

from .loopback import FakeOpenAI

GOOD = {"entities": [{"name": "Ada Fenwick", "type": "PERSON", "description": "An astronomer."},
                     {"name": "Marlow Observatory", "type": "ORG", "description": "An observatory."}],
        "relations": [{"source": "Ada Fenwick", "target": "Marlow Observatory", "description": "Ada Fenwick founded it.",
                       "weight": 3}]}


@pytest.fixture
def corpus(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "founding.txt").write_text("Ada Fenwick founded the Marlow Observatory in 1931.")
    (src / "poison.txt").write_text("This passage always gets a broken answer.")
    return src


def test_llm_extractor_retries_records_failures_and_uses_cache(tmp_path, corpus, monkeypatch):
    attempts: dict[str, int] = {}

    def reply(prompt: str) -> str:
        if not prompt.startswith("You extract a knowledge graph"):
            return "TITLE: Founders of the observatory\nSUMMARY: Ada Fenwick founded the Marlow Observatory."
        key = "poison" if "broken answer" in prompt else "founding"
        attempts[key] = attempts.get(key, 0) + 1
        if key == "poison":
            return "{not json at all"
        return "```json\n{\"entities\": [" if attempts[key] == 1 else json.dumps(GOOD)  # malformed once, then valid

    with FakeOpenAI(reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        s = Settings.from_env(home=tmp_path / "home", source=str(corpus), extractor="llm", llm_model="fake-model")
        out = run_index(s)
        ex = out["extractions"]
        assert ex.computed == 1 and ex.failed == 1
        assert attempts == {"founding": 2, "poison": 3}
        assert "malformed" in next(iter(ex.failures.values()))
        with connect(s, read_only=True) as con:
            names = {n for (n,) in con.execute("SELECT name FROM entities WHERE namespace = 'default'").fetchall()}
            usage = con.execute("SELECT sum(prompt_tokens) FROM token_usage WHERE stage = 'extractions'").fetchone()[0]
            failed = con.execute("SELECT count(*) FROM extraction_failures").fetchone()[0]
            titles = {t for (t,) in con.execute("SELECT title FROM community_summaries").fetchall()}
        assert {"Ada Fenwick", "Marlow Observatory", "Founding"} <= names  # the title is an entity too
        assert usage == 200 and failed == 1
        assert "Founders of the observatory" in titles  # LLM summaries when an endpoint is configured
        calls = sum(p.startswith("You extract") for p in server.prompts)
        again = run_index(s)
        # the cached chunk is not sent again; only the failed chunk is retried
        assert again["extractions"].cached == 1
        assert sum(p.startswith("You extract") for p in server.prompts) == calls + 3
