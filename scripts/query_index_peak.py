"""The query index of a home built (and its disk cache written) or read from that cache, in this process alone:
its peak resident memory, seconds and the cache file's size.

    python scripts/query_index_peak.py COPY_OF_HOME build|cached [--namespace bench] [--phases]

`build` deletes `published/.index-cache/` first, so the index is built and written as the context check's first
load does; `cached` reads the file a `build` left. Prints JSON: resident MB before (base), the process's peak
(ru_maxrss), the peak sampled every 0.05 s, resident MB after, seconds, the cache's MB, the load average, and the
MB each part of the index holds (`part_mb`: arrays by their buffers, each buffer once, and Python objects by
`sys.getsizeof`; an array mapped from the cache file counts as held). `--phases` also prints to stderr the resident
MB before, at the peak of and after each of the loader's parts, as they run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import threading
import time
from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lazyhippo.query import loader
from lazyhippo.stores.namespaces import namespace_settings


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def held_bytes(obj, seen: set) -> int:
    """Bytes `obj` holds and everything it refers to that `seen` does not hold yet (ids of objects and buffers)."""
    if id(obj) in seen or obj is None or isinstance(obj, (type, bool, int, float)):
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        key = ("buffer", base.__array_interface__["data"][0])
        if key in seen:
            return 0
        seen.add(key)
        return base.nbytes
    if sp.issparse(obj):
        return sum(held_bytes(getattr(obj, a, None), seen) for a in ("data", "indices", "indptr"))
    own = sys.getsizeof(obj)
    if isinstance(obj, (str, bytes, bytearray, memoryview)):
        return own
    if isinstance(obj, dict):
        return own + sum(held_bytes(k, seen) + held_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return own + sum(held_bytes(x, seen) for x in obj)
    if is_dataclass(obj):
        return own + sum(held_bytes(getattr(obj, f.name), seen) for f in fields(obj))
    return own + held_bytes(getattr(obj, "__dict__", None), seen)


def part_mb(idx) -> dict[str, float]:
    """MB per part of the index, in the order of its fields (a buffer two parts share counts in the first)."""
    seen: set = set()
    return {f.name: round(held_bytes(getattr(idx, f.name), seen) / 1e6, 1) for f in fields(idx)
            if is_dataclass(getattr(idx, f.name)) or f.name == "lexical"}


PHASES = ("_unpickled", "_filled", "_chunks", "_mention_counts", "_entities", "_facts", "_communities", "_graph",
          "_write_cached")


def watch_phases(samples: list[float]) -> None:
    """Wrap each of the loader's `PHASES` to print its resident MB before, at its peak (from `samples`) and after."""
    def wrapped(name: str, f):
        def phase(*args, **kwargs):
            at, before = len(samples), resident_mb()
            t0 = time.perf_counter()
            out = f(*args, **kwargs)
            peak = max([before, *samples[at:]])
            print(f"{name:16s} before {before:6.0f}  peak {peak:6.0f}  after {resident_mb():6.0f} MB"
                  f"  {time.perf_counter() - t0:6.1f} s", file=sys.stderr, flush=True)
            return out
        return phase

    for name in PHASES:
        setattr(loader, name, wrapped(name, getattr(loader, name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("mode", choices=("build", "cached"))
    parser.add_argument("--namespace", default="bench")
    parser.add_argument("--phases", action="store_true", help="Resident MB around each part of the load (stderr).")
    args = parser.parse_args()
    settings = namespace_settings(args.home, args.namespace)
    cache = args.home / "published" / ".index-cache"
    if args.mode == "build":
        shutil.rmtree(cache, ignore_errors=True)
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            samples.append(resident_mb())

    if args.phases:
        watch_phases(samples)
    base = resident_mb()
    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    idx = loader.load_index(settings)
    seconds = time.perf_counter() - t0
    done.set()
    print(json.dumps({"mode": args.mode, "cached": bool(idx.stats.get("cached")), "base_mb": round(base),
                      "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6),
                      "sampled_peak_mb": round(max(samples, default=base)), "end_mb": round(resident_mb()),
                      "seconds": round(seconds, 2),
                      "cache_mb": round(sum(p.stat().st_size for p in cache.glob("*.pickle")) / 1e6, 1),
                      "load": os.getloadavg(), "part_mb": part_mb(idx)}))


if __name__ == "__main__":
    main()
