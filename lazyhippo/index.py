"""Every indexing stage in order, by the name of the asset it materializes: `run_stage` (what a Dagster
asset calls) and `run_index` (the library entry point, no Dagster). The stages themselves live in `stages/`."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import duckdb

from lazyhippo.settings import Settings
from lazyhippo.stages.chunks import build_chunks
from lazyhippo.stages.common import Progress, give_back_memory, resolve_llm
from lazyhippo.stages.communities import build_communities
from lazyhippo.stages.community_summaries import build_community_summaries
from lazyhippo.stages.documents import ingest_documents
from lazyhippo.stages.embeddings import build_embeddings
from lazyhippo.stages.entities import build_graph_tables
from lazyhippo.stages.exports import export_parquet
from lazyhippo.stages.extractions import run_extractions
from lazyhippo.stages.knn_edges import build_knn_edges
from lazyhippo.stages.results import StageResult
from lazyhippo.stores.graphs import GraphStore
from lazyhippo.stores.namespaces import record_namespace
from lazyhippo.stores.objects import ObjectStore
from lazyhippo.stores.warehouse import count


def graph_counts(con: duckdb.DuckDBPyConnection, namespace: str) -> dict:
    return {t: count(con, t, namespace) for t in ("documents", "chunks", "entities", "relations", "mentions",
                                                  "knn_edges", "communities", "community_summaries")}


def _stages(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore, objects: ObjectStore | None,
            progress: Progress | None, run_id: str, llm=None, extractor=None,
            only: frozenset[str] | None = None) -> dict[str, Callable[[], StageResult]]:
    """Every indexing stage by the name of the asset it materializes, in dependency order; `only` scopes the
    per-document stages to some documents."""
    return {
        "documents": lambda: ingest_documents(settings, con, only),
        "chunks": lambda: build_chunks(settings, con, only),
        "extractions": lambda: run_extractions(settings, con, extractor, progress=progress, run_id=run_id, llm=llm),
        "entities": lambda: build_graph_tables(settings, con, llm, run_id),   # with relations, mentions, facts
        "embeddings": lambda: build_embeddings(settings, con),
        "knn_edges": lambda: build_knn_edges(settings, con, store),
        "communities": lambda: build_communities(settings, con, store),
        "community_summaries": lambda: build_community_summaries(settings, con, run_id, llm),
        "exports": lambda: export_parquet(settings, con, objects, run_id),
    }


STAGE_NAMES = ("documents", "chunks", "extractions", "entities", "embeddings", "knn_edges", "communities",
               "community_summaries", "exports")
GRAPH_STAGES = STAGE_NAMES[STAGE_NAMES.index("entities"):]  # rebuilt from the per-document tables (index, delete)


def run_stage(asset: str, settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore,
              objects: ObjectStore | None = None, progress: Progress | None = None,
              run_id: str = "library", llm=None, extractor=None, only: frozenset[str] | None = None) -> StageResult:
    """One stage, then the graph store's sync of what it produced: the one place syncing happens, so a stage
    cannot leave the served graph stale. The sync's figures come back as `synced`."""
    result = _stages(settings, con, store, objects, progress, run_id, llm, extractor, only)[asset]()
    give_back_memory()  # the next stage starts from the run's base, not from this stage's peak
    if asset == "documents":  # the home now holds the namespace: record how it is indexed
        record_namespace(settings)
    return replace(result, synced=store.sync(con, settings.namespace, asset))


def sync_all(store: GraphStore, con: duckdb.DuckDBPyConnection, namespace: str) -> None:
    """Push an index built earlier (e.g. on the embedded store) to `store`, asset by asset."""
    for asset in STAGE_NAMES:
        store.sync(con, namespace, asset)


def run_index(settings: Settings, store: GraphStore | None = None, objects: ObjectStore | None = None,
              progress: Progress | None = None, run_id: str = "library", llm="auto", extractor=None) -> dict:
    """Every stage in order, without Dagster: the library entry point (the bench uses it too). `llm`:
    "auto" (the LLM the settings choose, else offline), None (offline) or a client."""
    from lazyhippo.stores.graphs import EmbeddedGraphStore
    from lazyhippo.stores.objects import LocalObjectStore
    from lazyhippo.stores.warehouse import WriterSession

    store = store or EmbeddedGraphStore()
    objects = objects or LocalObjectStore(settings.export_dir)
    llm = resolve_llm(settings, llm)
    out: dict = {}
    timings = out["seconds"] = {}
    with WriterSession(settings, run_id) as writer, writer.connect() as con:
        for i, name in enumerate(STAGE_NAMES):
            if progress:
                progress("index", i, len(STAGE_NAMES))
            t0 = time.perf_counter()
            out[name] = run_stage(name, settings, con, store, objects, progress, run_id, llm, extractor)
            timings[name] = round(time.perf_counter() - t0, 2)
        if progress:
            progress("index", len(STAGE_NAMES), len(STAGE_NAMES))
    return out
