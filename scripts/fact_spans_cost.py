"""What storing each fact's text as a span of its chunk's text (start and length) instead of the text would give.

    python scripts/fact_spans_cost.py check WAREHOUSE [WAREHOUSE ...]
    python scripts/fact_spans_cost.py cost WAREHOUSE [--scratch DIR]

check: per warehouse, how many texts of extracted_facts and facts are found in their chunk's text, and how many
of those read back equal from the place found (DuckDB's strpos, length and substr count characters alike). cost:
each table copied alone into a new file (the warehouse's block size, DuckDB capped as a run's connection is), with
its texts and with spans (one join with `chunks`; a text not found stays whole): wall and CPU seconds, peak RSS,
file size; then the query index loader's read of the facts (fact_id order, by batches) from each copy, a text read
back through the same join. Each measurement runs in its own process, so its peak is its own. It reads a
warehouse whose facts hold their texts, as written before the warehouse stored spans (a copy of one: this version
rewrites it as spans when it opens it for writing).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from lazyhippo.stores.warehouse import BLOCK_SIZE

# per table: its key column beside chunk_id, and its list column
SHAPES = {"extracted_facts": ("fact_idx INTEGER", "names VARCHAR[]"),
          "facts": ("fact_id VARCHAR", "entity_ids VARCHAR[]")}
CAP = {"threads": 2, "memory_limit": "512MB"}


def _columns(table: str) -> tuple[str, str]:
    key, listed = SHAPES[table]
    return key.split()[0], listed.split()[0]


def check(paths: list[str]) -> None:
    for path in paths:
        with duckdb.connect(path, read_only=True) as con:
            for table in SHAPES:
                n, found, equal = con.execute(f"""
                    SELECT count(*), count(*) FILTER (WHERE pos > 0),
                           count(*) FILTER (WHERE pos > 0 AND substr(chunk_text, pos, length(text)) = text)
                    FROM (SELECT f.text, c.text AS chunk_text, coalesce(strpos(c.text, f.text), 0) AS pos
                          FROM {table} f LEFT JOIN chunks c USING (namespace, chunk_id))""").fetchall()[0]
                print(f"{path} {table}: {n} texts, {found} found in their chunk's text, {equal} read back equal")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def copy(source: str, table: str, spans: bool, out: str) -> dict:
    """`table` of `source` alone in the new file `out`, with its texts or as spans."""
    key, listed = _columns(table)
    decl = ", ".join(SHAPES[table])
    con = duckdb.connect(out, config={**CAP, "default_block_size": str(BLOCK_SIZE)})
    con.execute(f"ATTACH '{source}' AS s (READ_ONLY)")
    con.execute(f"CREATE TABLE {table} (namespace VARCHAR, chunk_id VARCHAR, {decl}, "
                "text VARCHAR USING COMPRESSION zstd, span_start INTEGER, span_length INTEGER)")
    wall, cpu = time.perf_counter(), time.process_time()
    if spans:
        con.execute(f"""INSERT INTO {table} SELECT namespace, chunk_id, {key}, {listed},
                            CASE WHEN pos = 0 THEN text END, nullif(pos, 0), CASE WHEN pos > 0 THEN length(text) END
                        FROM (SELECT f.*, coalesce(strpos(c.text, f.text), 0) AS pos, f.rowid AS lh_row
                              FROM s.{table} f LEFT JOIN s.chunks c USING (namespace, chunk_id))
                        ORDER BY lh_row""")
    else:
        con.execute(f"INSERT INTO {table} SELECT namespace, chunk_id, {key}, {listed}, text, NULL, NULL "
                    f"FROM s.{table} ORDER BY rowid")
    con.execute("DETACH s")
    con.execute("CHECKPOINT")
    con.close()
    return {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2),
            "peak_mb": _peak(), "file_mb": round(os.path.getsize(out) / 1e6, 1)}


def read(source: str, copied: str, spans: bool) -> dict:
    """The loader's read of the facts from `copied` (chunks from `source`)."""
    con = duckdb.connect(config=CAP)
    con.execute(f"ATTACH '{source}' AS s (READ_ONLY)")
    con.execute(f"ATTACH '{copied}' AS p (READ_ONLY)")
    text = "coalesce(f.text, substr(c.text, f.span_start, f.span_length))" if spans else "f.text"
    join = "LEFT JOIN s.chunks c USING (namespace, chunk_id)" if spans else ""
    wall = time.perf_counter()
    rows = 0
    for batch in con.sql(f"SELECT f.fact_id, f.chunk_id, {text} AS text, f.entity_ids FROM p.facts f {join} "
                         "ORDER BY f.fact_id").to_arrow_reader(100_000):
        rows += batch.num_rows
    return {"rows": rows, "wall_s": round(time.perf_counter() - wall, 2), "peak_mb": _peak()}


def _run(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "_one", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def cost(source: str, scratch: Path) -> None:
    copies = {}
    for table in SHAPES:
        for spans in (False, True):
            out = str(scratch / f"{table}_{'spans' if spans else 'text'}.duckdb")
            copies[table, spans] = out
            print(f"{table} {'spans' if spans else 'texts'}: {_run('copy', source, table, str(int(spans)), out)}")
    for spans in (False, True, False, True):
        print(f"facts read, {'spans' if spans else 'texts'}: "
              f"{_run('read', source, copies['facts', spans], str(int(spans)))}")


def main() -> None:
    if sys.argv[1:2] == ["_one"]:
        what, source, *rest = sys.argv[2:]
        result = (copy(source, rest[0], bool(int(rest[1])), rest[2]) if what == "copy"
                  else read(source, rest[0], bool(int(rest[1]))))
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check").add_argument("warehouses", nargs="+")
    c = sub.add_parser("cost")
    c.add_argument("warehouse")
    c.add_argument("--scratch", type=Path)
    args = parser.parse_args()
    if args.command == "check":
        check(args.warehouses)
        return
    if args.scratch:
        args.scratch.mkdir(parents=True, exist_ok=True)
        cost(args.warehouse, args.scratch)
        return
    with tempfile.TemporaryDirectory() as scratch:
        cost(args.warehouse, Path(scratch))


if __name__ == "__main__":
    main()
