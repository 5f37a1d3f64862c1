"""What the run's process holds between the steps of a whole index run: the `index` job run in this process (as
`lazyhippo bench index` runs it) on a fresh home, a Dagster success hook recording after each step.

    python scripts/step_memory.py WORKDIR SOURCE OUT.json [--trace]

WORKDIR is emptied, SOURCE (a folder of documents, e.g. a `bench index --growth` run's `source`) copied into it;
the home is `WORKDIR/home`, namespace `bench`. Per step, after a `gc.collect()`: resident MB, `smaps_rollup`
(anonymous against file-backed: the libraries' pages), glibc's `mallinfo2` (its heap, what of it is in use and
free: Python's small objects and DuckDB's jemalloc are not in it), the most numerous Python objects by type, the
open DuckDB connections with their `duckdb_memory()`, the thread count; with `--trace` (tracemalloc from the
start: several times slower, ~100 MB more resident) the traced bytes by file. OUT.json is rewritten after each step.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import time
import tracemalloc
from collections import Counter
from pathlib import Path


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


def _smaps_mb() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":")
        fields[key] = int(value.split()[0]) // 1024
    return {k: fields[k] for k in ("Rss", "Anonymous", "Shared_Clean", "Private_Clean")}


def _duckdb_connections() -> list[dict]:
    import duckdb

    out = []
    for obj in gc.get_objects():
        if isinstance(obj, duckdb.DuckDBPyConnection):
            try:
                dbs = obj.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchall()
                mem = obj.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0").fetchall()
                out.append({"databases": [p for (p,) in dbs], "mb": {t: round(b / 1e6, 1) for t, b in mem}})
            except duckdb.Error as exc:  # a closed connection still referenced
                out.append({"error": str(exc)[:80]})
    return out


def snapshot(step: str, started: float) -> dict:
    """One step's record (see the module's docstring)."""
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    smaps = _smaps_mb()
    record = {"step": step, "seconds": round(time.time() - started, 1), "rss_mb": smaps["Rss"],
              "anonymous_mb": smaps["Anonymous"], "file_mb": smaps["Rss"] - smaps["Anonymous"], "smaps_mb": smaps,
              "glibc_mb": {"heap": m.arena >> 20, "mmapped": m.hblkhd >> 20, "in_use": m.uordblks >> 20,
                           "free": m.fordblks >> 20},
              "objects": Counter(type(o).__name__ for o in gc.get_objects()).most_common(20),
              "duckdb": _duckdb_connections(), "threads": len(os.listdir("/proc/self/task"))}
    if tracemalloc.is_tracing():
        stats = tracemalloc.take_snapshot().statistics("filename")
        record["traced_mb"] = round(sum(s.size for s in stats) / 1e6, 1)
        record["traced_top"] = [(s.traceback[0].filename.split("site-packages/")[-1], round(s.size / 1e6, 1), s.count)
                                for s in stats[:15]]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    if args.trace:
        tracemalloc.start(1)
    started = time.time()
    import dagster as dg

    from lazyhippo_dagster.assets._partitions import namespace_tags
    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.runner import instance_for, run_config
    from lazyhippo_dagster.staging import add_namespace_partition

    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    shutil.copytree(args.source, args.workdir / "source")
    home = args.workdir / "home"
    os.environ["DAGSTER_HOME"] = str((home / "dagster").resolve())
    instance = instance_for(home)
    records: list[dict] = []

    def keep(step: str) -> None:
        records.append(snapshot(step, started))
        args.out.write_text(json.dumps(records, indent=1))
        r = records[-1]
        print(f"{step}: {r['rss_mb']} MB resident, {r['anonymous_mb']} anonymous, glibc {r['glibc_mb']}", flush=True)

    @dg.success_hook
    def after_step(context: dg.HookContext) -> None:
        keep(context.step_key)

    keep("start")
    add_namespace_partition(instance, "bench")
    config = run_config({"lazyhippo": {"home": str(home), "source": str(args.workdir / "source")}})
    job = defs.resolve_job_def("index").with_hooks({after_step})
    job.execute_in_process(run_config=config, instance=instance, tags=namespace_tags("bench"), partition_key="bench")
    keep("after the run")


if __name__ == "__main__":  # the extraction workers' forkserver imports this module again
    main()
