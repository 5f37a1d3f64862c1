"""The graph tables' build on a copy of an indexed home, timed, and what the warehouse's tables take on disk.

    python scripts/graph_tables_cost.py build COPY_OF_HOME [--namespace bench] [--change]
    python scripts/graph_tables_cost.py compare WAREHOUSE_A WAREHOUSE_B
    python scripts/graph_tables_cost.py sizes WAREHOUSE

build: the graph tables built whole (the recorded inputs of the entities stage cleared), or with --change after
one changed document (the first document's chunks under new ids, as an edit of its text gives them, and the
relations of its first sentence gone), with the wall and CPU seconds of opening the warehouse (migrations) and
of the build. compare: every graph table of two warehouse files, row for row (EXCEPT ALL both ways). sizes: the
warehouse built again (COPY FROM DATABASE into a new file) and the staging and graph tables each copied alone,
with their own declarations, into a new file (and the embeddings, the largest table).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import duckdb

from lazyhippo.stages.entities import MODELS, build_graph_tables
from lazyhippo.stores.namespaces import namespace_settings
from lazyhippo.stores.warehouse import BLOCK_SIZE, connect, stored_columns

STAGED = ("extracted_entities", "extracted_relations", "extracted_facts", "extraction_failures", "chunks")
TABLES = ("extracted_entities", "extracted_relations", "extracted_facts", *MODELS)


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def build(home: Path, namespace: str, change: bool) -> None:
    settings = namespace_settings(home, namespace)
    ns = settings.namespace
    t0, c0 = time.perf_counter(), cpu()
    with connect(settings) as con:
        print(f"open: {time.perf_counter() - t0:.1f} s, {cpu() - c0:.1f} CPU s", flush=True)
        if not change:
            con.execute("DELETE FROM stage_inputs WHERE namespace = ? AND stage = 'entities'", [ns])
        else:
            doc = con.execute("SELECT min(doc_id) FROM chunks WHERE namespace = ?", [ns]).fetchone()[0]
            ids = [r[0] for r in con.execute("SELECT chunk_id FROM chunks WHERE namespace = ? AND doc_id = ?",
                                             [ns, doc]).fetchall()]
            con.execute("BEGIN")
            for t in STAGED:
                con.execute(f"UPDATE {t} SET chunk_id = chunk_id || 'x' WHERE namespace = ? "
                            "AND chunk_id IN (SELECT unnest(?))", [ns, ids])
            con.execute("DELETE FROM extracted_relations WHERE namespace = $ns AND chunk_id = $c AND fact_idx = 0",
                        {"ns": ns, "c": ids[0] + "x"})
            con.execute("COMMIT")
            print(f"changed {doc}: {len(ids)} chunks", flush=True)
        t1, c1 = time.perf_counter(), cpu()
        out = build_graph_tables(settings, con)
        print(f"graph tables: {time.perf_counter() - t1:.1f} s, {cpu() - c1:.1f} CPU s, "
              f"{out.scoped_entities} scoped entities", flush=True)
        con.execute("CHECKPOINT")


def compare(a: Path, b: Path) -> None:
    con = duckdb.connect()
    con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
    for t in MODELS:
        only = [con.execute(f"SELECT count(*) FROM (SELECT * FROM {x}.{t} EXCEPT ALL SELECT * FROM {y}.{t})")
                .fetchone()[0] for x, y in (("a", "b"), ("b", "a"))]
        n = con.execute(f"SELECT count(*) FROM a.{t}").fetchone()[0]
        print(f"{t}: {n} rows, {only[0]} only in the first, {only[1]} only in the second", flush=True)


def sizes(path: Path) -> None:
    con = duckdb.connect()
    con.execute("SET threads = 1")  # rows copied in their stored order
    con.execute(f"ATTACH '{path}' AS s (READ_ONLY)")
    ddl = dict(con.execute("SELECT table_name, sql FROM duckdb_tables() WHERE database_name = 's'").fetchall())
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        whole = Path(tmp) / "whole.duckdb"
        con.execute(f"ATTACH '{whole}' AS w (BLOCK_SIZE {BLOCK_SIZE})")
        con.execute("COPY FROM DATABASE s TO w")
        con.execute("DETACH w")
        print(f"warehouse: {path.stat().st_size / 1e6:.1f} MB, built again {whole.stat().st_size / 1e6:.1f} MB")
        for t in (*TABLES, "embeddings"):
            one = Path(tmp) / f"{t}.duckdb"
            con.execute(f"ATTACH '{one}' AS o (BLOCK_SIZE {BLOCK_SIZE})")
            con.execute(ddl[t].replace(f"CREATE TABLE {t}(", f"CREATE TABLE o.{t}(", 1))
            cols = ", ".join(stored_columns(con, t, "s"))
            con.execute(f"INSERT INTO o.{t} ({cols}) SELECT {cols} FROM s.{t} ORDER BY rowid")
            con.execute("DETACH o")
            print(f"{t}: {one.stat().st_size / 1e6:.1f} MB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["build", "compare", "sizes"])
    ap.add_argument("paths", type=Path, nargs="+")
    ap.add_argument("--namespace", default="bench")
    ap.add_argument("--change", action="store_true")
    args = ap.parse_args()
    if args.what == "build":
        build(args.paths[0], args.namespace, args.change)
    elif args.what == "compare":
        compare(*args.paths)
    else:
        sizes(args.paths[0])


if __name__ == "__main__":
    main()
