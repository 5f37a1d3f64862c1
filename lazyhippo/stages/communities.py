"""The `communities` asset: Leiden or Louvain communities of the entity graph, on the graph store in use,
seeded from the previous partition so an update moves few nodes."""

from __future__ import annotations

from collections import Counter

import duckdb
import pyarrow as pa

from lazyhippo.graph.algorithms import CommunityLevel, MergedGraph, merge_sorted
from lazyhippo.settings import Settings
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.results import CommunitiesResult
from lazyhippo.stores.graphs import GraphStore
from lazyhippo.stores.warehouse import community_members, release_cache, replace_rows, transaction


def entity_graph(con: duckdb.DuckDBPyConnection, namespace: str) -> tuple[list[str], MergedGraph]:
    """Entities and the graph communities and PageRank run on (relations and KNN edges, merged undirected).
    DuckDB turns the ids into node positions and orders each edge's ends (under its memory cap), and sends the
    edges by pair in batches as int32 columns, which merge_sorted sums into arrays sized once: Python never
    holds the edge rows whole (16 million at 100,000 documents). Within a pair the rows come in the order of
    their (source, target) positions, so parallel edges' weights are summed in the order they always were.
    A relation without a weight counts 1.0, as on the Neo4j store."""
    nodes = con.sql("SELECT entity_id FROM entities WHERE namespace = $ns ORDER BY entity_id",
                    params={"ns": namespace}).to_arrow_table().column(0).to_pylist()
    rows = con.execute("SELECT (SELECT count(*) FROM relations WHERE namespace = $ns) "
                       "+ (SELECT count(*) FROM knn_edges WHERE namespace = $ns)", {"ns": namespace}).fetchall()[0][0]
    reader = con.sql("""
        WITH n AS (SELECT entity_id, (row_number() OVER (ORDER BY entity_id) - 1)::INTEGER AS i
                   FROM entities WHERE namespace = $ns),
             e AS (SELECT source_id, target_id, coalesce(weight, 1.0)::DOUBLE AS w FROM relations WHERE namespace = $ns
                   UNION ALL SELECT source_id, target_id, score::DOUBLE FROM knn_edges WHERE namespace = $ns)
        SELECT least(a.i, b.i) AS lo, greatest(a.i, b.i) AS hi, e.w
        FROM e JOIN n a ON a.entity_id = e.source_id JOIN n b ON b.entity_id = e.target_id
        WHERE a.i <> b.i ORDER BY lo, hi, a.i, e.w""", params={"ns": namespace}).to_arrow_reader(EDGE_BATCH)
    batches = ((b.column(0).to_numpy(), b.column(1).to_numpy(), b.column(2).to_numpy()) for b in reader)
    return nodes, merge_sorted(batches, rows)


EDGE_BATCH = 1_000_000  # edge rows per Arrow batch from DuckDB: 16 MB


def build_communities(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore) -> CommunitiesResult:
    """Skipped when the graph is the one the recorded run saw; after a small change Leiden starts from the
    previous partition (incremental.seed_membership). PageRank is always that of the whole current graph."""
    from lazyhippo.stages.incremental import PARAMS, fingerprint, graph_fingerprint, read_inputs, write_inputs

    ns, algorithm, resolutions = settings.namespace, settings.community_algorithm, settings.community_resolutions
    graph = graph_fingerprint(con, ns, f"{algorithm}:{resolutions}")
    recorded = read_inputs(con, ns, "communities")
    if recorded.get(PARAMS) == fingerprint(graph):
        return _communities_result(con, ns, algorithm, reused=True)
    nodes, edges = entity_graph(con, ns)
    initial = _seeds(con, ns, nodes, len(resolutions)) if algorithm == "leiden" else None
    release_cache(con)  # what the edges' sort and joins left cached (~430 MB at 50,000 documents) goes before igraph
    comm, seeded = store.communities(ns, nodes, edges, algorithm, initial, resolutions), initial is not None
    # each phase's objects go before the next one starts: the levels' dicts (one per level, an entry per entity)
    # before PageRank's adjacency is built, the edges before the rows are written
    levels = comm.hierarchy or (CommunityLevel(comm.membership, comm.modularity),)
    rows = community_rows(levels)
    finest = levels[-1].membership
    community = pa.array([community_id(len(levels) - 1, len(levels), finest[n]) for n in nodes], pa.string())
    del comm, levels, finest, initial
    pr = store.pagerank(ns, nodes, edges)
    del edges
    with transaction(con):
        replace_rows(con, "entity_scores", ns, with_namespace(pa.table({  # columns: no dict per entity
            "entity_id": pa.array(nodes, pa.string()), "community_id": community,
            "pagerank": pa.array([float(pr.get(n, 0.0)) for n in nodes], pa.float64())}), ns) if nodes else None)
        replace_rows(con, "communities", ns, with_namespace(pa.Table.from_pylist(rows, COMMUNITY_COLUMNS), ns) if rows else None)
        write_inputs(con, ns, "communities", {PARAMS: graph})
    return _communities_result(con, ns, algorithm, seeded=seeded)


