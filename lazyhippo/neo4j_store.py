"""Neo4j + Graph Data Science graph store: the served graph lives in Neo4j, the graph-wide algorithms run in GDS.

Model (every node carries `namespace`; (namespace, id) is unique per label):

    (:Document {id, title, source, kind, content_hash, n_chars})
    (:Chunk {id, doc_id, title, position, section, page, text, n_tokens, content_hash})-[:PART_OF]->(:Document)
    (:Chunk)-[:MENTIONS {count, is_title}]->(:Entity {id, name, norm_name, type, description, mention_count,
                                                       degree, embedding, embedding_structural, community_id, pagerank})
    (:Entity)-[:RELATED_TO {id, weight, description, n_chunks}]->(:Entity)      source_id < target_id
    (:Entity)-[:SEMANTICALLY_SIMILAR {score, rank}]->(:Entity)                  KNN, directed (source's top-k)
    (:Entity)-[:BELONGS_TO]->(:Community {id, level, size, modularity, title, summary, hub_entities})
    (:LazyhippoState {namespace, graph_version})                                bumped when the graph changes

Loading is batched `UNWIND $rows AS row MERGE ...` on the (namespace, id) keys, so re-materializing creates no
duplicate; every write stamps `sync_token`, and what a stage did not stamp in its namespace is deleted afterwards
(merge + delete stale). All values travel as parameters: labels and relationship types are constants here.

KNN, communities and PageRank project exactly the graph the caller passes (node ids + vectors / weighted edges)
with Cypher aggregation over integer node ids, so both stores compute on the same input. Projections get unique
names and are dropped in `finally`. `ppr()` keeps one projection of the served entity+passage graph warm per
namespace, named after the namespace's graph version, so it is rebuilt only after the graph changed.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .graph import Communities, KnnEdge

log = logging.getLogger(__name__)

DEV_PASSWORD = "lazyhippo-dev-pw"  # scripts/services.sh's loopback default; set NEO4J_PASSWORD anywhere else

LABELS = ("Document", "Chunk", "Entity", "Community")
REL_TYPES = ("PART_OF", "MENTIONS", "RELATED_TO", "SEMANTICALLY_SIMILAR", "BELONGS_TO")
# graph-changing stages: the warm PPR projection of a namespace is rebuilt after any of them
_GRAPH_STAGES = {"documents", "chunks", "graph_tables", "knn_edges"}


class Neo4jStoreError(RuntimeError):
    pass


@dataclass(frozen=True)
class PPRWeights:
    """Edge weights of the entity+passage graph used by `ppr`: the fields of lazyhippo.query's GraphParams,
    so the Neo4j projection and the in-memory query graph are built alike."""

    relation_weight: float = 1.0
    relation_cap: float = 4.0
    relation_min_weight: float = 0.0
    relation_skip_types: tuple = ()
    synonym_weight: float = 0.5
    synonym_min_score: float = 0.90
    mention_weight: float = 1.0
    title_mention_weight: float = 2.0

    @classmethod
    def of(cls, params: Any | None) -> "PPRWeights":
        if isinstance(params, PPRWeights):
            return params
        if params is None:
            try:  # the query engine's defaults, when it is installed
                from .query.config import GraphParams

                params = GraphParams()
            except Exception:  # noqa: BLE001
                return cls()
        values = {}
        for k, default in cls().__dict__.items():
            if hasattr(params, k):
                v = getattr(params, k)
                values[k] = tuple(str(t) for t in v) if isinstance(default, tuple) else float(v)
        return cls(**values)

    def key(self) -> str:
        return hashlib.sha1(repr(sorted(self.__dict__.items())).encode()).hexdigest()[:8]


def _slug(namespace: str) -> str:
    """A readable, collision-free fragment for GDS graph names (names are parameters; this is for humans)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", namespace)[:40] + "_" + hashlib.sha1(namespace.encode()).hexdigest()[:8]


def _merged_undirected(node_ids: Sequence[str], edges: Iterable[tuple[str, str, float]]) -> dict[tuple[int, int], float]:
    """The same reduction as graph._igraph: undirected, self-loops and unknown ends dropped, weights summed."""
    index = {n: i for i, n in enumerate(node_ids)}
    merged: dict[tuple[int, int], float] = {}
    for a, b, w in edges:
        i, j = index.get(a), index.get(b)
        if i is None or j is None or i == j:
            continue
        key = (min(i, j), max(i, j))
        merged[key] = merged.get(key, 0.0) + float(w)
    return merged


