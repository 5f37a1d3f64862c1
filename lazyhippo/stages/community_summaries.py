"""The `community_summaries` asset: an extractive summary of each community offline, a GraphRAG-style
report with an LLM."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import duckdb
import pyarrow as pa

from lazyhippo.models.embedders import get_embedder
from lazyhippo.settings import Settings
from lazyhippo.stages.common import record_usage, with_namespace
from lazyhippo.stages.embeddings import _embed_missing
from lazyhippo.stages.reports import build_community_reports
from lazyhippo.stages.results import SummariesResult
from lazyhippo.stages.summaries import MAX_HUBS, summarize_extractive
from lazyhippo.stores.warehouse import community_members, replace_rows


def build_community_summaries(settings: Settings, con: duckdb.DuckDBPyConnection, run_id: str | None = None,
                              llm=None) -> SummariesResult:
    """Extractive summaries for every community of every level; with an LLM, communities with a report take its title
    and summary, and the report with its questions is what gets embedded for the global route."""
    ns = settings.namespace
    # a summary reads its community's hubs only: DuckDB ranks every member and sends the top MAX_HUBS (and any
    # tied with the last), with the community's size, so Python never holds the members of the whole graph
    score = "s.pagerank * 1000 + e.degree"
    rows = community_members(con, ns, f"m.community_id, e.name, e.description, {score}, "
                                      "count(*) OVER (PARTITION BY m.community_id)",
                             qualify=f"rank() OVER (PARTITION BY m.community_id ORDER BY {score} DESC, e.name) <= {MAX_HUBS}")
    members: dict[str, list[dict]] = defaultdict(list)
    size: dict[str, int] = {}
    for c, name, desc, hub_score, n in rows:
        members[c].append({"name": name, "description": desc or "", "score": hub_score})
        size[c] = n
    summaries = [summarize_extractive(c, ms) for c, ms in members.items()]
    texts = {s.community_id: f"{s.title}\n{s.summary}" for s in summaries}
    reports, report_stats, usage = [], {}, []
    if llm is not None:
        before = llm.meter.snapshot()
        try:
            reports, report_stats = build_community_reports(settings, con, llm)
        finally:
            usage = record_usage(con, ns, run_id, llm, before)
        by_id = {r.community_id: r for r in reports}
        summaries = [replace(s, title=by_id[s.community_id].title, summary=by_id[s.community_id].summary)
                     if s.community_id in by_id else s for s in summaries]
        texts.update({r.community_id: r.text() for r in reports})
    else:
        replace_rows(con, "community_reports", ns, None)
    replace_rows(con, "community_summaries", ns, with_namespace(pa.Table.from_pylist([s.__dict__ for s in summaries]), ns) if summaries else None)
    embedder = get_embedder(settings.embedder, settings.embedding_model)
    embedded = _embed_missing(con, settings, "community", list(texts.items()), embedder)
    biggest = sorted(summaries, key=lambda s: -size[s.community_id])[:5]
    return SummariesResult(summaries=len(summaries), embedded=embedded, llm=llm.model if llm else "extractive",
                           llm_usage=usage, **report_stats,
                           preview=[{"community_id": s.community_id, "size": size[s.community_id],
                                     "title": s.title, "summary": s.summary[:200]} for s in biggest])
