"""The benchmark asset checks pass on the sample index and fail on contexts/graphs built to violate them."""

from __future__ import annotations

import json
import shutil

import dagster as dg
import pytest

from lazyhippo.evaluate.quality import (
    context_quality,
    record_evaluation,
    retrieval_outcome,
    skip_reason,
    theme_coverage,
    themes_outcome,
)
from lazyhippo.index import run_index
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.warehouse import connect
from lazyhippo_dagster.assets.checks_quality import context_quality_check, retrieval_quality_check, theme_coverage_check
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource

EMBEDDED = GraphStoreResource(kind="embedded")


def _ctx(chunks, tokens=100, citations=1):
    return {"context": chunks, "context_tokens": tokens, "citations": [{"n": i + 1} for i in range(citations)]}


def test_context_quality_fails_on_duplicates_budget_noise_and_missing_citations():
    a = {"text": "Ada Fenwick founded the observatory.", "noise": None}
    b = {"text": "Tomas Reyes succeeded her.", "noise": None}
    assert context_quality([_ctx([a, b])], budget=200).passed
    dup = context_quality([_ctx([a, dict(a)])], budget=200)
    assert not dup.passed and dup.figures["duplicate_chunk_share"] == 0.5
    assert not context_quality([_ctx([a, b], tokens=500)], budget=200).passed
    noisy = context_quality([_ctx([a, {"text": "Name: ____", "noise": "form labels"}])], budget=200, max_noise_share=0.25)
    assert not noisy.passed and noisy.figures["noise_chunk_share"] == 0.5
    assert not context_quality([_ctx([a, b], citations=0)], budget=200).passed
    assert not context_quality([], budget=200).passed


def test_theme_coverage_and_retrieval_floor():
    cov, missing = theme_coverage("The Marlow Observatory and ADA FENWICK.", ["Marlow Observatory", "Ada Fenwick", "River Sell"])
    assert cov == pytest.approx(2 / 3) and missing == ["River Sell"]
    assert not themes_outcome([("q", "nothing here", ["River Sell"])], 0.9).passed
    assert themes_outcome([("q", "the river sell", ["River Sell"])], 0.9).passed
    ok = retrieval_outcome([("q", ["A", "B", "C"], ["A", "C"])], floor=0.9)
    assert ok.passed and ok.figures["recall_at_5"] == 1.0
    assert not retrieval_outcome([("q", ["X", "Y"], ["A", "C"])], floor=0.5).passed
    by_id = retrieval_outcome([("q", ["m-2", "m-7", "m-1"], ["m-1", "m-2"])], floor=0.9)  # ids: titles may repeat
    assert by_id.passed and by_id.figures["recall_at_2"] == 0.5 and by_id.figures["all_supporting_at_8"] == 1.0


def evaluate(check, res: LazyhippoResource) -> dg.AssetCheckResult | None:
    """The check's result; None when it yields none (a check that does not apply: Dagster shows it Skipped)."""
    out = check(lazyhippo=res, graph_store=EMBEDDED)
    return out if isinstance(out, dg.AssetCheckResult) else next(iter(out or ()), None)


def test_checks_pass_on_the_sample_index(sample_settings):
    res = LazyhippoResource(home=str(sample_settings.home), source=str(SAMPLE_CORPUS))
    for check in (context_quality_check, theme_coverage_check, retrieval_quality_check):
        result = evaluate(check, res)
        assert result.passed, (check.name, result.metadata)
    ctx = evaluate(context_quality_check, res)  # nothing changed since: asked again, it evaluates again
    assert ctx.metadata["duplicate_chunk_share"].value == 0
    assert ctx.metadata["over_budget_contexts"].value == 0


def test_a_query_check_drops_the_query_index_it_built(sample_settings):
    """The index a check's queries build is of the run's own graph: it does not stay beside the run's later
    steps."""
    from lazyhippo.query import loader

    res = LazyhippoResource(home=str(sample_settings.home), source=str(SAMPLE_CORPUS))
    for check in (context_quality_check, theme_coverage_check, retrieval_quality_check):
        loader.clear_cache()
        assert evaluate(check, res) is not None, check.name  # it evaluated: its queries ran on a query index
        assert not loader._CACHE, check.name


def test_checks_fail_on_a_corpus_built_to_violate_them(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_CORPUS, src)
    (src / "themes.json").write_text(json.dumps([{"question": "What are the themes?",
                                                   "themes": ["quantum chromodynamics", "medieval falconry"]}]))
    (src / "questions.json").write_text(json.dumps([{"question": "Who founded the Marlow Observatory?",
                                                     "supporting_titles": ["No Such Passage", "Another Missing One"]}]))
    settings = Settings(home=tmp_path / "home", source=str(src))
    run_index(settings)
    res = LazyhippoResource(home=str(settings.home), source=str(src))
    themes = evaluate(theme_coverage_check, res)
    assert not themes.passed and themes.metadata["theme_coverage"].value == 0
    recall = evaluate(retrieval_quality_check, res)
    assert not recall.passed and recall.metadata["recall_at_5"].value == 0
    tight = LazyhippoResource(home=str(settings.home), source=str(src), noise_share_max=-1.0)
    assert not evaluate(context_quality_check, tight).passed


def test_a_query_check_waits_after_a_small_change_and_evaluates_after_a_large_one(tmp_path):
    """The query checks' cost is the whole query index: under 5% of the documents changed since the last
    evaluation they skip, at 5% or more (or other parameters, or nothing changed) they evaluate."""
    settings = Settings(home=tmp_path)
    docs = [(f"d{i:02d}", f"h{i}") for i in range(60)]
    with connect(settings) as con:
        con.executemany("INSERT INTO documents (namespace, doc_id, source, content_hash, sections) VALUES "
                        "('default', ?, ?, ?, '[]')", [(d, f"{d}.txt", h) for d, h in docs])
        assert skip_reason(con, "default", "c", "p") is None  # never evaluated
        record_evaluation(con, "default", "c", "p")
        assert skip_reason(con, "default", "c", "p") is None  # nothing changed: evaluated when asked
        con.execute("UPDATE documents SET content_hash = 'new' WHERE doc_id = 'd00'")
        assert "1 of 60 documents changed" in skip_reason(con, "default", "c", "p")
        assert skip_reason(con, "default", "c", "other parameters") is None
        con.execute("DELETE FROM documents WHERE doc_id = 'd01'")
        assert skip_reason(con, "default", "c", "p") is not None  # 2 of 59: still under 5%
        con.execute("INSERT INTO documents (namespace, doc_id, source, content_hash, sections) VALUES "
                    "('default', 'd99', 'd99.txt', 'h', '[]')")
        assert skip_reason(con, "default", "c", "p") is None  # 3 of 60: enough changed
        record_evaluation(con, "default", "c", "p")
        assert skip_reason(con, "default", "c", "p") is None


def test_a_check_without_its_questions_beside_the_source_yields_no_result(sample_settings, tmp_path):
    """No themes.json or questions.json beside the source: no result at all, never a pass."""
    lone = tmp_path / "lone.txt"
    lone.write_text("Nothing to ask about.")
    res = LazyhippoResource(home=str(sample_settings.home), source=str(lone))
    assert evaluate(theme_coverage_check, res) is None and evaluate(retrieval_quality_check, res) is None
