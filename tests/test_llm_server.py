"""The LLM path against a real OpenAI-compatible server: llama.cpp serving Gemma 3 270M on loopback
(`scripts/services.sh start llm`). Quality from a 270M model is poor; these tests check the plumbing:
what lands where, what is cached, what is cited, and how failures end a run."""

from __future__ import annotations

import re

import pytest

from lazyhippo.index import run_index
from lazyhippo.models.extractors import ExtractionCache, LlmExtractor
from lazyhippo.models.llm import LLMConfig, LLMError, LLMUnavailable, OpenAIChat
from lazyhippo.query import answer_question
from lazyhippo.settings import Settings
from lazyhippo.stages.chunks import build_chunks
from lazyhippo.stages.documents import ingest_documents
from lazyhippo.stages.exports import batches
from lazyhippo.stages.extractions import run_extractions
from lazyhippo.stores.warehouse import WriterSession, connect
from tests.loopback import OpenAIProxy
from tests.services_fixtures import llm_server  # noqa: F401 - fixture

pytestmark = pytest.mark.services

DOCS = {
    "marlow.txt": "Ada Fenwick founded the Marlow Observatory in 1931 above the town of Keswick. Her student "
                  "Tomas Reyes succeeded Ada Fenwick as director of the Marlow Observatory in 1958.",
    "reyes.txt": "Tomas Reyes was born in Valencia in 1920. Tomas Reyes studied astronomy with Ada Fenwick and "
                 "discovered the comet Reyes-Lin with Mei Lin.",
}


def client(base_url: str, model: str, **kw) -> OpenAIChat:
    return OpenAIChat(LLMConfig(model, base_url=base_url, api_key="none", **{"timeout": 300, "max_retries": 1,
                                                                           "backoff_max": 1.0, **kw}))


def corpus(tmp_path, docs: dict[str, str]):
    src = tmp_path / "src"
    src.mkdir()
    for name, text in docs.items():
        (src / name).write_text(text)
    return src


@pytest.fixture(scope="module")
def indexed(llm_server, tmp_path_factory):  # noqa: F811
    base_url, model = llm_server
    tmp = tmp_path_factory.mktemp("llm_index")
    settings = Settings(home=tmp / "home", source=str(corpus(tmp, DOCS)), extractor="llm", llm_model=model)
    llm = client(base_url, model)
    out = run_index(settings, llm=llm)
    return settings, llm, out


def test_llm_extraction_lands_in_the_graph(indexed):
    settings, llm, out = indexed
    assert out["extractions"].computed == 2 and out["extractions"].failed == 0
    text = " ".join(DOCS.values()).lower()
    with connect(settings, read_only=True) as con:
        extracted = [n for (n,) in con.execute("SELECT name FROM entities WHERE type <> 'TITLE'").fetchall()]
        usage = con.execute("SELECT stage, sum(prompt_tokens), sum(completion_tokens) FROM token_usage "
                            "GROUP BY stage").fetchall()
    assert extracted and all(n.lower() in text for n in extracted)  # parsed, grounded, in the graph
    per_op = {stage: (p, c) for stage, p, c in usage}
    assert per_op["extraction"][0] > 0 and per_op["extraction"][1] > 0
    assert "reports" in per_op  # every operation that called the model is counted under its name


def _exported(settings: Settings, table: str):
    """`table` as the exports stream it."""
    import pyarrow as pa

    with connect(settings, read_only=True) as con:
        return pa.Table.from_batches(list(batches(con, table, settings.namespace, 1000)))


def test_the_model_relations_are_typed(indexed):
    """Every relation has a type in upper snake case, in the table and the export (the 270M model gives few
    relations of its own: the typed relations of a model are shown with a stub in test_llm_extraction)."""
    settings, _, _ = indexed
    with connect(settings, read_only=True) as con:
        raw = [t for (t,) in con.execute("SELECT type FROM extracted_relations").fetchall()]
        types = [t for (t,) in con.execute("SELECT type FROM relations").fetchall()]
    assert raw and types and all(re.fullmatch(r"[A-Z][A-Z0-9_]*", t) for t in raw + types)
    exported = _exported(settings, "relations")
    assert sorted(exported.column("type").to_pylist()) == sorted(types)


def test_community_report_has_every_field_and_is_exported(indexed):
    settings, _, out = indexed
    with connect(settings, read_only=True) as con:
        reports = con.sql("SELECT * FROM community_reports").to_arrow_table().to_pylist()
        chunk_ids = {c for (c,) in con.execute("SELECT chunk_id FROM chunks").fetchall()}
        names = {n for (n,) in con.execute("SELECT name FROM entities").fetchall()}
        summaries = dict(con.execute("SELECT community_id, title FROM community_summaries").fetchall())
    assert reports, out["community_summaries"]
    import json

    for r in reports:
        assert r["title"] and r["summary"] and r["rating_reason"] and 0 <= r["rating"] <= 10
        assert len(r["questions"]) == 3 and all(q.strip() for q in r["questions"])
        findings = json.loads(r["findings"])
        assert findings
        for f in findings:  # every finding cites entities or chunks that exist
            assert f["entities"] or f["chunk_ids"]
            assert set(f["entities"]) <= names and set(f["chunk_ids"]) <= chunk_ids
        assert summaries[r["community_id"]] == r["title"]  # the global route reads the report
    exported = _exported(settings, "community_reports")
    assert exported.num_rows == len(reports)


