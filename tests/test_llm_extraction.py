"""The optional LLM extractor: structured JSON, retries on malformed output, failures recorded, cache reuse."""

from __future__ import annotations

import json

import pytest

from lazyhippo.index import run_index
from lazyhippo.settings import Settings
from lazyhippo.stores.warehouse import connect
from tests.loopback import FakeOpenAI

GOOD = {"entities": [{"name": "Ada Fenwick", "type": "PERSON", "description": "An astronomer."},
                     {"name": "Marlow Observatory", "type": "ORG", "description": "An observatory."}],
        "relations": [{"source": "Ada Fenwick", "target": "Marlow Observatory", "description": "Ada Fenwick founded it.",
                       "weight": 3}]}


REPORT = {"title": "Founders of the observatory", "summary": "Ada Fenwick founded the Marlow Observatory.",
          "rating": 12, "rating_reason": "Central to the corpus.", "questions": ["Who?", "What?", "When?"],
          "findings": [{"summary": "A founding", "explanation": "Ada Fenwick founded it.", "entities": ["Ada Fenwick"],
                        "chunks": [1, 7]},
                       {"summary": "Uncited", "explanation": "Cites nothing that exists.", "entities": ["Nobody"],
                        "chunks": [9]}]}


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
        if prompt.startswith("You write a report"):
            return json.dumps(REPORT)
        if not prompt.startswith("You extract a knowledge graph"):
            return "A merged description."
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
            usage = con.execute("SELECT sum(prompt_tokens) FROM token_usage WHERE stage = 'extraction'").fetchone()[0]
            failed = con.execute("SELECT count(*) FROM extraction_failures").fetchone()[0]
            titles = {t for (t,) in con.execute("SELECT title FROM community_summaries").fetchall()}
        assert {"Ada Fenwick", "Marlow Observatory", "Founding"} <= names  # the title is an entity too
        assert usage == 500 and failed == 1  # every call is counted, the failed attempts too
        assert "Founders of the observatory" in titles  # the report's title when an endpoint is configured
        with connect(s, read_only=True) as con:
            rating, findings = con.execute("SELECT rating, findings FROM community_reports").fetchone()
        findings = json.loads(findings)
        assert rating == 10.0 and len(findings) == 1  # clamped to 0-10; the finding citing nothing real dropped
        assert findings[0]["entities"] == ["Ada Fenwick"] and len(findings[0]["chunk_ids"]) == 1
        calls = sum(p.startswith("You extract") for p in server.prompts)
        again = run_index(s)
        # the cached chunk is not sent again; only the failed chunk is retried
        assert again["extractions"].cached == 1
        assert sum(p.startswith("You extract") for p in server.prompts) == calls + 3


def test_llm_relations_are_typed_in_the_table_and_the_export(tmp_path, monkeypatch):
    """The model's relation types, normalized to upper snake case (unusable ones RELATED_TO), reach the relations
    table with the direction the passage states, and the export."""
    from lazyhippo.stages.exports import export_tables

    src = tmp_path / "src"
    src.mkdir()
    (src / "eastbridge.txt").write_text("Ada Fenwick founded the Marlow Observatory. The Marlow Observatory lies in "
                                        "Eastbridge. Ada Fenwick met Tomas Reyes.")
    ents = [{"name": n, "type": t, "description": n} for n, t in (("Ada Fenwick", "PERSON"), ("Eastbridge", "GPE"),
                                                                  ("Marlow Observatory", "ORG"), ("Tomas Reyes", "PERSON"))]
    rels = [{"source": "Marlow Observatory", "target": "Ada Fenwick", "type": "founded by", "description": "f", "weight": 5},
            {"source": "Marlow Observatory", "target": "Eastbridge", "type": "LOCATED_IN", "description": "l", "weight": 5},
            {"source": "Ada Fenwick", "target": "Tomas Reyes", "type": "!! 42", "description": "m", "weight": 5}]

    def reply(prompt: str) -> str:
        if prompt.startswith("You extract a knowledge graph"):
            assert "PART_OF, LOCATED_IN" in prompt  # the vocabulary is offered
            return json.dumps({"entities": ents, "relations": rels})
        return "A description."

    with FakeOpenAI(reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        s = Settings.from_env(home=tmp_path / "home", source=str(src), extractor="llm", llm_model="fake-model")
        run_index(s)
    with connect(s, read_only=True) as con:
        rows = con.execute("""SELECT a.name, b.name, r.type, r.forward FROM relations r
            JOIN entities a ON a.namespace = r.namespace AND a.entity_id = r.source_id
            JOIN entities b ON b.namespace = r.namespace AND b.entity_id = r.target_id""").fetchall()
        export_tables(con, "default", "csv", ["relations"], tmp_path / "out")
    typed = {(a, b) if fwd else (b, a): t for a, b, t, fwd in rows}
    assert typed[("Marlow Observatory", "Ada Fenwick")] == "FOUNDED_BY"
    assert typed[("Marlow Observatory", "Eastbridge")] == "LOCATED_IN"
    assert {t for (a, b), t in typed.items() if {a, b} == {"Ada Fenwick", "Tomas Reyes"}} == {"RELATED_TO"}
    exported = (tmp_path / "out" / "relations.csv").read_text()
    assert "FOUNDED_BY" in exported and "LOCATED_IN" in exported and exported.splitlines()[0].count("type") == 1
