"""The `knn_edges` asset: `SEMANTICALLY_SIMILAR` edges between entities whose vectors are close (top k
above a cosine cutoff), recomputed only for what changed."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from lazyhippo.settings import Settings
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.results import KnnResult
from lazyhippo.stores.graphs import GraphStore
from lazyhippo.stores.warehouse import insert_rows, read_stored_vectors, release_cache, replace_rows, transaction


def build_knn_edges(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore) -> KnnResult:
    """On a store that searches in process, only the entities whose neighbour lists can have changed since the
    recorded search are searched again (incremental.plan_knn). The vectors stay in their int8 form, the edges are
    held as index columns and go to the warehouse a block of entities at a time, after the search index is freed."""
    from lazyhippo.graph.algorithms import StoredVectors, knn_batches, knn_stale_sources
    from lazyhippo.stages.incremental import knn_inputs, plan_knn, write_inputs

    ns, k, cutoff = settings.namespace, settings.knn_top_k, settings.knn_cutoff
    ids, codes, scales = read_stored_vectors(con, ns, "entity")
    vectors = StoredVectors(codes, scales)  # unit rows made on demand: cosines on every store alike
    incremental = store.exact_knn and settings.knn_structural == "off"  # structural vectors move with the graph
    plan = plan_knn(con, ns, knn_inputs(con, ns, k, cutoff)) if incremental else None
    rows = redo = None
    if plan is not None:
        rows = knn_stale_sources(ids, vectors, k, cutoff, plan.changed, plan.previous)
        redo = [ids[i] for i in rows] + sorted(plan.changed)
    del plan  # it and the inputs hold strings for every entity: read again for the record after the search
    release_cache(con)  # the blocks those reads left in DuckDB's cache go before the search's own arrays
    if incremental:  # in process; edges as index columns (32 bytes an edge), the index gone before the writes
        batches = list(knn_batches(vectors, k, cutoff, rows))
        names = pa.array(ids, pa.string())
        tables = (pa.table({"source_id": names.take(b.sources), "target_id": names.take(b.targets),
                            "score": pa.array(b.scores, pa.float64()), "rank": pa.array(b.ranks, pa.int64())})
                  for b in batches)
    else:  # the store's own search (GDS, structural vectors) takes every vector at once
        edges = store.knn(ns, ids, vectors, k, cutoff, settings.knn_structural)
        tables = [pa.table({"source_id": pa.array([e.source for e in edges], pa.string()),
                            "target_id": pa.array([e.target for e in edges], pa.string()),
                            "score": pa.array([e.score for e in edges], pa.float64()),
                            "rank": pa.array([e.rank for e in edges], pa.int64())})]
    del vectors, codes, scales
    with transaction(con):
        replace_rows(con, "knn_edges", ns, None,
                     *(() if redo is None else ("AND source_id IN (SELECT unnest(?))", [redo])))
        for table in tables:
            insert_rows(con, "knn_edges", with_namespace(table, ns))
        # a heuristic or structural search leaves no basis for an update
        write_inputs(con, ns, "knn_edges", knn_inputs(con, ns, k, cutoff) if incremental else {})
    n, low, mean = con.execute("SELECT count(*), coalesce(min(score), 0), coalesce(avg(score), 0) FROM knn_edges "
                               "WHERE namespace = ?", [ns]).fetchall()[0]
    return KnnResult(edges=n, entities=len(ids), top_k=k, cutoff=cutoff, score_min=low, score_mean=mean,
                     searched=len(ids) if rows is None else len(rows))