def _seeds(con: duckdb.DuckDBPyConnection, ns: str, nodes: list[str], n_levels: int) -> list[list[int] | None] | None:
    """The previous partition of every level as a start for the same level (incremental.seed_membership), or
    None when there is none to start from (first run, another number of levels, too much changed). A level's
    members are read at a time: every level's (level, community, entity) rows at once were 1 GB of Python
    tuples at 100,000 documents."""
    from lazyhippo.stages.incremental import seed_membership

    levels = [lv for (lv,) in con.execute("SELECT DISTINCT level FROM communities WHERE namespace = ? ORDER BY level",
                                          [ns]).fetchall()]
    if levels != list(range(n_levels)):
        return None
    seeds = []
    for level in levels:
        seed = seed_membership(nodes, dict(community_members(con, ns, "m.entity_id, m.community_id", "m.entity_id",
                                                             where=f"m.level = {level}")))
        if seed is None:
            return None
        seeds.append(seed)
    return seeds


COMMUNITY_COLUMNS = pa.schema([("community_id", pa.string()), ("level", pa.int32()), ("size", pa.int64()),
                               ("modularity", pa.float64()), ("parent_id", pa.string())])


def community_id(level: int, n_levels: int, label: int) -> str:
    """`k_<n>` at the finest level (the id a single-level index has always had), `k<level>_<n>` above it."""
    return f"k_{label}" if level == n_levels - 1 else f"k{level}_{label}"


def community_rows(levels) -> list[dict]:
    """One row per community of every level (0 = coarsest), with its size, its level's modularity and the
    community of the level above that holds it."""
    rows = []
    for lv, level in enumerate(levels):
        sizes = Counter(level.membership.values())
        parent = {m: levels[lv - 1].membership[n] for n, m in level.membership.items()} if lv else {}
        rows += [{"community_id": community_id(lv, len(levels), m), "level": lv, "size": s, "modularity": level.modularity,
                  "parent_id": community_id(lv - 1, len(levels), parent[m]) if lv else None}
                 for m, s in sorted(sizes.items())]
    return rows


def _communities_result(con: duckdb.DuckDBPyConnection, ns: str, algorithm: str, reused: bool = False,
                        seeded: bool = False) -> CommunitiesResult:
    finest = "level = (SELECT max(level) FROM communities WHERE namespace = $ns)"
    sizes = [s for (s,) in con.execute(f"SELECT size FROM communities WHERE namespace = $ns AND {finest}", {"ns": ns}).fetchall()]
    modularity = con.execute(f"SELECT coalesce(max(modularity), 0) FROM communities WHERE namespace = $ns AND {finest}",
                             {"ns": ns}).fetchall()[0][0]
    dist = Counter(min(s, 50) for s in sizes)
    per_level = [n for _, n in con.execute("SELECT level, count(*) FROM communities WHERE namespace = ? GROUP BY level "
                                            "ORDER BY level", [ns]).fetchall()]
    return CommunitiesResult(communities=len(sizes), modularity=modularity, algorithm=algorithm, levels=len(per_level),
                             largest=max(sizes, default=0), singletons=dist.get(1, 0),
                             size_distribution=dict(sorted(dist.items())), reused=reused, seeded=seeded,
                             per_level=per_level)
