"""The `communities` asset: Leiden or Louvain communities of the entity graph, on the graph store in use,
seeded from the previous partition so an update moves few nodes."""

from __future__ import annotations

from collections import Counter

import duckdb
import pyarrow as pa

from lazyhippo.graph.algorithms import Edges
from lazyhippo.settings import Settings
from lazyhippo.stages.results import CommunitiesResult
from lazyhippo.stores.graphs import GraphStore
from lazyhippo.stores.warehouse import replace_rows, transaction


def entity_graph(con: duckdb.DuckDBPyConnection, namespace: str) -> tuple[list[str], Edges]:
    """Entities and the edges communities and PageRank run on (relations and KNN edges), as columns."""
    nodes = con.sql("SELECT entity_id FROM entities WHERE namespace = $ns ORDER BY entity_id",
                    params={"ns": namespace}).to_arrow_table().column(0).to_pylist()
    tbl = con.sql("SELECT source_id, target_id, weight::DOUBLE AS w FROM relations WHERE namespace = $ns "
                  "UNION ALL SELECT source_id, target_id, score::DOUBLE FROM knn_edges WHERE namespace = $ns "
                  "ORDER BY 1, 2", params={"ns": namespace}).to_arrow_table()
    # the ids stay Arrow strings: merged_undirected looks them up in Arrow (no 400k Python strings made)
    return nodes, Edges(tbl.column(0), tbl.column(1), tbl.column(2).to_numpy())


def build_communities(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore) -> CommunitiesResult:
    """Skipped when the graph is the one the recorded run saw; after a small change Leiden starts from the
    previous partition (incremental.seed_membership). PageRank is always that of the whole current graph."""
    from lazyhippo.stages.incremental import PARAMS, graph_fingerprint, read_inputs, seed_membership, write_inputs

    ns, algorithm = settings.namespace, settings.community_algorithm
    fingerprint = graph_fingerprint(con, ns, algorithm)
    recorded = read_inputs(con, ns, "communities")
    if recorded.get(PARAMS) == fingerprint:
        return _communities_result(con, ns, algorithm, int(recorded.get("levels", 1)), reused=True)
    nodes, edges = entity_graph(con, ns)
    previous = dict(con.execute("SELECT entity_id, community_id FROM entity_scores WHERE namespace = ?", [ns]).fetchall())
    initial = seed_membership(nodes, previous) if algorithm == "leiden" else None
    comm = store.communities(ns, nodes, edges, algorithm, initial)
    pr = store.pagerank(ns, nodes, edges)
    cid = {n: f"k_{m}" for n, m in comm.membership.items()}
    sizes = Counter(cid.values())
    with transaction(con):
        replace_rows(con, "entity_scores", ns, _ns(pa.Table.from_pylist(
            [{"entity_id": n, "community_id": cid[n], "pagerank": float(pr.get(n, 0.0))} for n in nodes]), ns) if nodes else None)
        replace_rows(con, "communities", ns, _ns(pa.Table.from_pylist(
            [{"community_id": c, "level": 0, "size": s, "modularity": comm.modularity} for c, s in sizes.items()]), ns) if sizes else None)
        write_inputs(con, ns, "communities", {PARAMS: fingerprint, "levels": str(comm.levels)})
    return _communities_result(con, ns, algorithm, comm.levels, seeded=initial is not None)


def _communities_result(con: duckdb.DuckDBPyConnection, ns: str, algorithm: str, levels: int, reused: bool = False,
                        seeded: bool = False) -> CommunitiesResult:
    sizes = [s for (s,) in con.execute("SELECT size FROM communities WHERE namespace = ?", [ns]).fetchall()]
    modularity = con.execute("SELECT coalesce(max(modularity), 0) FROM communities WHERE namespace = ?", [ns]).fetchall()[0][0]
    dist = Counter(min(s, 50) for s in sizes)
    return CommunitiesResult(communities=len(sizes), modularity=modularity, algorithm=algorithm, levels=levels,
                             largest=max(sizes, default=0), singletons=dist.get(1, 0),
                             size_distribution=dict(sorted(dist.items())), reused=reused, seeded=seeded)
from lazyhippo.stages.common import _ns


