"""Local-route latency on an indexed home, over the growth benchmark's questions (what `bench index --growth`
reports as p50/p95), so two builds of the code can be compared on copies of one home, alternately.

    python scripts/home_latency.py HOME [REPEAT] [--namespace bench]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from lazyhippo.evaluate.bench import run_latency_bench
from lazyhippo.stores.namespaces import namespace_settings
from lazyhippo_dagster.bench_growth import growth_questions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("home", type=Path)
    ap.add_argument("repeat", type=int, nargs="?", default=2)
    ap.add_argument("--namespace", default="bench")
    ap.add_argument("--datasets", type=Path, default=Path(os.environ.get("LAZYHIPPO_DATASETS", "../shared/datasets")))
    a = ap.parse_args()
    r = run_latency_bench(namespace_settings(a.home, a.namespace), growth_questions(a.datasets, 20), ["local"],
                          repeat=a.repeat)["local"]
    print(json.dumps({"home": str(a.home), "p50_ms": round(r["p50_ms"], 1), "p95_ms": round(r["p95_ms"], 1),
                      "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
