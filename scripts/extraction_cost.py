"""The extraction's own cost on an indexed home (a copy: its extracted_* rows are rewritten, the same rows for the
same code): every document of the namespace planned, extracted in this process (as a batch step does) and
collected, with the wall and CPU seconds of each; then the extracted tables compared with a reference home's,
row for row (EXCEPT ALL both ways) and in order.

    python scripts/extraction_cost.py COPY_OF_HOME REFERENCE_HOME [--namespace bench] [--fresh] [--documents N]

--fresh deletes the copy's extraction cache first (every chunk extracted again), else the cache answers;
--documents N plans only the first N documents (by id).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ["LAZYHIPPO_THREADS"] = "1"  # the extraction in this process, as in a batch step of a parallel run

from lazyhippo.stages.extractions import EXTRACTION_SCHEMAS, collect_parts, extract_batch, plan_batches  # noqa: E402
from lazyhippo.stores.namespaces import namespace_settings  # noqa: E402
from lazyhippo.stores.objects import LocalObjectStore  # noqa: E402
from lazyhippo.stores.warehouse import connect  # noqa: E402


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def timed(name: str, step):
    t0, c0 = time.perf_counter(), cpu()
    out = step()
    print(f"{name}: {time.perf_counter() - t0:.1f} s, {cpu() - c0:.1f} CPU s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("home", type=Path)
    ap.add_argument("reference", type=Path)
    ap.add_argument("--namespace", default="bench")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--documents", type=int)
    args = ap.parse_args()
    settings = namespace_settings(args.home, args.namespace)
    if args.fresh:
        for p in settings.cache_dir.glob("extractions.sqlite*"):
            p.unlink()
    objects, ns = LocalObjectStore(settings.export_dir), settings.namespace
    with connect(settings) as con:
        con.execute("DELETE FROM extraction_parts WHERE namespace = ?", [ns])  # every document planned again
        docs = [r[0] for r in con.execute("SELECT DISTINCT doc_id FROM chunks WHERE namespace = ? ORDER BY 1",
                                          [ns]).fetchall()]
        only = frozenset(docs[:args.documents]) if args.documents else None
        batches, _ = timed("plan", lambda: plan_batches(settings, con, objects, "cost", only=only))
    stats = timed("extract", lambda: [{**extract_batch(settings, objects, b.keys), "batch": b} for b in batches])
    with connect(settings) as con:
        timed("collect", lambda: collect_parts(settings, con, objects, batches, stats))
        con.execute(f"ATTACH '{args.reference / 'warehouse.duckdb'}' AS ref (READ_ONLY)")
        con.execute("SET memory_limit = '4GB'")  # the order check aggregates a whole table
        for t in EXTRACTION_SCHEMAS:
            only = [con.execute(f"SELECT count(*) FROM (SELECT * FROM {a}{t} WHERE namespace = ? EXCEPT ALL "
                                f"SELECT * FROM {b}{t} WHERE namespace = ?)", [ns, ns]).fetchall()[0][0]
                    for a, b in (("", "ref."), ("ref.", ""))]
            order = "SELECT md5(string_agg(CAST(x AS VARCHAR), '|' ORDER BY rowid)) FROM (SELECT rowid, {t} AS x " \
                    "FROM {s}{t} WHERE namespace = ?)"
            same = len({con.execute(order.format(s=s, t=t), [ns]).fetchall()[0][0] for s in ("", "ref.")}) == 1
            print(f"{t}: {only[0]} rows only here, {only[1]} only in the reference, order {'same' if same else 'differs'}")


if __name__ == "__main__":
    main()