class Neo4jGraphStore:
    """GraphStore on Neo4j 5 + GDS 2.x. Thread-safe for the read paths (the driver pools sessions)."""

    name = "neo4j"

    def __init__(self, uri: str, user: str, password: str, database: str | None = None, *,
                 knn_structural: bool = False, fastrp_dim: int = 64, seed: int = 42,
                 leiden_intermediate: bool = False, knn_engine: str = "gds", knn_concurrency: int = 1,
                 batch_size: int = 2000,
                 connect_timeout: float = 10.0):
        import neo4j

        self.uri = uri
        self.user = user
        self.database = database or None
        self.knn_structural = knn_structural          # KNN on text + FastRP structural embeddings together
        self.fastrp_dim = fastrp_dim                  # 0 disables FastRP
        self.seed = seed
        self.leiden_intermediate = leiden_intermediate
        if knn_engine not in ("gds", "exact"):
            raise ValueError(f"unknown knn_engine {knn_engine!r} (expected 'gds' or 'exact')")
        self.knn_engine = knn_engine                  # "gds": gds.knn; "exact": faiss in process, written to Neo4j
        self.knn_concurrency = knn_concurrency        # 1: reproducible; more threads converge to the same exact
                                                      # neighbours on large graphs, faster but not bit-identical
        self.batch_size = batch_size
        self._driver = neo4j.GraphDatabase.driver(uri, auth=(user, password), connection_timeout=connect_timeout,
                                                  max_transaction_retry_time=15.0,
                                                  notifications_min_severity="OFF")  # no "unknown label" noise
        self._gds = None
        self._schema_ready = False
        self._lock = threading.RLock()
        self._warm: dict[tuple[str, str], str] = {}   # (namespace, weights key) -> projected graph name
        self._warm_nodes: dict[str, int] = {}
        self._node_maps: dict[str, tuple[dict[str, int], dict[int, str]]] = {}
        self._versions: dict[str, tuple[str, float]] = {}  # namespace -> (graph version, when asked)
        self.ppr_concurrency: int | None = None       # None: 1 thread below 100k nodes (less overhead), else 4
        self.last_stats: dict = {}
        self._weighted_sources: bool | None = None   # does the server take [node, weight] source nodes?

    @classmethod
    def from_env(cls, uri: str | None = None, user: str | None = None, password: str | None = None,
                 **options) -> "Neo4jGraphStore":
        """NEO4J_URI (bolt://127.0.0.1:7687), NEO4J_USER (neo4j), NEO4J_PASSWORD (the dev default of
        scripts/services.sh), NEO4J_DATABASE, LAZYHIPPO_KNN_STRUCTURAL=1, LAZYHIPPO_FASTRP_DIM,
        LAZYHIPPO_LEIDEN_INTERMEDIATE=1, LAZYHIPPO_KNN_CONCURRENCY, LAZYHIPPO_NEO4J_KNN (gds | exact). Explicit arguments win over the environment."""
        env = os.environ
        options.setdefault("knn_structural", env.get("LAZYHIPPO_KNN_STRUCTURAL", "0").lower() in ("1", "true", "yes"))
        options.setdefault("fastrp_dim", int(env.get("LAZYHIPPO_FASTRP_DIM", "64")))
        options.setdefault("leiden_intermediate",
                           env.get("LAZYHIPPO_LEIDEN_INTERMEDIATE", "0").lower() in ("1", "true", "yes"))
        options.setdefault("database", env.get("NEO4J_DATABASE") or None)
        options.setdefault("knn_concurrency", int(env.get("LAZYHIPPO_KNN_CONCURRENCY", "1")))
        options.setdefault("knn_engine", env.get("LAZYHIPPO_NEO4J_KNN", "gds"))
        return cls(uri or env.get("NEO4J_URI", "bolt://127.0.0.1:7687"), user or env.get("NEO4J_USER", "neo4j"),
                   password or env.get("NEO4J_PASSWORD") or DEV_PASSWORD, **options)

    def __repr__(self) -> str:  # never shows the password
        return f"Neo4jGraphStore(uri={self.uri!r}, user={self.user!r}, database={self.database!r})"

    # ------------------------------------------------------------------ plumbing

    def _fail(self, exc: Exception, doing: str) -> Neo4jStoreError:
        import neo4j.exceptions as nx

        if isinstance(exc, nx.AuthError):
            why = f"authentication failed for user {self.user!r} (check NEO4J_USER / NEO4J_PASSWORD)"
        elif isinstance(exc, (nx.ServiceUnavailable, nx.SessionExpired, OSError)):
            why = "server unreachable (is it running? `lazyhippo services start neo4j`)"
        else:
            why = f"{type(exc).__name__}: {exc}"
        return Neo4jStoreError(f"Neo4j at {self.uri}: {why} while {doing}")

    def query(self, cypher: str, params: dict | None = None, write: bool = False, raw: bool = False) -> list[dict]:
        """Run one parameterized statement in a managed transaction; rows as dicts. `raw` skips the driver's
        recursive value conversion: for rows of plain lists (PPR scores), where it costs more than the query."""
        import neo4j

        try:
            records, _, _ = self._driver.execute_query(
                cypher, parameters_=params or {}, database_=self.database,
                routing_=neo4j.RoutingControl.WRITE if write else neo4j.RoutingControl.READ)
        except Exception as exc:  # noqa: BLE001 - re-raised with the endpoint and the operation named
            if isinstance(exc, Neo4jStoreError):
                raise
            import neo4j.exceptions as nx

            if isinstance(exc, nx.Neo4jError) and not isinstance(exc, (nx.AuthError, nx.ServiceUnavailable)):
                raise Neo4jStoreError(f"Neo4j at {self.uri}: {exc.code}: {exc.message}") from exc
            raise self._fail(exc, "running a query") from exc
        return [dict(zip(r.keys(), r.values())) for r in records] if raw else [r.data() for r in records]

    def run_cypher(self, cypher: str, params: dict | None = None) -> list[dict]:
        """`run_cypher(query, params) -> list[dict]` as lazyhippo.query.ppr.GdsPPR expects (read mode)."""
        return self.query(cypher, params, write=False)

    def _autocommit(self, cypher: str, params: dict) -> None:
        """For `CALL {...} IN TRANSACTIONS` (needs an implicit transaction)."""
        try:
            with self._driver.session(database=self.database) as session:
                session.run(cypher, params).consume()
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, "deleting stale rows") from exc

    def verify(self) -> dict:
        """Connectivity, server and GDS versions; raises Neo4jStoreError naming the endpoint."""
        try:
            self._driver.verify_connectivity()
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, "connecting") from exc
        info = self.query("CALL dbms.components() YIELD name, versions RETURN name, versions[0] AS version")
        try:
            gds = self.query("RETURN gds.version() AS version")[0]["version"]
        except Neo4jStoreError as exc:
            raise Neo4jStoreError(f"Neo4j at {self.uri}: the Graph Data Science plugin is not installed ({exc})") from exc
        return {"neo4j": info[0]["version"] if info else "?", "gds": gds}

    @property
    def gds(self):
        """The graphdatascience client over our driver (Bolt only; created on first algorithm call)."""
        if self._gds is None:
            with self._lock:
                if self._gds is None:
                    from graphdatascience import GraphDataScience

                    try:
                        self._gds = GraphDataScience(self._driver, arrow=False, database=self.database,
                                                     show_progress=False)
                    except Exception as exc:  # noqa: BLE001
                        raise self._fail(exc, "starting the GDS client") from exc
        return self._gds

    def ensure_schema(self) -> None:
        """Uniqueness constraints on (namespace, id) per label and a namespace index; idempotent."""
        if self._schema_ready:
            return
        stmts = []
        for label in LABELS:
            low = label.lower()
            stmts.append(f"CREATE CONSTRAINT lh_{low}_key IF NOT EXISTS FOR (n:{label}) REQUIRE (n.namespace, n.id) IS UNIQUE")
            stmts.append(f"CREATE INDEX lh_{low}_ns IF NOT EXISTS FOR (n:{label}) ON (n.namespace)")
        stmts.append("CREATE CONSTRAINT lh_state_key IF NOT EXISTS FOR (n:LazyhippoState) REQUIRE n.namespace IS UNIQUE")
        for stmt in stmts:
            self.query(stmt, write=True)
        self.query("CALL db.awaitIndexes(300)", write=False)
        self._schema_ready = True

    def _batches(self, rows: list[dict]) -> Iterable[list[dict]]:
        for i in range(0, len(rows), self.batch_size):
            yield rows[i:i + self.batch_size]

    def _write_batches(self, cypher: str, rows: list[dict], params: dict) -> int:
        written = 0
        for batch in self._batches(rows):
            out = self.query(cypher, {**params, "rows": batch}, write=True)
            written += int(out[0]["n"]) if out else 0
        return written

    # ------------------------------------------------------------------ loading

    def _merge_nodes(self, label: str, ns: str, rows: list[dict], token: str, delete_stale: bool = True) -> dict:
        """rows: {"id": ..., "props": {...}}."""
        cypher = (f"UNWIND $rows AS row MERGE (n:{label} {{namespace: $ns, id: row.id}}) "
                  f"SET n += row.props, n.sync_token = $token RETURN count(n) AS n")
        n = self._write_batches(cypher, rows, {"ns": ns, "token": token})
        before = self.count_nodes(ns, label)
        if delete_stale:
            self._autocommit(f"MATCH (n:{label} {{namespace: $ns}}) WHERE n.sync_token IS NULL OR n.sync_token <> $token "
                             f"CALL (n) {{ DETACH DELETE n }} IN TRANSACTIONS OF 5000 ROWS", {"ns": ns, "token": token})
        return {f"{label.lower()}_nodes": n, f"{label.lower()}_deleted": before - self.count_nodes(ns, label)}

    def _merge_rels(self, rel: str, src: str, dst: str, ns: str, rows: list[dict], token: str) -> dict:
        """rows: {"s": source id, "t": target id, "props": {...}}; replaces the namespace's `rel` relationships."""
        cypher = (f"UNWIND $rows AS row "
                  f"MATCH (a:{src} {{namespace: $ns, id: row.s}}) MATCH (b:{dst} {{namespace: $ns, id: row.t}}) "
                  f"MERGE (a)-[r:{rel}]->(b) SET r += row.props, r.namespace = $ns, r.sync_token = $token "
                  f"RETURN count(r) AS n")
        n = self._write_batches(cypher, rows, {"ns": ns, "token": token})
        self._autocommit(f"MATCH (a:{src} {{namespace: $ns}})-[r:{rel}]->() "
                         f"WHERE r.sync_token IS NULL OR r.sync_token <> $token "
                         f"CALL (r) {{ DELETE r }} IN TRANSACTIONS OF 10000 ROWS", {"ns": ns, "token": token})
        return {f"{rel.lower()}": n, f"{rel.lower()}_missing_endpoints": len(rows) - n}

    def _bump_version(self, ns: str, token: str) -> None:
        self.query("MERGE (s:LazyhippoState {namespace: $ns}) SET s.graph_version = $token, s.updated_at = datetime()",
                   {"ns": ns, "token": token}, write=True)
        self._versions.pop(ns, None)

    def graph_version(self, namespace: str) -> str | None:
        rows = self.query("MATCH (s:LazyhippoState {namespace: $ns}) RETURN s.graph_version AS v", {"ns": namespace})
        return rows[0]["v"] if rows else None

    def _sync_documents(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "props": {"source": r[1], "title": r[2], "kind": r[3], "content_hash": r[4], "n_chars": r[5]}}
                for r in con.execute("SELECT doc_id, source, title, kind, content_hash, n_chars FROM documents "
                                     "WHERE namespace = ? ORDER BY doc_id", [ns]).fetchall()]
        return self._merge_nodes("Document", ns, rows, token)

    def _sync_chunks(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "props": {"doc_id": r[1], "title": r[2], "position": r[3], "section": r[4], "page": r[5],
                                       "text": r[6], "content_hash": r[7], "n_tokens": r[8]}}
                for r in con.execute("SELECT chunk_id, doc_id, title, position, section, page, text, content_hash, n_tokens "
                                     "FROM chunks WHERE namespace = ? ORDER BY chunk_id", [ns]).fetchall()]
        out = self._merge_nodes("Chunk", ns, rows, token)
        out.update(self._merge_rels("PART_OF", "Chunk", "Document", ns,
                                    [{"s": r["id"], "t": r["props"]["doc_id"], "props": {"position": r["props"]["position"]}}
                                     for r in rows], token))
        return out

    def _sync_entities(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "props": {"name": r[1], "norm_name": r[2], "type": r[3], "description": r[4],
                                       "mention_count": r[5], "degree": r[6]}}
                for r in con.execute("SELECT entity_id, name, norm_name, type, description, mention_count, degree "
                                     "FROM entities WHERE namespace = ? ORDER BY entity_id", [ns]).fetchall()]
        out = self._merge_nodes("Entity", ns, rows, token)
        rel_rows = [{"s": r[0], "t": r[1], "props": {"id": r[2], "weight": r[3], "description": r[4], "n_chunks": r[5]}}
                    for r in con.execute("SELECT source_id, target_id, relation_id, weight, description, n_chunks "
                                         "FROM relations WHERE namespace = ? ORDER BY relation_id", [ns]).fetchall()]
        out.update(self._merge_rels("RELATED_TO", "Entity", "Entity", ns, rel_rows, token))
        # is_title: the chunk's document title names the entity (same normalization as the entity ids)
        men_rows = [{"s": r[0], "t": r[1], "props": {"count": r[2], "is_title": bool(r[3])}}
                    for r in con.execute("""
                        SELECT m.chunk_id, m.entity_id, m.count,
                               coalesce(e.norm_name = lh_norm(c.title)
                                        OR e.norm_name = lh_norm(regexp_replace(c.title, '^(?i)(the|a|an)\\s+', '')), false)
                        FROM mentions m
                        LEFT JOIN chunks c ON c.namespace = m.namespace AND c.chunk_id = m.chunk_id
                        LEFT JOIN entities e ON e.namespace = m.namespace AND e.entity_id = m.entity_id
                        WHERE m.namespace = ? ORDER BY m.chunk_id, m.entity_id""", [ns]).fetchall()]
        out.update(self._merge_rels("MENTIONS", "Chunk", "Entity", ns, men_rows, token))
        return out

    def _set_embeddings(self, ns: str, ids: Sequence[str], vectors: np.ndarray) -> int:
        rows = [{"id": i, "v": [float(x) for x in v]} for i, v in zip(ids, np.asarray(vectors, dtype=np.float32))]
        return self._write_batches("UNWIND $rows AS row MATCH (e:Entity {namespace: $ns, id: row.id}) "
                                   "SET e.embedding = row.v RETURN count(e) AS n", rows, {"ns": ns})

    def _sync_knn(self, con, ns, token) -> dict:
        rows = [{"s": r[0], "t": r[1], "props": {"score": r[2], "rank": r[3]}}
                for r in con.execute("SELECT source_id, target_id, score, rank FROM knn_edges WHERE namespace = ? "
                                     "ORDER BY source_id, target_id", [ns]).fetchall()]
        return self._merge_rels("SEMANTICALLY_SIMILAR", "Entity", "Entity", ns, rows, token)

    def _sync_communities(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "props": {"level": r[1], "size": r[2], "modularity": r[3]}}
                for r in con.execute("SELECT community_id, level, size, modularity FROM communities WHERE namespace = ? "
                                     "ORDER BY community_id", [ns]).fetchall()]
        out = self._merge_nodes("Community", ns, rows, token)
        scores = [{"id": r[0], "c": r[1], "pr": r[2]} for r in con.execute(
            "SELECT entity_id, community_id, pagerank FROM entity_scores WHERE namespace = ? ORDER BY entity_id", [ns]).fetchall()]
        self._write_batches("UNWIND $rows AS row MATCH (e:Entity {namespace: $ns, id: row.id}) "
                            "SET e.community_id = row.c, e.pagerank = row.pr RETURN count(e) AS n", scores, {"ns": ns})
        # entities no longer scored (none normally: scores cover every entity) lose stale values
        self.query("MATCH (e:Entity {namespace: $ns}) WHERE NOT e.id IN $ids REMOVE e.community_id, e.pagerank",
                   {"ns": ns, "ids": [s["id"] for s in scores]}, write=True)
        out["scored_entities"] = len(scores)
        out.update(self._merge_rels("BELONGS_TO", "Entity", "Community", ns,
                                    [{"s": s["id"], "t": s["c"], "props": {}} for s in scores], token))
        return out

    def _sync_summaries(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "title": r[1], "summary": r[2], "hubs": list(r[3] or [])} for r in con.execute(
            "SELECT community_id, title, summary, hub_entities FROM community_summaries WHERE namespace = ? "
            "ORDER BY community_id", [ns]).fetchall()]
        n = self._write_batches("UNWIND $rows AS row MATCH (c:Community {namespace: $ns, id: row.id}) "
                                "SET c.title = row.title, c.summary = row.summary, c.hub_entities = row.hubs "
                                "RETURN count(c) AS n", rows, {"ns": ns})
        self.query("MATCH (c:Community {namespace: $ns}) WHERE NOT c.id IN $ids REMOVE c.title, c.summary, c.hub_entities",
                   {"ns": ns, "ids": [r["id"] for r in rows]}, write=True)
        return {"summaries": n, "summaries_missing_community": len(rows) - n}

    def sync(self, con, namespace: str, stage: str) -> dict:
        """Push the warehouse rows of `stage` to Neo4j (merge + delete stale); figures for metadata.

        Each stage pushes only what it produced. Entity embeddings are written by `knn()` (it receives them),
        so `embeddings` is a no-op here.
        """
        steps = {
            "documents": (self._sync_documents,),
            "chunks": (self._sync_chunks,),
            "graph_tables": (self._sync_entities,),
            "knn_edges": (self._sync_knn,),
            "communities": (self._sync_communities,),
            "community_summaries": (self._sync_summaries,),
        }.get(stage, ())
        if not steps:
            return {}
        self.ensure_schema()
        token = uuid.uuid4().hex
        out: dict = {}
        for step in steps:
            out.update(step(con, namespace, token))
        if stage in _GRAPH_STAGES:
            self._bump_version(namespace, token)
        return out

    # ------------------------------------------------------------------ counts

    def count_nodes(self, namespace: str, label: str) -> int:
        if label not in LABELS:
            raise ValueError(f"unknown label {label!r}")
        return self.query(f"MATCH (n:{label} {{namespace: $ns}}) RETURN count(n) AS n", {"ns": namespace})[0]["n"]

    def count_rels(self, namespace: str, rel: str) -> int:
        if rel not in REL_TYPES:
            raise ValueError(f"unknown relationship type {rel!r}")
        return self.query(f"MATCH (a {{namespace: $ns}})-[r:{rel}]->() RETURN count(r) AS n", {"ns": namespace})[0]["n"]

    def counts(self, namespace: str) -> dict[str, int]:
        """Nodes per label and relationships per type of one namespace."""
        out = {label: self.count_nodes(namespace, label) for label in LABELS}
        out.update({rel: self.count_rels(namespace, rel) for rel in REL_TYPES})
        return out

    def drop_namespace(self, namespace: str) -> None:
        """Delete every node (and so relationship) of `namespace` and its warm projections."""
        self.drop_ppr_projections(namespace)
        for label in (*LABELS, "LazyhippoState"):
            self._autocommit(f"MATCH (n:{label} {{namespace: $ns}}) CALL (n) {{ DETACH DELETE n }} "
                             f"IN TRANSACTIONS OF 5000 ROWS", {"ns": namespace, "token": ""})

    # ------------------------------------------------------------------ projections

    def _drop_graph(self, name: str) -> None:
        try:
            self.gds.graph.drop(name, fail_if_missing=False)
        except Exception as exc:  # noqa: BLE001 - never mask the algorithm's own error
            log.warning("could not drop GDS projection %s: %s", name, exc)

    def _temp_name(self, namespace: str, what: str) -> str:
        return f"lh_{what}_{_slug(namespace)}_{uuid.uuid4().hex[:12]}"

    def _project_param_graph(self, name: str, n: int, merged: dict[tuple[int, int], float],
                             node_props: list[dict] | None = None) -> None:
        """Project nodes 0..n-1 (optionally with properties) and undirected weighted edges from parameters."""
        edges = [{"s": i, "t": j, "w": w} for (i, j), w in merged.items()]
        connected = {i for i, _ in merged} | {j for _, j in merged}
        nodes = [{"i": i, "p": (node_props[i] if node_props else {})} for i in range(n) if node_props or i not in connected]
        self.query("""
            CALL () {
                UNWIND $nodes AS nd RETURN nd.i AS s, null AS t, nd.p AS p, null AS w
                UNION ALL
                UNWIND $edges AS e RETURN e.s AS s, e.t AS t, null AS p, e.w AS w
            }
            WITH gds.graph.project($name, s, t,
                 {sourceNodeProperties: p, targetNodeProperties: null, relationshipProperties: CASE WHEN t IS NULL THEN null ELSE {weight: w} END},
                 {undirectedRelationshipTypes: ['*']}) AS g
            RETURN g.nodeCount AS nodes, g.relationshipCount AS rels""",
                   {"name": name, "nodes": nodes, "edges": edges}, write=False)

    # ------------------------------------------------------------------ algorithms

    def knn(self, namespace: str, ids: list[str], vectors: np.ndarray, top_k: int, cutoff: float) -> list[KnnEdge]:
        """Top-k cosine neighbours per entity above `cutoff`, written as SEMANTICALLY_SIMILAR and returned (so
        the warehouse gets the same rows). The vectors are stored on the entities as `embedding` first.

        `knn_engine="gds"` (default): `gds.knn` with exact settings (sampleRate 1, deltaThreshold 0, seeded, one
        thread). NN-descent with these settings matched the exact search on the sample corpus, but it stays a
        heuristic: on 63k entities it found 96% of the exact edges, 20x slower than faiss. `knn_engine="exact"`
        runs the exact faiss search in process and only writes the result to Neo4j.
        With `knn_structural` (GDS only), the FastRP `embedding_structural` joins the text embedding (GDS
        averages the per-property cosines)."""
        self.ensure_schema()
        token = uuid.uuid4().hex
        x = np.asarray(vectors, dtype=np.float32)
        written = self._set_embeddings(namespace, ids, x) if len(ids) else 0
        # entities without a vector this time lose the stale one (projections read `embedding` from the nodes)
        self.query("MATCH (e:Entity {namespace: $ns}) WHERE e.embedding IS NOT NULL AND NOT e.id IN $ids "
                   "REMOVE e.embedding", {"ns": namespace, "ids": list(ids)}, write=True)
        structural = self.fastrp(namespace) if self.fastrp_dim > 0 else {}
        self.last_stats = {"knn_engine": self.knn_engine, "embeddings_written": written}
        if len(ids) < 2 or top_k <= 0:
            edges: list[KnnEdge] = []
        elif self.knn_engine == "exact":
            from .graph import knn_edges

            edges = knn_edges(list(ids), x, top_k, cutoff)
        else:
            edges = self._gds_knn(namespace, list(ids), x, top_k, cutoff, structural)
        self._merge_rels("SEMANTICALLY_SIMILAR", "Entity", "Entity", namespace,
                         [{"s": e.source, "t": e.target, "props": {"score": e.score, "rank": e.rank}} for e in edges], token)
        self._bump_version(namespace, token)
        return edges

    def _gds_knn(self, namespace: str, ids: list[str], x: np.ndarray, top_k: int, cutoff: float,
                 structural: dict[str, list[float]]) -> list[KnnEdge]:
        props = []
        for i, v in enumerate(x):
            p = {"embedding": [float(f) for f in v]}
            if self.knn_structural:
                p["embedding_structural"] = structural.get(ids[i]) or [0.0] * self.fastrp_dim
            props.append(p)
        name = self._temp_name(namespace, "knn")
        try:
            self._project_param_graph(name, len(ids), {}, props)
            rows = self.query("""
                CALL gds.knn.stream($name, $config) YIELD node1, node2, similarity
                RETURN node1 AS s, node2 AS t, similarity AS score""", {"name": name, "config": {
                "nodeProperties": ["embedding", "embedding_structural"] if self.knn_structural else ["embedding"],
                # GDS reports cosine rescaled to [0, 1] as (1 + cos) / 2: the cutoff goes in, scores come out mapped
                "topK": int(top_k), "similarityCutoff": (1.0 + float(cutoff)) / 2.0, "sampleRate": 1.0,
                "deltaThreshold": 0.0, "maxIterations": 1000, "randomJoins": 10, "concurrency": self.knn_concurrency,
                "logProgress": False, **({"randomSeed": self.seed} if self.knn_concurrency == 1 else {})}})
        finally:
            self._drop_graph(name)
        by_source: dict[int, list[tuple[float, int]]] = {}
        for r in rows:
            by_source.setdefault(int(r["s"]), []).append((2.0 * float(r["score"]) - 1.0, int(r["t"])))
        edges: list[KnnEdge] = []
        for s in sorted(by_source):
            ranked = sorted(by_source[s], key=lambda st: (-st[0], ids[st[1]]))[:top_k]
            edges += [KnnEdge(ids[s], ids[t], min(score, 1.0), rank) for rank, (score, t) in enumerate(ranked, 1)]
        return edges

    def fastrp(self, namespace: str, dim: int | None = None) -> dict[str, list[float]]:
        """FastRP structural embeddings over the namespace's RELATED_TO graph (undirected, weighted), written to
        the entities as `embedding_structural`; returns them by entity id. Isolated entities get zero vectors."""
        dim = dim or self.fastrp_dim
        name = self._temp_name(namespace, "fastrp")
        try:
            info = self.query("""
                MATCH (a:Entity {namespace: $ns})
                OPTIONAL MATCH (a)-[r:RELATED_TO]->(b:Entity {namespace: $ns})
                WITH gds.graph.project($name, a, b,
                     {relationshipProperties: CASE WHEN b IS NULL THEN null ELSE {weight: r.weight} END},
                     {undirectedRelationshipTypes: ['*']}) AS g
                RETURN g.nodeCount AS nodes""", {"ns": namespace, "name": name})
            if not info or not info[0]["nodes"]:
                return {}
            self.query("CALL gds.fastRP.write($name, $config) YIELD nodePropertiesWritten RETURN nodePropertiesWritten",
                       {"name": name, "config": {"embeddingDimension": int(dim), "randomSeed": self.seed,
                                                 "relationshipWeightProperty": "weight", "concurrency": 1,
                                                 "writeProperty": "embedding_structural"}}, write=True)
        finally:
            self._drop_graph(name)
        rows = self.query("MATCH (e:Entity {namespace: $ns}) RETURN e.id AS id, e.embedding_structural AS v",
                          {"ns": namespace})
        return {r["id"]: r["v"] for r in rows if r["v"] is not None}

    def communities(self, namespace: str, node_ids: list[str], edges: list[tuple[str, str, float]],
                    algorithm: str) -> Communities:
        """`gds.leiden` (seeded) or `gds.louvain` on the given weighted graph, one thread so re-runs agree;
        communities renumbered largest first like the embedded store. The hierarchy (Louvain always, Leiden
        when `leiden_intermediate`) is written to the entities as `intermediate_community_ids`."""
        if algorithm not in ("leiden", "louvain"):
            raise ValueError(f"unknown community algorithm {algorithm!r} (expected 'leiden' or 'louvain')")
        if not node_ids:
            return Communities({}, 0.0, 0)
        merged = _merged_undirected(node_ids, edges)
        intermediate = algorithm == "louvain" or self.leiden_intermediate
        config: dict = {"mutateProperty": "community", "relationshipWeightProperty": "weight", "concurrency": 1,
                        "includeIntermediateCommunities": intermediate}
        if algorithm == "leiden":
            config["randomSeed"] = self.seed
        proc = "gds.leiden.mutate" if algorithm == "leiden" else "gds.louvain.mutate"
        name = self._temp_name(namespace, "comm")
        try:
            self._project_param_graph(name, len(node_ids), merged)
            if merged:
                stats = self.query(f"CALL {proc}($name, $config) YIELD modularity, ranLevels "
                                   f"RETURN modularity, ranLevels", {"name": name, "config": config})[0]
                rows = self.query("CALL gds.graph.nodeProperty.stream($name, 'community') YIELD nodeId, propertyValue "
                                  "RETURN nodeId AS i, propertyValue AS c", {"name": name})
            else:  # no edges: GDS modularity algorithms need relationships; every node is its own community
                stats, rows = {"modularity": 0.0, "ranLevels": 1}, [{"i": i, "c": i} for i in range(len(node_ids))]
        finally:
            self._drop_graph(name)
        raw: dict[int, int] = {}
        hierarchy: dict[int, list[int]] = {}
        for r in rows:
            c = r["c"]
            if isinstance(c, list):
                hierarchy[int(r["i"])] = [int(v) for v in c]
                c = c[-1]
            raw[int(r["i"])] = int(c)
        sizes: dict[int, int] = {}
        first: dict[int, int] = {}
        for i in range(len(node_ids)):
            m = raw.get(i, -1 - i)
            sizes[m] = sizes.get(m, 0) + 1
            first.setdefault(m, i)
        order = {c: k for k, c in enumerate(sorted(sizes, key=lambda c: (-sizes[c], first[c])))}
        membership = {n: order[raw.get(i, -1 - i)] for i, n in enumerate(node_ids)}
        if hierarchy:
            self.query("UNWIND $rows AS row MATCH (e:Entity {namespace: $ns, id: row.id}) "
                       "SET e.intermediate_community_ids = row.levels",
                       {"ns": namespace, "rows": [{"id": node_ids[i], "levels": lv} for i, lv in hierarchy.items()]},
                       write=True)
        modularity = float(stats["modularity"] or 0.0)
        if math.isnan(modularity):
            modularity = 0.0
        self.last_stats = {"algorithm": algorithm, "gds_modularity": modularity, "levels": int(stats["ranLevels"] or 1)}
        return Communities(membership, modularity, int(stats["ranLevels"] or 1))

    def pagerank(self, namespace: str, node_ids: list[str], edges: list[tuple[str, str, float]],
                 damping: float = 0.85) -> dict[str, float]:
        """`gds.pageRank` on the given undirected weighted graph, normalized to sum to 1 (as igraph does)."""
        if not node_ids:
            return {}
        merged = _merged_undirected(node_ids, edges)
        name = self._temp_name(namespace, "pr")
        try:
            self._project_param_graph(name, len(node_ids), merged)
            config: dict = {"dampingFactor": damping, "maxIterations": 100, "tolerance": 1e-9, "concurrency": 1}
            if merged:
                config["relationshipWeightProperty"] = "weight"
            rows = self.query("CALL gds.pageRank.stream($name, $config) YIELD nodeId, score RETURN nodeId AS i, score",
                              {"name": name, "config": config})
        finally:
            self._drop_graph(name)
        scores = {int(r["i"]): float(r["score"]) for r in rows}
        total = sum(scores.values()) or 1.0
        return {n: scores.get(i, 0.0) / total for i, n in enumerate(node_ids)}

    # ------------------------------------------------------------------ query-time PPR

    def _recent_version(self, namespace: str, ttl: float = 2.0) -> str:
        """The graph version, asked of the server at most every `ttl` seconds: a round trip per query
        otherwise, while a reindex takes far longer than the delay it adds to noticing it."""
        now = time.monotonic()
        seen = self._versions.get(namespace)
        if seen is None or now - seen[1] > ttl:
            seen = self._versions[namespace] = (self.graph_version(namespace) or "none", now)
        return seen[0]

    def warm_graph(self, namespace: str, weights: Any | None = None) -> str:
        """Name of the kept-warm entity+passage projection of `namespace`, projecting it when the graph version
        changed (or the server lost it). Edge weights follow `weights` (GraphParams-like; see PPRWeights)."""
        w = PPRWeights.of(weights)
        version = self._recent_version(namespace)
        name = f"lh_ppr_{_slug(namespace)}_{version[:12]}_{w.key()}"
        key = (namespace, w.key())
        if self._warm.get(key) == name:
            return name  # a projection lost since (server restart) surfaces as an error and is rebuilt by ppr()
        with self._lock:
            if not self.query("RETURN gds.graph.exists($name) AS e", {"name": name})[0]["e"]:
                self.drop_ppr_projections(namespace)
                try:
                    self._project_ppr(namespace, name, w)
                except Neo4jStoreError as exc:
                    if "already exists" not in str(exc):  # another process projected it meanwhile
                        raise
            rows = self.query("CALL gds.graph.list($name) YIELD nodeCount RETURN nodeCount", {"name": name})
            self._warm_nodes[name] = int(rows[0]["nodeCount"]) if rows else 0
            self._warm[key] = name
        return name

    def _project_ppr(self, namespace: str, name: str, w: PPRWeights) -> None:
        self.query("""
            CALL () {
                MATCH (n:Entity {namespace: $ns}) RETURN n AS s, null AS t, null AS w
                UNION ALL
                MATCH (n:Chunk {namespace: $ns}) RETURN n AS s, null AS t, null AS w
                UNION ALL
                MATCH (a:Entity {namespace: $ns})-[r:RELATED_TO]->(b:Entity {namespace: $ns})
                WHERE coalesce(r.weight, 1.0) >= $minw AND NOT coalesce(a.type, '') IN $skip
                  AND NOT coalesce(b.type, '') IN $skip
                RETURN a AS s, b AS t, $rw * CASE WHEN coalesce(r.weight, 1.0) < $cap THEN coalesce(r.weight, 1.0)
                                                  ELSE $cap END AS w
                UNION ALL
                MATCH (a:Entity {namespace: $ns})-[r:SEMANTICALLY_SIMILAR]->(b:Entity {namespace: $ns})
                WHERE r.score >= $smin RETURN a AS s, b AS t, $sw * r.score AS w
                UNION ALL
                MATCH (c:Chunk {namespace: $ns})-[r:MENTIONS]->(e:Entity {namespace: $ns})
                RETURN c AS s, e AS t, $mw * log(1 + r.count) + CASE WHEN r.is_title THEN $tw ELSE 0.0 END AS w
            }
            WITH gds.graph.project($name, s, t,
                 {relationshipProperties: CASE WHEN t IS NULL THEN null ELSE {weight: w} END},
                 {undirectedRelationshipTypes: ['*']}) AS g
            RETURN g.nodeCount AS nodes""",
                   {"ns": namespace, "name": name, "rw": w.relation_weight, "cap": w.relation_cap,
                    "sw": w.synonym_weight, "smin": w.synonym_min_score, "mw": w.mention_weight,
                    "tw": w.title_mention_weight, "minw": w.relation_min_weight,
                    "skip": list(w.relation_skip_types)})

    def drop_ppr_projections(self, namespace: str) -> int:
        prefix = f"lh_ppr_{_slug(namespace)}_"
        rows = self.query("CALL gds.graph.list() YIELD graphName WHERE graphName STARTS WITH $p RETURN graphName",
                          {"p": prefix})
        for r in rows:
            self._drop_graph(r["graphName"])
        for key in [k for k, v in self._warm.items() if v.startswith(prefix)]:
            del self._warm[key]
        return len(rows)

    # Seeds and results travel as GDS node ids (the database's internal ids, mapped once per projection),
    # so a query does no per-node MATCH or asNode lookup; near-zero scores are not sent back.
    _WEIGHTED_PPR = """
        CALL gds.pageRank.stream($name, {sourceNodes: $sources, dampingFactor: $damping, maxIterations: $max_iter,
                                         tolerance: $tol, relationshipWeightProperty: 'weight', concurrency: $threads,
                                         logProgress: false})
        YIELD nodeId, score
        WITH nodeId, score WHERE score > $eps
        RETURN collect(nodeId) AS nodes, collect(score) AS scores"""

    _GROUPED_PPR = """
        UNWIND range(0, size($groups) - 1) AS g
        CALL (g) {
            CALL gds.pageRank.stream($name, {sourceNodes: $groups[g], dampingFactor: $damping,
                                             maxIterations: $max_iter, tolerance: $tol,
                                             relationshipWeightProperty: 'weight', concurrency: $threads,
                                             logProgress: false})
            YIELD nodeId, score
            WITH nodeId, score WHERE score > $eps
            RETURN collect(nodeId) AS nodes, collect(score) AS scores
        }
        RETURN g, nodes, scores"""

    _PLAIN_PR = """
        CALL gds.pageRank.stream($name, {dampingFactor: $damping, maxIterations: $max_iter, tolerance: $tol,
                                         relationshipWeightProperty: 'weight', concurrency: $threads,
                                         logProgress: false})
        YIELD nodeId, score
        RETURN gds.util.asNode(nodeId).id AS id, score"""

    @staticmethod
    def _seed_groups(seeds: list[dict], max_groups: int) -> list[dict]:
        """Seeds grouped by weight: exact when there are at most `max_groups` distinct weights, otherwise
        log-spaced weight buckets (each bucket seeded uniformly, weighted by its total)."""
        by_w: dict[float, list[str]] = {}
        for s in seeds:
            by_w.setdefault(s["w"], []).append(s["id"])
        if len(by_w) > max_groups:
            lo, hi = math.log(min(by_w)), math.log(max(by_w))
            span = (hi - lo) or 1.0
            buckets: dict[int, list[dict]] = {}
            for s in seeds:
                b = min(int((math.log(s["w"]) - lo) / span * max_groups), max_groups - 1)
                buckets.setdefault(b, []).append(s)
            return [{"ids": [s["id"] for s in ss], "w": sum(s["w"] for s in ss)} for ss in buckets.values()]
        return [{"ids": ids, "w": w * len(ids)} for w, ids in by_w.items()]

    def _node_map(self, namespace: str, name: str) -> tuple[dict[str, int], dict[int, str]]:
        """Our ids <-> GDS node ids of a warm projection, fetched once per projection."""
        cached = self._node_maps.get(name)
        if cached is None:
            rows = self.query("MATCH (n:Entity {namespace: $ns}) RETURN id(n) AS nid, n.id AS id "
                              "UNION ALL MATCH (n:Chunk {namespace: $ns}) RETURN id(n) AS nid, n.id AS id",
                              {"ns": namespace})
            cached = self._node_maps[name] = ({r["id"]: r["nid"] for r in rows}, {r["nid"]: r["id"] for r in rows})
        return cached

    def ppr(self, namespace: str, seeds: dict[str, float], damping: float = 0.5, max_iter: int = 50,
            tol: float = 1e-6, weights: Any | None = None, max_groups: int = 2, eps: float = 1e-4) -> dict[str, float]:
        """Personalized PageRank from weighted seeds (`gds.pageRank.stream` with `sourceNodes`) over the warm
        entity+passage projection. Keys are entity and chunk ids; scores sum to 1. Seeds not in the graph are
        ignored; with no seed at all the result is plain PageRank. `damping` is the probability of following
        an edge. Servers without weighted source nodes get one run per distinct seed weight (at most
        `max_groups`, beyond that weights are bucketed: PPR is linear in its seeds)."""
        params = {"ns": namespace, "damping": float(damping), "max_iter": int(max_iter), "tol": float(tol),
                  "eps": float(eps)}
        for attempt in (1, 2):
            params["name"] = name = self.warm_graph(namespace, weights)
            params["threads"] = self.ppr_concurrency or (1 if self._warm_nodes.get(name, 0) < 100_000 else 4)
            to_nid, from_nid = self._node_map(namespace, name)
            seed_rows = [{"id": to_nid[k], "w": float(v)} for k, v in seeds.items() if v and v > 0 and k in to_nid]
            try:
                if not seed_rows:
                    rows = self.query(self._PLAIN_PR, params)
                    return self._normalized({r["id"]: float(r["score"]) for r in rows})
                if self._weighted_sources is not False:
                    try:
                        row = self.query(self._WEIGHTED_PPR, {**params, "sources": [[s["id"], s["w"]] for s in seed_rows]},
                                         raw=True)[0]
                        self._weighted_sources = True
                        return self._normalized({from_nid[n]: sc for n, sc in zip(row["nodes"], row["scores"]) if n in from_nid})
                    except Neo4jStoreError as exc:
                        if "sourceNodes" not in str(exc):
                            raise
                        self._weighted_sources = False
                groups = self._seed_groups(seed_rows, max_groups)
                out: dict[str, float] = {}
                for row in self.query(self._GROUPED_PPR, {**params, "groups": [g["ids"] for g in groups]}, raw=True):
                    total = sum(row["scores"]) or 1.0
                    w = groups[row["g"]]["w"]
                    for n, sc in zip(row["nodes"], row["scores"]):
                        if n in from_nid:
                            out[from_nid[n]] = out.get(from_nid[n], 0.0) + w * sc / total
                return self._normalized(out)
            except Neo4jStoreError as exc:
                text = str(exc).lower()
                if attempt == 2 or ("not found" not in text and "does not exist" not in text):
                    raise
                self._warm.clear()  # the server lost the projection (restart, manual drop): project again
                self._node_maps.clear()
        return {}

    @staticmethod
    def _normalized(scores: dict[str, float]) -> dict[str, float]:
        total = sum(scores.values()) or 1.0
        return {k: v / total for k, v in scores.items()}

    def ppr_backend(self, namespace: str, max_seeds: int = 200, max_groups: int = 2, max_iter_cap: int = 10) -> "Neo4jPPR":
        """A lazyhippo.query PPRBackend (`run(index, personalization, damping, tol, max_iter)`) backed by `ppr`;
        the projection uses the index's own GraphParams, so both graphs weigh edges alike."""
        return Neo4jPPR(self, namespace, max_seeds, max_groups, max_iter_cap)

    def close(self) -> None:
        """Closes the driver; warm PPR projections stay in the GDS catalog for the next query process."""
        try:
            self._driver.close()
        except Exception:  # noqa: BLE001
            pass


