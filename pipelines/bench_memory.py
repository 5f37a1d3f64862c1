"""`lazyhippo bench memory`: peak resident memory of the index stages, run one after another in this process on an
indexed home, as an index run runs them (docs/benchmarks.md, "Memory flat in corpus size"). Run it on a copy:
the stages rewrite the home's tables (the same rows for the same code).

    lazyhippo bench memory HOME [--namespace NAMESPACE]

Per step: this process's resident MB before it, its peak while it ran (with its children: the extraction
workers) and after it, and its seconds. The steps: documents; planning and extracting the batches (from the
extraction cache); collecting the extractions (every document again); the graph tables; embeddings of every
chunk, entity and fact; communities (as after a change: seeded from the stored partition); summaries; the
context check's queries on a query index built for them, then that index dropped; exports of every table;
publishing.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Callable

from lazyhippo.evaluate.quality import probe_questions
from lazyhippo.index import run_stage
from lazyhippo.query import answer_question, clear_cache
from lazyhippo.stages.common import give_back_memory
from lazyhippo.stages.extractions import collect_parts, extract_batch, plan_batches
from lazyhippo.stores.graphs import EmbeddedGraphStore
from lazyhippo.stores.namespaces import namespace_settings
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import connect, publish
from lazyhippo_dagster.bench_process import TreeRss


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 1e6


def stage_memory(home: Path, namespace: str, progress: Callable[[dict], None] = lambda _: None) -> list[dict]:
    """Per step: resident MB before it, the peak of this process and its children while it ran, after it, and its
    seconds; each row also goes to `progress` as it is measured."""
    settings = namespace_settings(home, namespace)
    store, objects, ns = EmbeddedGraphStore(), LocalObjectStore(settings.export_dir), settings.namespace
    run: dict = {}

    def extract(con):
        con.execute("DELETE FROM extraction_parts WHERE namespace = ?", [ns])  # every document planned again
        run["batches"], _ = plan_batches(settings, con, objects, "memory")
        run["stats"] = [{**extract_batch(settings, objects, b.keys), "batch": b} for b in run["batches"]]

    def embeddings(con):
        con.execute("DELETE FROM embeddings WHERE namespace = ? AND kind <> 'community'", [ns])  # as a first run
        run_stage("embeddings", settings, con, store, objects)

    def communities(con):
        con.execute("DELETE FROM stage_inputs WHERE namespace = ? AND stage = 'communities'", [ns])
        run_stage("communities", settings, con, store, objects)

    def exports(con):
        for key in objects.list(f"{ns}/tables/"):
            objects.delete(key)
        run_stage("exports", settings, con, store, objects, run_id=str(uuid.uuid4()))

    def check():
        ppr = store.ppr_backend(ns)
        for q in probe_questions(settings):
            answer_question(settings, q, route="auto", budget=8000, llm=None, ppr=ppr)
        clear_cache()
        give_back_memory()

    def warehouse(step):
        def in_warehouse():
            with connect(settings) as con:
                step(con)
        return in_warehouse

    steps = {
        "documents": warehouse(lambda con: run_stage("documents", settings, con, store, objects)),
        "extraction batches": warehouse(extract),
        "collecting the extractions": warehouse(lambda con: collect_parts(settings, con, objects, run["batches"],
                                                                          run["stats"])),
        "graph tables": warehouse(lambda con: run_stage("entities", settings, con, store, objects)),
        "embeddings": warehouse(embeddings),
        "communities": warehouse(communities),
        "community summaries": warehouse(lambda con: run_stage("community_summaries", settings, con, store, objects)),
        "context check (query index)": check,
        "exports": warehouse(exports),
        "publishing": lambda: publish(settings),
    }
    rows = []
    for name, step in steps.items():
        before = resident_mb()
        with TreeRss(every=0.05) as rss:
            t0 = time.perf_counter()
            step()
            seconds = time.perf_counter() - t0
        rows.append({"step": name, "before MB": round(before), "peak MB": round(rss.peak / 1e6),
                     "after MB": round(resident_mb()), "seconds": round(seconds, 1)})
        progress(rows[-1])
    return rows
