"""Each route's figures by set and question type, from the per-question rows of `lazyhippo bench retrieval --json`.

    python scripts/routes_by_type.py routes.json [subquestions=sub.json ...]

Questions are typed by `classify_query` (what `auto` sees); figures are sums over the type's questions of recall@2,
recall@5 and all_supporting@8 (so 1.0 is one question's worth). A later file's routes replace an earlier one's;
`label=file.json` names that file's route under test `label` (a run with `--set` options, beside the plain route).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from lazyhippo.query.routes import classify_query

METRICS = ("recall_at_2", "recall_at_5", "all_supporting_at_8")


def load(paths: list[str]) -> dict[str, dict[str, list[dict]]]:
    """set -> route -> per-question rows (a one-set run is named by its corpus)."""
    sets: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for arg in paths:
        label, _, path = arg.rpartition("=")
        data = json.loads(open(path, encoding="utf-8").read())
        runs = {data["corpus"]: data} if "per_question" in data else data
        for name, run in runs.items():
            rows = run["per_question"]
            sets[name].update({label: rows[run["route"]]} if label else rows)
    return sets


def by_type(rows: dict[str, list[dict]]) -> dict[str, dict[str, tuple[float, ...]]]:
    """question type -> route -> summed metrics, the first route's questions typed once."""
    first = next(iter(rows.values()))
    kinds = [classify_query(q["question"]) for q in first]
    out: dict[str, dict[str, tuple[float, ...]]] = defaultdict(dict)
    for route, qs in rows.items():
        for kind in set(kinds):
            picked = [q for q, k in zip(qs, kinds) if k == kind]
            out[kind][route] = tuple(sum(q[m] for q in picked) for m in METRICS)
    return out


def main(paths: list[str]) -> None:
    for name, rows in load(paths).items():
        print(f"{name}: {len(next(iter(rows.values())))} questions (recall@2 / recall@5 / all_supporting@8 summed)")
        for kind, routes in sorted(by_type(rows).items()):
            cells = " | ".join(f"{r} {a:.1f} / {b:.1f} / {c:.0f}" for r, (a, b, c) in routes.items())
            print(f"  {kind}: {cells}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
