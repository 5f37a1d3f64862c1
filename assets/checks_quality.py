"""Benchmark asset checks: context quality, theme coverage and retrieval quality on the indexed corpus.

Not blocking (they run queries); the completeness audit is the blocking suite. Queries rank on whichever
graph store serves the graph (its PPR backend), so the figures hold for either store. A query needs the whole
query index built, so after a small change since a check's last evaluation the check waits for more change
(`quality.skip_reason`): an update of a few documents does not pay for a full index build.
"""

import json
from contextlib import contextmanager
from typing import Iterator

import dagster as dg

from lazyhippo.evaluate.quality import (
    context_quality,
    probe_questions,
    record_evaluation,
    retrieval_outcome,
    skip_reason,
    source_file,
    themes_outcome,
)
from lazyhippo.sources.files import sha
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import check_result, table
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource


def _beside_source(settings, name: str) -> list | None:
    """The JSON file `name` beside the indexed source, or None (the check then yields no result: Skipped)."""
    path = source_file(settings, name)
    return json.loads(path.read_text()) if path else None


def _optional(name: str, asset: str, description: str) -> dict:
    """A check that may not apply: it yields no result then, which Dagster shows as Skipped, never as Passed."""
    return dict(specs=[dg.AssetCheckSpec(name, asset=asset, partitions_def=namespaces, description=description)],
                can_subset=True, op_tags=WAREHOUSE_TAGS, name=name)


def _result(lazyhippo: LazyhippoResource, name: str, params: str, outcome, tables: dict) -> dg.AssetCheckResult:
    """The check's result, its evaluation recorded (what `_due` compares with next time)."""
    with lazyhippo.warehouse() as con:
        record_evaluation(con, lazyhippo.settings().namespace, name, params)
    return check_result(outcome, tables, dg.AssetCheckSeverity.WARN)


def _due(lazyhippo: LazyhippoResource, name: str, params: str) -> bool:
    """Whether the check evaluates now (else it yields no result, logged with why: Skipped)."""
    with lazyhippo.warehouse() as con:
        reason = skip_reason(con, lazyhippo.settings().namespace, name, params)
    if reason:
        dg.get_dagster_logger().info(f"skipped: {reason}")
    return reason is None


@contextmanager
def _queries() -> Iterator[None]:
    """Where a check runs its queries: the query index they build is of the run's own graph, which nothing reads
    after the check, so it is dropped when they are done instead of staying beside the run's later steps
    (exports, the snapshot): about 600 MB at 10,000 documents. A second check of the run builds it again."""
    from lazyhippo.query import clear_cache
    from lazyhippo.stages.common import give_back_memory

    try:
        yield
    finally:
        clear_cache()
        give_back_memory()


def _params(*values) -> str:
    return sha(json.dumps(values, sort_keys=True, default=str), 16)


@dg.multi_asset_check(**_optional("context_quality_check", "community_summaries",
                                   "Assembled contexts on a fixed query set: no duplicate chunk, within budget, few "
                                   "noise chunks, cited."))
def context_quality_check(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource):
    from lazyhippo.query import answer_question

    settings = lazyhippo.settings()
    lazyhippo.read_work()  # the run's own graph, not the last published one
    params = _params(lazyhippo.check_budget, lazyhippo.noise_share_max, _beside_source(settings, "questions.json"))
    if not _due(lazyhippo, "context_quality_check", params):
        return
    ppr = graph_store.store.ppr_backend(settings.namespace)
    with _queries():
        results = [answer_question(settings, q, route="auto", budget=lazyhippo.check_budget, llm=None, ppr=ppr).to_dict()
                   for q in probe_questions(settings)]
    outcome = context_quality(results, lazyhippo.check_budget, lazyhippo.noise_share_max)
    rows = [(r["question"], r["route"], len(r["context"]), r["context_tokens"], len(r["citations"])) for r in results]
    yield _result(lazyhippo, "context_quality_check", params, outcome,
                  {"queries_run": table(rows, ["question", "route", "chunks", "tokens", "citations"])})


@dg.multi_asset_check(**_optional("theme_coverage_check", "community_summaries",
                                   "Global questions (themes.json beside the source): share of expected themes in the context."))
def theme_coverage_check(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource):
    from lazyhippo.query import answer_question

    settings = lazyhippo.settings()
    lazyhippo.read_work()  # the run's own graph, not the last published one
    items = _beside_source(settings, "themes.json")
    if items is None:
        dg.get_dagster_logger().info("skipped: no themes.json beside the source")
        return
    params = _params(lazyhippo.check_budget, lazyhippo.theme_coverage_min, items)
    if not _due(lazyhippo, "theme_coverage_check", params):
        return
    per_q = []
    ppr = graph_store.store.ppr_backend(settings.namespace)
    with _queries():
        for item in items:
            res = answer_question(settings, item["question"], route="global", budget=lazyhippo.check_budget, llm=None, ppr=ppr)
            per_q.append((item["question"], res.context_text, item["themes"]))
    outcome = themes_outcome(per_q, lazyhippo.theme_coverage_min)
    yield _result(lazyhippo, "theme_coverage_check", params, outcome, {
        "per_question": table([(r["question"], round(r["coverage"], 2), ", ".join(r["missing"])) for r in outcome.details],
                              ["question", "coverage", "missing themes"])})


@dg.multi_asset_check(**_optional("retrieval_quality_check", "community_summaries",
                                   "recall@5 of the local route on questions.json (or questions_dev.json) beside the source, "
                                   "by passage id when the questions carry supporting_ids, against a floor."))
def retrieval_quality_check(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource):
    from lazyhippo.evaluate.bench import gold_key, passage_id
    from lazyhippo.query import retrieve

    settings = lazyhippo.settings()
    lazyhippo.read_work()  # the run's own graph, not the last published one
    questions = _beside_source(settings, "questions.json") or _beside_source(settings, "questions_dev.json")
    if questions is None:
        dg.get_dagster_logger().info("skipped: no questions.json beside the source")
        return
    params = _params(lazyhippo.recall_at_5_min, questions)
    if not _due(lazyhippo, "retrieval_quality_check", params):
        return
    field = gold_key(questions)
    key = (lambda c: passage_id(c.source)) if field == "supporting_ids" else (lambda c: c.title)
    ppr = graph_store.store.ppr_backend(settings.namespace)
    with _queries():
        rankings = [(q["question"], [key(c) for c in retrieve(settings, q["question"], route="local", top_k=8, ppr=ppr)],
                     q[field]) for q in questions]
    outcome = retrieval_outcome(rankings, lazyhippo.recall_at_5_min)
    yield _result(lazyhippo, "retrieval_quality_check", params, outcome, {
        "per_question": table([(r["question"], round(r["recall_at_5"], 2), ", ".join(r["retrieved"])) for r in outcome.details],
                              ["question", "recall@5", "top 5"])})
