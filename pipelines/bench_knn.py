"""`lazyhippo bench knn`: time and memory of the `knn_edges` stage on a home's entity vectors, and the recall of
one search against another.

    lazyhippo bench knn run HOME NAMESPACE [--exact-max N] [--edges OUT.parquet]   # a full search
    lazyhippo bench knn update HOME NAMESPACE --change 30 --add 20                  # vectors moved and added
    lazyhippo bench knn run HOME NAMESPACE --update                                 # the search after that
    lazyhippo bench knn recall EXACT.parquet OTHER.parquet                          # share of exact edges found
    lazyhippo bench knn synth HOME NAMESPACE OUT_HOME --copies 10 --noise 0.03      # tiled vectors (synthetic)

`run` and `update` change the home's `knn_edges` rows: run them on a copy. Peak RSS is the process's own (the
stage starts no child process); `--exact-max` sets KNN_EXACT_MAX for the run (0: always the approximate index).
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np


def _settings(home: Path, namespace: str):
    from lazyhippo.settings import Settings

    return Settings(home=Path(home), namespace=namespace)


def _figures(t0: float, c0: float, **extra) -> dict:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
            "peak_rss_mb": round(rss), "load": os.getloadavg(), **extra}


def run(home: Path, namespace: str, exact_max: int | None = None, edges: Path | None = None,
        update: bool = False) -> dict:
    """One search of the stage over the home's entity vectors; `update`: keep the recorded search (an update)."""
    from lazyhippo.graph import algorithms
    from lazyhippo.index import run_stage
    from lazyhippo.stores.graphs import EmbeddedGraphStore
    from lazyhippo.stores.warehouse import connect

    settings = _settings(home, namespace)
    default = algorithms.KNN_EXACT_MAX
    if exact_max is not None:  # for this run only: the CLI may run in a process that searches again (tests)
        algorithms.KNN_EXACT_MAX = exact_max
    try:
        with connect(settings) as con:
            if not update:  # without the recorded search, the stage searches every entity
                con.execute("DELETE FROM stage_inputs WHERE namespace = ? AND stage = 'knn_edges'", [namespace])
            t0, c0 = time.perf_counter(), time.process_time()
            out = run_stage("knn_edges", settings, con, EmbeddedGraphStore())
            figures = _figures(t0, c0, entities=out.entities, edges=out.edges, searched=out.searched,
                               top_k=out.top_k, cutoff=out.cutoff)
            if edges:
                con.execute("COPY (SELECT source_id, target_id, score FROM knn_edges WHERE namespace = ?) TO "
                            f"'{edges}' (FORMAT parquet)", [namespace])
    finally:
        algorithms.KNN_EXACT_MAX = default
    return figures


def move_vectors(home: Path, namespace: str, change: int, add: int, round_: int) -> None:
    """Gives `change` entities the vector of another and adds `add` copies of others (`run --update` next);
    `round_`: which entities (another round, other ones)."""
    from lazyhippo.stores.warehouse import connect

    with connect(_settings(home, namespace)) as con:
        ns = namespace
        ids = [r[0] for r in con.execute("SELECT item_id FROM embeddings WHERE namespace = ? AND kind = 'entity' "
                                         "ORDER BY hash(item_id || ?) LIMIT ?",
                                         [ns, round_, 2 * change + add]).fetchall()]
        moved, donors = ids[:change], ids[change:]
        for a, b in zip(moved, donors):
            con.execute("UPDATE embeddings SET vector = (SELECT vector FROM embeddings WHERE namespace = $ns "
                        "AND kind = 'entity' AND item_id = $b), text_hash = hash($tag) "
                        "WHERE namespace = $ns AND kind = 'entity' AND item_id = $a",
                        {"ns": ns, "a": a, "b": b, "tag": f"moved{round_}"})
        con.execute("INSERT INTO embeddings SELECT namespace, kind, item_id || $tag, model, vector, scale, hash($tag) "
                    "FROM embeddings WHERE namespace = $ns AND kind = 'entity' AND item_id IN (SELECT unnest($ids))",
                    {"ns": ns, "tag": f"_new{round_}", "ids": donors[change:]})


def recall(exact: Path, other: Path) -> dict:
    """The share of the exact search's edges (all, and those PPR walks: cosine 0.90 or more) another search found."""
    import duckdb

    q = """SELECT count(*), count(o.source_id), count(*) FILTER (e.score >= 0.9),
                  count(o.source_id) FILTER (e.score >= 0.9)
           FROM read_parquet(?) e LEFT JOIN read_parquet(?) o USING (source_id, target_id)"""
    n, found, n90, found90 = duckdb.connect().execute(q, [str(exact), str(other)]).fetchall()[0]
    return {"exact_edges": n, "found": round(found / n, 4), "exact_edges_0.90": n90,
            "found_0.90": round(found90 / n90, 4) if n90 else None}


def synth(home: Path, namespace: str, out: Path, copies: int, noise: float) -> int:
    """A synthetic home `out`: `copies` copies of every entity vector of `home`, each with Gaussian noise of
    `noise` per dimension; returns its number of vectors."""
    import pyarrow as pa

    from lazyhippo.stores.warehouse import connect, quantize, read_stored_vectors

    with connect(_settings(home, namespace)) as con:
        ids, codes, scales = read_stored_vectors(con, namespace, "entity")
    rng = np.random.default_rng(0)
    with connect(_settings(out, namespace)) as con:
        for c in range(copies):
            for start in range(0, len(ids), 65_536):
                x = codes[start:start + 65_536].astype(np.float32) * scales[start:start + 65_536, None]
                x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
                x += rng.normal(scale=noise, size=x.shape).astype(np.float32)
                vector, scale = quantize(x)
                names = pa.array([f"{i}_{c}" for i in ids[start:start + 65_536]])
                con.register("_rows", pa.table({"item_id": names, "vector": vector, "scale": scale}))
                con.execute("INSERT INTO embeddings (namespace, kind, item_id, model, vector, scale, text_hash) "
                            "SELECT ?, 'entity', item_id, 'synthetic', vector, scale, hash(item_id) FROM _rows",
                            [namespace])
                con.unregister("_rows")
        return con.execute("SELECT count(*) FROM embeddings").fetchone()[0]
