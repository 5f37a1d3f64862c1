"""The extraction's own cost on an indexed home (a copy: its extracted_* rows are rewritten, the same rows for the
same code): every document of the namespace planned, extracted in this process (as a batch step does) and
collected, with the wall and CPU seconds of each (the extraction's: this process's and its worker processes');
then the extracted tables compared with a reference home's,
row for row (EXCEPT ALL both ways) and in order.

    python scripts/extraction_cost.py COPY_OF_HOME REFERENCE_HOME [--namespace bench] [--fresh] [--documents N]
        [--processes N]

--fresh deletes the copy's extraction cache first (every chunk extracted again), else the cache answers;
--documents N plans only the first N documents (by id); --processes N extracts over N worker processes, as a
step of an in-process run does on N cores (default 1: as a step of a parallel run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# the extraction's processes, read when it starts: in this process alone, as in a batch step of a parallel run,
# unless --processes says otherwise
os.environ["LAZYHIPPO_THREADS"] = sys.argv[sys.argv.index("--processes") + 1] if "--processes" in sys.argv else "1"

from lazyhippo.stages.extractions import EXTRACTION_SCHEMAS, collect_parts, extract_batch, plan_batches  # noqa: E402
from lazyhippo.stores.namespaces import namespace_settings  # noqa: E402
from lazyhippo.stores.objects import LocalObjectStore  # noqa: E402
from lazyhippo.stores.warehouse import connect  # noqa: E402


def _workers() -> list[int]:
    """The extraction's worker processes: the children of this process's children (its forkserver's), from /proc."""
    parent = {}
    for d in Path("/proc").iterdir():
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
    children = {p for p, pp in parent.items() if pp == os.getpid()}
    return [p for p, pp in parent.items() if pp in children]


def workers_time() -> tuple[float, float, float]:
    """The running workers' seconds since they started, on a core, and waiting for one (utime + stime,
    /proc/<pid>/stat; the run queue's wait, /proc/<pid>/schedstat): the rest of a worker's life it had no work,
    which, unlike the wall time, the host's other load does not change."""
    tick = os.sysconf("SC_CLK_TCK")
    now = float(Path("/proc/uptime").read_text().split()[0])
    life = cpu = wait = 0.0
    for pid in _workers():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            queued = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
        except OSError:
            continue
        life += now - int(fields[19]) / tick
        cpu += (int(fields[11]) + int(fields[12])) / tick
        wait += queued
    return life, cpu, wait


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
    ap.add_argument("--processes", type=int, default=1)  # read above, before the extraction's imports
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
    life, on_core, queued = workers_time()  # before collecting stops them
    print(f"extract: worker processes {life:.1f} s alive, {on_core:.1f} CPU s, {queued:.1f} s waiting for a core, "
          f"{life - on_core - queued:.1f} s without work")
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
