"""Peak resident memory of the index stages, run one after another in this process on an indexed home, as an
index run runs them (docs/benchmarks.md, "Memory flat in corpus size"). Run it on a copy: the stages rewrite
the home's tables (the same rows for the same code).

    python scripts/stage_memory.py HOME [NAMESPACE]

Per step: this process's resident MB before it, its peak while it ran (with its children: the extraction
workers) and after it, and its seconds. The steps: documents; planning and extracting the batches (from the
extraction cache); collecting the extractions (every document again); the graph tables; embeddings of every
chunk, entity and fact; communities (as after a change: seeded from the stored partition); summaries; the
context check's queries on a query index built for them, then that index dropped; exports of every table;
publishing.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

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


def main(home: Path, namespace: str) -> None:
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
    print(f"{'step':28s} {'before':>7s} {'peak':>7s} {'after':>7s} {'seconds':>8s}")
    for name, step in steps.items():
        before = resident_mb()
        with TreeRss(every=0.05) as rss:
            t0 = time.perf_counter()
            step()
            seconds = time.perf_counter() - t0
        print(f"{name:28s} {before:7.0f} {rss.peak / 1e6:7.0f} {resident_mb():7.0f} {seconds:8.1f}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "default")
