"""One index stage alone in this process on a copy of an indexed home: its peak resident memory and seconds.

    python scripts/stage_peak.py COPY_OF_HOME STAGE [--namespace bench]

STAGE is an asset of `lazyhippo.index.STAGE_NAMES` (knn_edges, entities, community_summaries, exports, ...). The
stage runs as a first run would: `knn_edges` and `entities` without their recorded inputs (a whole search, a
whole build), `exports` to an empty object store (`COPY_OF_HOME/objects_peak`, every table written). Prints
JSON: resident MB once the warehouse is open (base), the process's peak (ru_maxrss), the peak sampled every
0.1 s, wall and CPU seconds, resident MB held once the stage is done and its garbage given back (`held_mb`: what
a run's process carries into its next step), the load average, and the sampled resident MB over time (60 points).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import threading
import time
import uuid
from pathlib import Path

from lazyhippo.index import run_stage
from lazyhippo.stages.common import give_back_memory
from lazyhippo.stores.graphs import EmbeddedGraphStore
from lazyhippo.stores.namespaces import namespace_settings
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import connect


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("stage")
    parser.add_argument("--namespace", default="bench")
    args = parser.parse_args()
    settings = namespace_settings(args.home, args.namespace)
    objects_dir = args.home / "objects_peak"
    shutil.rmtree(objects_dir, ignore_errors=True)
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.perf_counter()
        while not done.wait(0.1):
            samples.append((round(time.perf_counter() - t0, 1), round(resident_mb())))

    with connect(settings) as con:
        if args.stage in ("knn_edges", "entities"):
            con.execute("DELETE FROM stage_inputs WHERE namespace = ? AND stage = ?", [settings.namespace, args.stage])
        base = resident_mb()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0, c0 = time.perf_counter(), time.process_time()
        run_stage(args.stage, settings, con, EmbeddedGraphStore(), LocalObjectStore(objects_dir),
                  run_id=str(uuid.uuid4()))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        done.set()
        sampler.join()
    give_back_memory()
    print(json.dumps({"stage": args.stage, "base_mb": round(base),
                      "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6),
                      "sampled_peak_mb": max((s[1] for s in samples), default=round(base)),
                      "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "held_mb": round(resident_mb()),
                      "load": os.getloadavg(),
                      "timeline": samples[::max(1, len(samples) // 60)]}))


if __name__ == "__main__":
    main()
