"""Time and memory of the `knn_edges` stage on a home's entity vectors, and the recall of one search against another.

    python scripts/bench_knn.py run HOME NAMESPACE [--exact-max N] [--edges OUT.parquet]   # a full search
    python scripts/bench_knn.py update HOME NAMESPACE --change 30 --add 20                  # vectors moved and added
    python scripts/bench_knn.py run HOME NAMESPACE --update                                 # the search after that
    python scripts/bench_knn.py recall EXACT.parquet OTHER.parquet                          # share of exact edges found
    python scripts/bench_knn.py synth HOME NAMESPACE OUT_HOME --copies 10 --noise 0.03      # tiled vectors (synthetic)

`run` and `update` change the home's `knn_edges` rows: run them on a copy. Peak RSS is the process's own (the
stage starts no child process); `--exact-max` sets KNN_EXACT_MAX for the run (0: always the approximate index).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import numpy as np


def _settings(home: str, namespace: str):
    from lazyhippo.settings import Settings

    return Settings(home=Path(home), namespace=namespace)


def _figures(t0: float, c0: float, **extra) -> None:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print({"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
           "peak_rss_mb": round(rss), "load": os.getloadavg(), **extra}, flush=True)


def run(args) -> None:
    from lazyhippo.graph import algorithms
    from lazyhippo.index import run_stage
    from lazyhippo.stores.graphs import EmbeddedGraphStore
    from lazyhippo.stores.warehouse import connect

    if args.exact_max is not None:
        algorithms.KNN_EXACT_MAX = args.exact_max
    settings = _settings(args.home, args.namespace)
    with connect(settings) as con:
        if not args.update:  # without the recorded search, the stage searches every entity
            con.execute("DELETE FROM stage_inputs WHERE namespace = ? AND stage = 'knn_edges'", [args.namespace])
        t0, c0 = time.perf_counter(), time.process_time()
        out = run_stage("knn_edges", settings, con, EmbeddedGraphStore())
        _figures(t0, c0, entities=out.entities, edges=out.edges, searched=out.searched, top_k=out.top_k,
                 cutoff=out.cutoff)
        if args.edges:
            con.execute("COPY (SELECT source_id, target_id, score FROM knn_edges WHERE namespace = ?) TO "
                        f"'{args.edges}' (FORMAT parquet)", [args.namespace])


def update(args) -> None:
    """Gives `--change` entities the vector of another and adds `--add` copies of others (`run --update` next);
    `--round`: which entities (another round, other ones)."""
    from lazyhippo.stores.warehouse import connect

    settings = _settings(args.home, args.namespace)
    with connect(settings) as con:
        ns = args.namespace
        ids = [r[0] for r in con.execute("SELECT item_id FROM embeddings WHERE namespace = ? AND kind = 'entity' "
                                         "ORDER BY hash(item_id || ?) LIMIT ?",
                                         [ns, args.round, 2 * args.change + args.add]).fetchall()]
        moved, donors = ids[:args.change], ids[args.change:]
        for a, b in zip(moved, donors):
            con.execute("UPDATE embeddings SET vector = (SELECT vector FROM embeddings WHERE namespace = $ns "
                        "AND kind = 'entity' AND item_id = $b), text_hash = $tag "
                        "WHERE namespace = $ns AND kind = 'entity' AND item_id = $a",
                        {"ns": ns, "a": a, "b": b, "tag": f"moved{args.round}"})
        con.execute("INSERT INTO embeddings SELECT namespace, kind, item_id || $tag, model, vector, scale, $tag "
                    "FROM embeddings WHERE namespace = $ns AND kind = 'entity' AND item_id IN (SELECT unnest($ids))",
                    {"ns": ns, "tag": f"_new{args.round}", "ids": donors[args.change:]})


def recall(args) -> None:
    import duckdb

    q = """SELECT count(*), count(o.source_id), count(*) FILTER (e.score >= 0.9),
                  count(o.source_id) FILTER (e.score >= 0.9)
           FROM read_parquet(?) e LEFT JOIN read_parquet(?) o USING (source_id, target_id)"""
    n, found, n90, found90 = duckdb.connect().execute(q, [args.exact, args.other]).fetchall()[0]
    print({"exact_edges": n, "found": round(found / n, 4), "exact_edges_0.90": n90,
           "found_0.90": round(found90 / n90, 4)})


def synth(args) -> None:
    """`--copies` copies of every entity vector of HOME, each with Gaussian noise of `--noise` per dimension."""
    import pyarrow as pa

    from lazyhippo.stores.warehouse import connect, quantize, read_stored_vectors

    with connect(_settings(args.home, args.namespace)) as con:
        ids, codes, scales = read_stored_vectors(con, args.namespace, "entity")
    rng = np.random.default_rng(0)
    with connect(_settings(args.out, args.namespace)) as con:
        for c in range(args.copies):
            for start in range(0, len(ids), 65_536):
                x = codes[start:start + 65_536].astype(np.float32) * scales[start:start + 65_536, None]
                x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
                x += rng.normal(scale=args.noise, size=x.shape).astype(np.float32)
                vector, scale = quantize(x)
                names = pa.array([f"{i}_{c}" for i in ids[start:start + 65_536]])
                con.register("_rows", pa.table({"item_id": names, "vector": vector, "scale": scale}))
                con.execute("INSERT INTO embeddings (namespace, kind, item_id, model, vector, scale, text_hash) "
                            "SELECT ?, 'entity', item_id, 'synthetic', vector, scale, item_id FROM _rows",
                            [args.namespace])
                con.unregister("_rows")
        print(con.execute("SELECT count(*) FROM embeddings").fetchall())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "update", "synth"):
        s = sub.add_parser(name)
        s.add_argument("home")
        s.add_argument("namespace")
    sub.choices["run"].add_argument("--exact-max", type=int)
    sub.choices["run"].add_argument("--edges")
    sub.choices["run"].add_argument("--update", action="store_true", help="keep the recorded search: an update")
    sub.choices["update"].add_argument("--change", type=int, default=30)
    sub.choices["update"].add_argument("--add", type=int, default=20)
    sub.choices["update"].add_argument("--round", type=int, default=1)
    sub.choices["synth"].add_argument("out")
    sub.choices["synth"].add_argument("--copies", type=int, default=10)
    sub.choices["synth"].add_argument("--noise", type=float, default=0.03)
    r = sub.add_parser("recall")
    r.add_argument("exact")
    r.add_argument("other")
    args = p.parse_args()
    {"run": run, "update": update, "recall": recall, "synth": synth}[args.cmd](args)


if __name__ == "__main__":
    main()
