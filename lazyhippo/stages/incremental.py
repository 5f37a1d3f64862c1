"""What the graph-wide stages computed from last time, so an update recomputes only what its change touched.

Each stage that can work incrementally records the fingerprints of its inputs (`stage_inputs`, per namespace,
written in the same transaction as its output). The next run compares them with the current inputs:
KNN searches again only the entities whose neighbour lists can have changed (`graph.knn_stale_sources`), and
community detection is skipped when its graph is unchanged, or starts from the previous partition when a
small share of the entities changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from lazyhippo.graph.algorithms import KnnBasis

PARAMS = "@params"  # the item holding a stage's parameters: when they change, the stage starts over
# a stage gives an item's input as text, or as (text, detail): a detail is kept as it is and read back
# (`read_details`), e.g. the entity ids a chunk named, which the next run needs when the chunk is gone
Input = str | tuple[str, str]
# `fingerprint` in SQL: equal values for equal texts in both
FINGERPRINT_SQL = "('0x' || substr(sha256({}), 1, 16))::UBIGINT"


def fingerprint(text: str) -> int:
    """The first 64 bits of the text's sha256: what `stage_inputs` and `embeddings.text_hash` store (an item's
    changed input passes for unchanged with a chance of 2^-64; hex text took four times the room)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def read_inputs(con: duckdb.DuckDBPyConnection, namespace: str, stage: str) -> dict[str, int]:
    """Item -> the `fingerprint` of its input as the stage recorded it."""
    return dict(con.execute("SELECT item_id, fingerprint FROM stage_inputs WHERE namespace = ? AND stage = ?",
                            [namespace, stage]).fetchall())


def read_details(con: duckdb.DuckDBPyConnection, namespace: str, stage: str) -> dict[str, str]:
    """Item -> the detail the stage recorded with its input (items without one are left out)."""
    return dict(con.execute("SELECT item_id, detail FROM stage_inputs WHERE namespace = ? AND stage = ? "
                            "AND detail IS NOT NULL", [namespace, stage]).fetchall())


def write_inputs(con: duckdb.DuckDBPyConnection, namespace: str, stage: str, inputs: dict[str, Input] | pa.Table) -> None:
    """Replace the stage's recorded inputs (call inside the transaction that writes its output), given as a dict
    or a table (item_id, fingerprint: the input's text, optionally detail); the texts are stored as their
    `fingerprint`. Only the rows that differ are deleted and inserted: after a small update, a few rows of 37k
    are written, not all."""
    if not isinstance(inputs, pa.Table):
        pairs = [v if isinstance(v, tuple) else (v, None) for v in inputs.values()]
        inputs = pa.table({"item_id": pa.array(list(inputs), pa.string()),
                           "fingerprint": pa.array([t for t, _ in pairs], pa.string()),
                           "detail": pa.array([d for _, d in pairs], pa.string())})
    detail = "detail" if "detail" in inputs.column_names else "NULL::VARCHAR"
    recorded = "SELECT item_id, fingerprint, detail FROM stage_inputs WHERE namespace = $ns AND stage = $stage"
    p = {"ns": namespace, "stage": stage}
    incoming = f"SELECT item_id, {FINGERPRINT_SQL.format('fingerprint')}, {detail} FROM _inputs"
    con.register("_inputs", inputs)
    try:
        con.execute(f"DELETE FROM stage_inputs t USING ({recorded} EXCEPT {incoming}) d "
                    "WHERE t.namespace = $ns AND t.stage = $stage AND t.item_id = d.item_id", p)
        con.execute(f"INSERT INTO stage_inputs (namespace, stage, item_id, fingerprint, detail) "
                    f"SELECT $ns, $stage, * FROM ({incoming} EXCEPT {recorded})", p)
    finally:
        con.unregister("_inputs")


# ---- KNN ----

def knn_inputs(con: duckdb.DuckDBPyConnection, namespace: str, top_k: int, cutoff: float) -> dict[str, str]:
    """Entity id -> (model, text hash) of its vector, plus the search parameters."""
    rows = con.execute("SELECT item_id, model || ':' || coalesce(text_hash::VARCHAR, '') FROM embeddings "
                       "WHERE namespace = ? AND kind = 'entity'", [namespace]).fetchall()
    return {**dict(rows), PARAMS: f"{top_k}:{cutoff!r}"}


@dataclass(frozen=True)
class KnnPlan:
    changed: set[str]     # entities whose vector is new, changed or gone
    previous: KnnBasis    # the previous search, as much of it as an update needs


def plan_knn(con: duckdb.DuckDBPyConnection, namespace: str, inputs: dict[str, str]) -> KnnPlan | None:
    """What changed since the recorded search, or None when there is nothing to start from (first run, other
    parameters): then every entity is searched."""
    before = read_inputs(con, namespace, "knn_edges")
    now = {i: fingerprint(v) for i, v in inputs.items()}
    if not before or before.get(PARAMS) != now[PARAMS]:
        return None
    changed = {i for i in set(before) | set(now) if before.get(i) != now.get(i)} - {PARAMS}
    lists = {i: (0, 1.0) for i in before if i != PARAMS}
    lists.update({s: (n, low) for s, n, low in con.execute(
        "SELECT source_id, count(*), min(score) FROM knn_edges WHERE namespace = ? GROUP BY source_id", [namespace]).fetchall()})
    lost = {s for (s,) in con.execute("SELECT DISTINCT source_id FROM knn_edges WHERE namespace = ? AND target_id IN "
                                      "(SELECT unnest(?))", [namespace, sorted(changed)]).fetchall()}
    return KnnPlan(changed, KnnBasis(lists, lost))


# ---- communities ----

def graph_fingerprint(con: duckdb.DuckDBPyConnection, namespace: str, algorithm: str) -> str:
    """Of the graph community detection and PageRank run on (entities, relations, KNN edges), computed in
    SQL with order-independent sums of row hashes: equal fingerprints, equal results, nothing fetched."""
    rows = con.execute("""
        SELECT (SELECT count(*) || ':' || coalesce(sum(hash(entity_id)::HUGEINT), 0) FROM entities WHERE namespace = $ns),
               (SELECT count(*) || ':' || coalesce(sum(hash(source_id, target_id, weight)::HUGEINT), 0)
                FROM relations WHERE namespace = $ns),
               (SELECT count(*) || ':' || coalesce(sum(hash(source_id, target_id, score)::HUGEINT), 0)
                FROM knn_edges WHERE namespace = $ns)""", {"ns": namespace}).fetchall()
    return hashlib.sha256(repr((algorithm, rows)).encode()).hexdigest()


RESEED_SHARE = 0.05  # above this share of entities added or removed, communities are detected from scratch


def seed_membership(node_ids: list[str], previous: dict[str, str]) -> list[int] | None:
    """The previous partition as an initial membership (new entities alone in a community), or None when
    too much changed for it to be a good start."""
    kept = sum(1 for n in node_ids if n in previous)
    if not previous or len(node_ids) - kept + len(previous) - kept > RESEED_SHARE * max(len(node_ids), 1):
        return None
    labels: dict[str, int] = {}
    out = []
    for n in node_ids:
        key = previous.get(n, f"new:{n}")
        out.append(labels.setdefault(key, len(labels)))
    return out
