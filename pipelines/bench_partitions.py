"""`lazyhippo bench partitions`: what one run over many document partitions costs Dagster's event log on a local
(SQLite) instance like the one `lazyhippo index` uses, with assets that do nothing: Dagster's own
`SqliteEventLogStorage` against `BatchedSqliteEventLogStorage` (pipelines/event_log.py), in one run, as a ratio.
Figures are returned unrounded, so ratios agree with the times they come from; the CLI rounds them for display."""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import dagster as dg

from lazyhippo_dagster.event_log import enable_event_batches

ASSETS = 2        # probe assets partitioned by document
INDEX_ASSETS = 3  # documents, chunks, extractions
STORAGES = {"stock": None, "batched": "BatchedSqliteEventLogStorage"}


def probe_assets() -> tuple[dg.DynamicPartitionsDefinition, list[dg.AssetsDefinition]]:
    """Two assets partitioned by document that do nothing: what is left is Dagster's cost per partition."""
    parts = dg.DynamicPartitionsDefinition(name="bench_documents")

    @dg.asset(partitions_def=parts)
    def probe_a() -> None:
        return None

    @dg.asset(partitions_def=parts, deps=[probe_a])
    def probe_b() -> None:
        return None

    return parts, [probe_a, probe_b]


def _sqlite(storage: str | None) -> Callable[[str], dict]:
    return lambda tmp: {} if storage is None else {
        "event_log_storage": {"module": "lazyhippo_dagster.event_log", "class": storage,
                              "config": {"base_dir": str(Path(tmp) / "history" / "runs")}}}


