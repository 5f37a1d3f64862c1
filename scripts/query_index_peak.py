"""The query index of a home built (and its disk cache written) or read from that cache, in this process alone:
its peak resident memory, seconds and the cache file's size.

    python scripts/query_index_peak.py COPY_OF_HOME build|cached [--namespace bench]

`build` deletes `published/.index-cache/` first, so the index is built and written as the context check's first
load does; `cached` reads the file a `build` left. Prints JSON: resident MB before (base), the process's peak
(ru_maxrss), the peak sampled every 0.05 s, resident MB after, seconds, the cache's MB and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import threading
import time
from pathlib import Path

from lazyhippo.query.loader import load_index
from lazyhippo.stores.namespaces import namespace_settings


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("mode", choices=("build", "cached"))
    parser.add_argument("--namespace", default="bench")
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

    base = resident_mb()
    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    idx = load_index(settings)
    seconds = time.perf_counter() - t0
    done.set()
    print(json.dumps({"mode": args.mode, "cached": bool(idx.stats.get("cached")), "base_mb": round(base),
                      "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6),
                      "sampled_peak_mb": round(max(samples, default=base)), "end_mb": round(resident_mb()),
                      "seconds": round(seconds, 2),
                      "cache_mb": round(sum(p.stat().st_size for p in cache.glob("*.pickle")) / 1e6, 1),
                      "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