class Neo4jPPR:
    """PPRBackend for lazyhippo.query: seeds from the personalization vector, scores back per node index."""

    name = "neo4j-gds"

    def __init__(self, store: Neo4jGraphStore, namespace: str, max_seeds: int = 200, max_groups: int = 2,
                 max_iter_cap: int = 10):
        self.store = store
        self.namespace = namespace
        self.max_seeds = max_seeds
        self.max_groups = max_groups
        self.max_iter_cap = max_iter_cap  # GDS stops on per-node change, not L1: cap what the engine's tol allows

    def run(self, index, personalization, damping, tol, max_iter) -> np.ndarray:
        p = np.asarray(personalization, dtype=np.float64)
        order = np.argsort(-p)[: self.max_seeds]
        seeds = {index.node_ids[i]: float(p[i]) for i in order if p[i] > 0}
        scores = self.store.ppr(self.namespace, seeds, damping=damping, max_iter=min(max_iter, self.max_iter_cap), tol=tol,
                                weights=getattr(index, "graph_params", None), max_groups=self.max_groups)
        out = np.zeros(len(index.node_ids), dtype=np.float64)
        for node, score in scores.items():
            i = index.node_pos.get(node)
            if i is not None:
                out[i] = score
        total = out.sum()
        return out / total if total > 0 else out