@pytest.mark.parametrize("route", ["local", "global"])
def test_llm_answer_cites_only_chunks_in_its_context(indexed, route):
    settings, llm, _ = indexed
    res = answer_question(settings, "Who founded the Marlow Observatory?", route=route, llm=llm)
    assert res.llm == llm.model and res.answer
    context_ids = {c.chunk_id for c in res.context}
    assert {c["chunk_id"] for c in res.citations} <= context_ids
    valid = {c.n for c in res.context}
    assert all(int(n) in valid for n in re.findall(r"\[(\d+)\]", res.answer))  # others were removed...
    assert isinstance(res.diagnostics["citations_removed"], int)               # ...and counted
    assert {u["operation"] for u in res.usage} >= {"answer"}


def test_chat_carries_history(indexed):
    settings, llm, _ = indexed
    sent: list[list[dict]] = []
    real = llm.complete

    def recording(prompt, **kw):
        sent.append(prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}])
        return real(prompt, **kw)

    llm.complete = recording
    try:
        first = answer_question(settings, "Who founded the Marlow Observatory?", route="local", llm=llm)
        history = [{"role": "user", "content": first.question}, {"role": "assistant", "content": first.answer}]
        sent.clear()
        second = answer_question(settings, "Where was her student born?", route="local", llm=llm, history=history)
    finally:
        del llm.complete
    answer_call = sent[-1]
    assert answer_call[1:3] == history  # after the system turn, the conversation so far, then the question
    assert second.history == history and "Where was her student born?" in answer_call[-1]["content"]
    assert second.diagnostics["search_question"] != second.question  # the follow-up was made standalone


def test_wrong_model_name_is_a_clear_error(llm_server, tmp_path):  # noqa: F811
    base_url, model = llm_server
    with pytest.raises(LLMError, match=r"'no-such-model' is not served .*" + re.escape(model)):
        client(base_url, "no-such-model").complete("hello")
    settings = Settings(home=tmp_path / "home", source=str(corpus(tmp_path, DOCS)), extractor="llm")
    with pytest.raises(LLMError, match="no-such-model"):
        extract(settings, client(base_url, "no-such-model"))


def extract(settings: Settings, llm: OpenAIChat) -> dict:
    """The per-document stages only (documents, chunks, extractions): the failure cases are about them, so
    the extractor asks for short replies (a 270M model writes slowly)."""
    with WriterSession(settings, "test") as writer, writer.connect() as con:  # published when it succeeds
        ingest_documents(settings, con)
        build_chunks(settings, con)
        return run_extractions(settings, con, llm=llm, extractor=LlmExtractor(llm, max_entities=2, max_relations=1))


def _cached(settings: Settings) -> int:
    cache = ExtractionCache(settings.cache_dir / "extractions.sqlite")
    try:
        return cache._con.execute("SELECT count(*) FROM packed").fetchone()[0]
    finally:
        cache.close()


def test_server_stopped_mid_run_fails_cleanly_and_resumes_from_cache(llm_server, tmp_path):  # noqa: F811
    base_url, model = llm_server
    docs = {"a.txt": "Mei Lin worked at the Keswick Museum.", "b.txt": "Ada Fenwick lived in Keswick.",
            "c.txt": "Tomas Reyes visited Valencia."}
    settings = Settings(home=tmp_path / "home", source=str(corpus(tmp_path, docs)), extractor="llm", llm_model=model)
    passages: list[str] = []

    def second_chunk(prompt: str) -> bool:  # the "server" stops when the second chunk is asked for
        passage = prompt.rsplit("Passage:", 1)[-1]
        if passage not in passages:
            passages.append(passage)
        return len(passages) > 1

    with OpenAIProxy(base_url, stop_when=second_chunk) as proxy:
        with pytest.raises(LLMUnavailable, match="unavailable"):
            extract(settings, client(proxy.base_url, model, concurrency=1))
    assert _cached(settings) == 1  # what finished before the stop is kept
    with OpenAIProxy(base_url) as proxy:  # "restarted"
        ex = extract(settings, client(proxy.base_url, model, concurrency=1))
    assert ex.cached == 1 and ex.computed == 2 and ex.failed == 0
    assert sum(p.startswith("You extract") for p in proxy.prompts) == 2  # only what was missing
    assert _cached(settings) == 3


def test_malformed_json_is_retried_then_recorded_as_failed(llm_server, tmp_path):  # noqa: F811
    base_url, model = llm_server
    docs = {"good.txt": "Mei Lin worked at the Keswick Museum.", "poison.txt": "Ada Fenwick lived in Keswick."}
    settings = Settings(home=tmp_path / "home", source=str(corpus(tmp_path, docs)), extractor="llm", llm_model=model)
    with OpenAIProxy(base_url, corrupt=lambda p: p.startswith("You extract") and "Ada Fenwick lived" in p) as proxy:
        ex = extract(settings, client(proxy.base_url, model))
    assert ex.computed == 1 and ex.failed == 1
    assert sum("Ada Fenwick lived" in p for p in proxy.prompts if p.startswith("You extract")) == 3
    assert "malformed extraction JSON after 3 attempts" in next(iter(ex.failures.values()))
    with connect(settings, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM extraction_failures").fetchone()[0] == 1