def _probe(documents: int, overrides: Callable[[str], dict]) -> float:
    """Seconds of one run over `documents` partitions on an instance with `overrides(tmp_dir)`."""
    parts, (probe_a, probe_b) = probe_assets()
    keys = [f"bench-{uuid.uuid4().hex[:8]}/d_{i:08d}" for i in range(documents)]  # unique in a shared database
    with tempfile.TemporaryDirectory() as tmp, dg.instance_for_test(temp_dir=tmp, overrides=overrides(tmp)) as instance:
        instance.add_dynamic_partitions(parts.name, keys)
        t0 = time.perf_counter()
        result = dg.materialize([probe_a, probe_b], instance=instance, tags={
            "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
        seconds = time.perf_counter() - t0
        recorded = len(instance.get_materialized_partitions(probe_b.key) & set(keys))
        for key in keys:
            instance.delete_dynamic_partition(parts.name, key)
    if not result.success or recorded != documents:
        raise RuntimeError(f"bench partitions run failed ({recorded} of {documents} partitions recorded)")
    return seconds


def run_partition_bench(documents: int, project_documents: int) -> dict:
    """One run over a range of `documents` dynamic partitions of two no-op assets on each event log, and what the
    batched one projects for a full index of `project_documents` documents with three document-partitioned assets."""
    enable_event_batches()
    out: dict = {"documents": documents, "project_documents": project_documents}
    for name, storage in STORAGES.items():
        seconds = _probe(documents, _sqlite(storage))
        out[name] = {"seconds": seconds, "ms_per_partition_and_asset": seconds / (documents * ASSETS) * 1000,
                     "projected_index_seconds": seconds / (documents * ASSETS) * project_documents * INDEX_ASSETS}
    out["speedup"] = out["stock"]["seconds"] / out["batched"]["seconds"]
    return out


def postgres_event_cost(documents: int, storage: dict) -> dict:
    """The same probe on a PostgreSQL instance (`storage`: its dagster.yaml `storage` block), against the batched
    SQLite log of the embedded instance: ms per partition and asset on each, and their ratio."""
    enable_event_batches()
    pg = _probe(documents, lambda tmp: {"storage": storage}) / (documents * ASSETS) * 1000
    sqlite = _probe(documents, _sqlite(STORAGES["batched"])) / (documents * ASSETS) * 1000
    return {"documents": documents, "postgres_ms_per_partition_and_asset": pg,
            "sqlite_ms_per_partition_and_asset": sqlite, "postgres_over_sqlite": pg / sqlite}


PAGE_PREVIEW_ROWS = 5
RUN_QUERY = "query($id: ID!) { runOrError(runId: $id) { ... on Run { runId status tags { key value } assetSelection { path } } } }"
LOGS_QUERY = """query($id: ID!, $after: String) { logsForRun(runId: $id, afterCursor: $after, limit: 1000) {
  ... on EventConnection { cursor hasMore events { __typename ... on MessageEvent { message timestamp level stepKey eventType }
    ... on MaterializationEvent { assetKey { path } partition metadataEntries { label description __typename
      ... on TableMetadataEntry { table { records schema { columns { name type description
        constraints { nullable unique other } tags { key value } } constraints { other } } } }
      ... on MarkdownMetadataEntry { mdStr } ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text } } }
    ... on AssetMaterializationPlannedEvent { assetKey { path } } } } } }"""


def _page_probe(documents: int, preview) -> dict:
    """One run over `documents` partitions of the three per-document assets' shape, each partition carrying a
    row count and a 5-row preview made by `preview`; then the run page's queries (the run, every event page)."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import EmptyWorkspaceTarget
    from dagster_graphql.test.utils import execute_dagster_graphql

    from lazyhippo_dagster.assets.metadata import per_document

    parts = dg.DynamicPartitionsDefinition(name="bench_documents")
    rows = [(p, "Section", 200, "A chunk's first hundred and twenty characters, as the chunks asset previews them for one "
                                "document partition.") for p in range(PAGE_PREVIEW_ROWS)]

    def probe(name: str, dep: str | None):
        @dg.asset(name=name, partitions_def=parts, deps=[dep] if dep else [])
        def _probe(context) -> None:
            per_document(context, {k: k for k in context.partition_keys},
                         lambda _: {"dagster/row_count": PAGE_PREVIEW_ROWS, "preview": preview(rows, ["pos", "section", "tokens", "text"])})
        return _probe

    assets = [probe("documents", None), probe("chunks", "documents"), probe("extractions", "chunks")]
    keys = [f"bench/doc_{i:06d}.txt" for i in range(documents)]
    with tempfile.TemporaryDirectory() as tmp, dg.instance_for_test(temp_dir=tmp, overrides={"event_log_storage": {
            "module": "lazyhippo_dagster.event_log", "class": "BatchedSqliteEventLogStorage",
            "config": {"base_dir": str(Path(tmp) / "history" / "runs")}}}) as instance:
        instance.add_dynamic_partitions(parts.name, keys)
        t0 = time.perf_counter()
        result = dg.materialize(assets, instance=instance, tags={
            "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
        run_seconds = time.perf_counter() - t0
        with WorkspaceProcessContext(instance, EmptyWorkspaceTarget()) as workspace:
            context = workspace.create_request_context()
            t0 = time.perf_counter()
            execute_dagster_graphql(context, RUN_QUERY, {"id": result.run_id})
            events, after = 0, None
            while True:
                out = execute_dagster_graphql(context, LOGS_QUERY, {"id": result.run_id, "after": after})
                if out.errors:
                    raise RuntimeError(f"run page query failed: {out.errors[0]}")
                page = out.data["logsForRun"]
                events, after = events + len(page["events"]), page["cursor"]
                if not page["hasMore"]:
                    break
            page_seconds = time.perf_counter() - t0
    return {"run_seconds": run_seconds, "page_seconds": page_seconds, "events": events}


def run_page_bench(documents: int) -> dict:
    """What opening the page of one run over `documents` document partitions costs the webserver (the GraphQL
    the UI sends: the run, then every page of its events), with each partition's preview as a typed table and
    as the Markdown table the per-document assets record."""
    from lazyhippo_dagster.assets.metadata import md_table, table

    enable_event_batches()
    out: dict = {"documents": documents, "table": _page_probe(documents, table), "markdown": _page_probe(documents, md_table)}
    out["speedup"] = out["table"]["page_seconds"] / out["markdown"]["page_seconds"]
    return out
