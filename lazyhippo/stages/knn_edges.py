"""The `knn_edges` asset: `SEMANTICALLY_SIMILAR` edges between entities whose vectors are close (top k
above a cosine cutoff), recomputed only for what changed."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from lazyhippo.settings import Settings
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.results import KnnResult
from lazyhippo.stores.graphs import GraphStore
from lazyhippo.stores.warehouse import read_vectors, replace_rows, transaction


def build_knn_edges(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore) -> KnnResult:
    """On a store with the exact search, only the entities whose neighbour lists can have changed since the
    recorded search are searched again (incremental.plan_knn); the edges are those of a full search."""
    from lazyhippo.graph.algorithms import knn_edges, knn_stale_sources
    from lazyhippo.models.embedders import normalize
    from lazyhippo.stages.incremental import knn_inputs, plan_knn, write_inputs

    ns, k, cutoff = settings.namespace, settings.knn_top_k, settings.knn_cutoff
    ids, vectors = read_vectors(con, ns, "entity")
    vectors = normalize(vectors)  # stored int8 rows are only about unit length: cosines on every store alike
    inputs = knn_inputs(con, ns, k, cutoff)
    incremental = store.exact_knn and settings.knn_structural == "off"  # structural vectors move with the graph
    plan = plan_knn(con, ns, inputs) if incremental else None
    if plan is None:
        edges, redo = store.knn(ns, ids, vectors, k, cutoff, settings.knn_structural), None
    else:
        rows = knn_stale_sources(ids, vectors, k, cutoff, plan.changed, plan.previous)
        edges, redo = knn_edges(ids, vectors, k, cutoff, rows), [ids[i] for i in rows] + sorted(plan.changed)
    # by columns: a dict per edge cost more than the edges themselves (700,000 at 10,000 documents)
    table = pa.table({"source_id": pa.array([e.source for e in edges], pa.string()),
                      "target_id": pa.array([e.target for e in edges], pa.string()),
                      "score": pa.array([e.score for e in edges], pa.float64()),
                      "rank": pa.array([e.rank for e in edges], pa.int64())}) if edges else None
    del edges
    with transaction(con):
        replace_rows(con, "knn_edges", ns, with_namespace(table, ns) if table else None,
                     *(() if redo is None else ("AND source_id IN (SELECT unnest(?))", [redo])))
        write_inputs(con, ns, "knn_edges", inputs if incremental else {})  # a heuristic or structural search: no basis
    n, low, mean = con.execute("SELECT count(*), coalesce(min(score), 0), coalesce(avg(score), 0) FROM knn_edges "
                               "WHERE namespace = ?", [ns]).fetchall()[0]
    return KnnResult(edges=n, entities=len(ids), top_k=k, cutoff=cutoff, score_min=low, score_mean=mean,
                     searched=len(ids) if redo is None else len(rows))
