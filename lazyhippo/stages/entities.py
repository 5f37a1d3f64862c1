"""The `entities` asset (with relations, mentions and facts): the SQL models of `dbt_like_sql/` over the
extracted rows, merges re-applied, long descriptions summarized when an LLM is configured."""

from __future__ import annotations

import duckdb

from lazyhippo.settings import Settings
from lazyhippo.stages.common import record_usage
from lazyhippo.stages.reports import summarize_graph_descriptions
from lazyhippo.stages.results import GraphTablesResult
from lazyhippo.stores.warehouse import chunk_relations, count, name_keys, run_sql_model


def build_graph_tables(settings: Settings, con: duckdb.DuckDBPyConnection, llm=None,
                       run_id: str | None = None) -> GraphTablesResult:
    """The SQL models, in dependency order: the kept entities filter relations, mentions and facts. With an
    LLM, long entity and relation descriptions are then summarized (map-reduce, cached)."""
    from lazyhippo.stages.merge import apply_merges, summarize_merges

    name_keys(con, settings.namespace)
    chunk_relations(con, settings.namespace, settings.relations_per_chunk)
    for m in ("entities", "relations", "mentions", "facts"):
        run_sql_model(con, m, settings.namespace)
    merged = apply_merges(con, settings.namespace)  # recorded entity merges, folded in again
    counts = {t: count(con, t, settings.namespace) for t in ("entities", "relations", "mentions", "facts")}
    counts["merged_entities"] = merged
    if llm is None:
        return GraphTablesResult(**counts)
    before = llm.meter.snapshot()
    try:
        summarized = summarize_graph_descriptions(settings, con, llm)
        summarize_merges(settings, con, llm)  # after them: a merged target is described from every merged name
    finally:
        usage = record_usage(con, settings.namespace, run_id, llm, before)
    return GraphTablesResult(**counts, **summarized, llm_usage=usage)
