"""Driver plumbing: one Bolt driver per store, parameterized statements, errors that name the endpoint.

A server that is down fails in about `connect_timeout` seconds: the driver is verified once when the store
opens (`connect`), and reads and writes are not retried for long on a connection refused.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import polars as pl

    from lazyhippo.graph.algorithms import MergedGraph

log = logging.getLogger(__name__)

LABELS = ("Document", "Chunk", "Entity", "Community")
REL_TYPES = ("PART_OF", "MENTIONS", "SEMANTICALLY_SIMILAR", "BELONGS_TO")  # the structure's; relations are typed
# every relation between two entities, whatever its type: the relations carry their relation id, no other edge does
RELATIONS = "(a:Entity {namespace: $ns})-[r]->(b:Entity {namespace: $ns}) WHERE r.id IS NOT NULL"


class Neo4jStoreError(RuntimeError):
    pass


@dataclass(frozen=True)
class Neo4jConnection:
    """Where and as whom to connect. The password is never part of the repr."""

    uri: str = "bolt://127.0.0.1:7687"
    user: str = "neo4j"
    password: str = ""
    database: str | None = None
    connect_timeout: float = 3.0

    def __repr__(self) -> str:
        return f"Neo4jConnection(uri={self.uri!r}, user={self.user!r}, database={self.database!r})"

    @classmethod
    def from_env(cls, **overrides) -> "Neo4jConnection":
        """NEO4J_URI, NEO4J_USER, NEO4J_DATABASE; NEO4J_PASSWORD from the environment or the credentials file
        of scripts/services.sh. Explicit (non-None) overrides win."""
        from lazyhippo.settings import credential, environment

        env = environment()
        values = {"uri": env.neo4j_uri or cls.uri, "user": env.neo4j_user or cls.user, "database": env.neo4j_database}
        values.update({k: v for k, v in overrides.items() if v is not None})
        if not values.get("password"):
            values["password"] = credential("NEO4J_PASSWORD")
        return cls(**values)


def slug(namespace: str) -> str:
    """A readable, collision-free fragment for GDS graph names (names are parameters; this is for humans)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", namespace)[:40] + "_" + hashlib.sha1(namespace.encode()).hexdigest()[:8]


class Neo4jClient:
    """One driver, statements as managed transactions, GDS projections from parameters."""

    def __init__(self, conn: Neo4jConnection, batch_size: int = 2000):
        import neo4j

        self.conn = conn
        self.uri = conn.uri
        self.database = conn.database
        self.batch_size = batch_size
        self._driver = neo4j.GraphDatabase.driver(conn.uri, auth=(conn.user, conn.password),
                                                  connection_timeout=conn.connect_timeout,
                                                  connection_acquisition_timeout=conn.connect_timeout * 2,
                                                  max_transaction_retry_time=2.0,
                                                  notifications_min_severity="OFF")  # no "unknown label" noise
        self._gds = None
        self._lock = threading.Lock()
        self._schema_ready = False

    def _fail(self, exc: Exception, doing: str) -> Neo4jStoreError:
        import neo4j.exceptions as nx

        if isinstance(exc, nx.AuthError):
            why = f"authentication failed for user {self.conn.user!r} (check NEO4J_USER / NEO4J_PASSWORD)"
        elif isinstance(exc, (nx.ServiceUnavailable, nx.SessionExpired, OSError)):
            why = "server unreachable (is it running? `lazyhippo services start neo4j`)"
        elif isinstance(exc, nx.Neo4jError):
            why = f"{exc.code}: {exc.message}"
        else:
            why = f"{type(exc).__name__}: {exc}"
        return Neo4jStoreError(f"Neo4j at {self.uri}: {why} while {doing}")

    def query(self, cypher: str, params: dict | None = None, write: bool = False, raw: bool = False) -> list[dict]:
        """Run one parameterized statement in a managed transaction; rows as dicts. `raw` skips the driver's
        recursive value conversion (for rows of plain lists, where it costs more than the query)."""
        import neo4j

        try:
            records, _, _ = self._driver.execute_query(
                cypher, parameters_=params or {}, database_=self.database,
                routing_=neo4j.RoutingControl.WRITE if write else neo4j.RoutingControl.READ)
        except Exception as exc:  # noqa: BLE001 - re-raised with the endpoint and the operation named
            raise self._fail(exc, "running a query") from exc
        return [dict(zip(r.keys(), r.values())) for r in records] if raw else [r.data() for r in records]

    def autocommit(self, cypher: str, params: dict, doing: str) -> None:
        """For `CALL {...} IN TRANSACTIONS` (needs an implicit transaction)."""
        try:
            with self._driver.session(database=self.database) as session:
                session.run(cypher, params).consume()
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, doing) from exc

    def connect(self) -> None:
        """Fail now, within the connect timeout, if the server is down or refuses the credentials."""
        try:
            self._driver.verify_connectivity()
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, "connecting") from exc

    def verify(self) -> dict:
        """Connectivity, server and GDS versions; raises Neo4jStoreError naming the endpoint."""
        self.connect()
        info = self.query("CALL dbms.components() YIELD name, versions RETURN name, versions[0] AS version")
        try:
            gds = self.query("RETURN gds.version() AS version")[0]["version"]
        except Neo4jStoreError as exc:
            raise Neo4jStoreError(f"Neo4j at {self.uri}: the Graph Data Science plugin is not installed ({exc})") from exc
        return {"neo4j": info[0]["version"] if info else "?", "gds": gds}

    @property
    def gds(self):
        """The graphdatascience client over our driver (Bolt only; created on first use)."""
        with self._lock:
            if self._gds is None:
                from graphdatascience import GraphDataScience

                try:
                    self._gds = GraphDataScience(self._driver, arrow=False, database=self.database, show_progress=False)
                except Exception as exc:  # noqa: BLE001
                    raise self._fail(exc, "starting the GDS client") from exc
        return self._gds

    def ensure_schema(self) -> None:
        """Uniqueness constraints on (namespace, id) per label and a namespace index; idempotent."""
        if self._schema_ready:
            return
        for label in LABELS:
            low = label.lower()
            self.query(f"CREATE CONSTRAINT lh_{low}_key IF NOT EXISTS FOR (n:{label}) REQUIRE (n.namespace, n.id) IS UNIQUE",
                       write=True)
            self.query(f"CREATE INDEX lh_{low}_ns IF NOT EXISTS FOR (n:{label}) ON (n.namespace)", write=True)
        self.query("CREATE CONSTRAINT lh_state_key IF NOT EXISTS FOR (n:LazyhippoState) REQUIRE n.namespace IS UNIQUE",
                   write=True)
        self.query("CALL db.awaitIndexes(300)")
        self._schema_ready = True

    def write_batches(self, cypher: str, rows: pl.DataFrame, params: dict) -> int:
        """`cypher` runs once per slice of `rows` (as $rows, one map per row) and returns `n`; the sum of the n."""
        written = 0
        for part in rows.iter_slices(self.batch_size):
            out = self.query(cypher, {**params, "rows": part.to_dicts()}, write=True)
            written += int(out[0]["n"]) if out else 0
        return written

    # ------------------------------------------------------------------ state and counts

    def graph_version(self, namespace: str) -> str | None:
        rows = self.query("MATCH (s:LazyhippoState {namespace: $ns}) RETURN s.graph_version AS v", {"ns": namespace})
        return rows[0]["v"] if rows else None

    def bump_version(self, namespace: str, token: str) -> None:
        self.query("MERGE (s:LazyhippoState {namespace: $ns}) SET s.graph_version = $token, s.updated_at = datetime()",
                   {"ns": namespace, "token": token}, write=True)

    def count_nodes(self, namespace: str, label: str) -> int:
        if label not in LABELS:
            raise ValueError(f"unknown label {label!r}")
        return self.query(f"MATCH (n:{label} {{namespace: $ns}}) RETURN count(n) AS n", {"ns": namespace})[0]["n"]

    def count_rels(self, namespace: str, rel: str) -> int:
        if rel not in REL_TYPES:
            raise ValueError(f"unknown relationship type {rel!r}")
        return self.query(f"MATCH (a {{namespace: $ns}})-[r:{rel}]->() WHERE r.id IS NULL RETURN count(r) AS n",
                          {"ns": namespace})[0]["n"]

    def count_relations(self, namespace: str) -> dict[str, int]:
        """The relations between entities per relationship type (their relation types)."""
        rows = self.query(f"MATCH {RELATIONS} RETURN type(r) AS t, count(r) AS n", {"ns": namespace})
        return {r["t"]: r["n"] for r in rows}

    def counts(self, namespace: str) -> dict[str, int]:
        """Nodes per label, structural relationships per type and the entity relations (`relations`, all types)
        of one namespace."""
        out = {label: self.count_nodes(namespace, label) for label in LABELS}
        out.update({rel: self.count_rels(namespace, rel) for rel in REL_TYPES})
        out["relations"] = sum(self.count_relations(namespace).values())
        return out

    def drop_namespace(self, namespace: str) -> None:
        """Delete every node (and so relationship) of `namespace`."""
        for label in (*LABELS, "LazyhippoState"):
            self.autocommit(f"MATCH (n:{label} {{namespace: $ns}}) CALL (n) {{ DETACH DELETE n }} "
                            f"IN TRANSACTIONS OF 5000 ROWS", {"ns": namespace}, "deleting a namespace")

    # ------------------------------------------------------------------ projections

    def temp_graph_name(self, namespace: str, what: str) -> str:
        return f"lh_{what}_{slug(namespace)}_{uuid.uuid4().hex[:12]}"

    def drop_graph(self, name: str) -> None:
        try:
            self.gds.graph.drop(name, fail_if_missing=False)
        except Exception as exc:  # noqa: BLE001 - never mask the algorithm's own error
            log.warning("could not drop GDS projection %s: %s", name, exc)

    @contextmanager
    def projection(self, namespace: str, what: str, n: int, merged: MergedGraph | None,
                   node_props: list[dict] | None = None) -> Iterator:
        """A temporary GDS graph of nodes 0..n-1 (optionally with properties) and undirected weighted edges
        (None: no edges), projected from parameters with the client's Cypher projection; dropped on exit."""
        pairs, weights = (merged.pairs.tolist(), merged.weights.tolist()) if merged is not None else ([], [])
        edges = [{"s": i, "t": j, "w": w} for (i, j), w in zip(pairs, weights)]
        connected = {i for pair in pairs for i in pair}
        nodes = [{"i": i, "p": (node_props[i] if node_props else {})} for i in range(n) if node_props or i not in connected]
        name = self.temp_graph_name(namespace, what)
        try:
            graph = self.gds.graph.project.cypher("""
                CALL () {
                    UNWIND $nodes AS nd RETURN nd.i AS s, null AS t, nd.p AS p, null AS w
                    UNION ALL
                    UNWIND $edges AS e RETURN e.s AS s, e.t AS t, null AS p, e.w AS w
                }
                RETURN gds.graph.project($name, s, t,
                     {sourceNodeProperties: p, targetNodeProperties: null,
                      relationshipProperties: CASE WHEN t IS NULL THEN null ELSE {weight: w} END},
                     {undirectedRelationshipTypes: ['*']})""", name=name, nodes=nodes, edges=edges).graph
        except Exception as exc:  # noqa: BLE001 - re-raised with the endpoint and the operation named
            self.drop_graph(name)
            raise self._fail(exc, f"projecting GDS graph {what}") from exc
        try:
            yield graph
        except Neo4jStoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - an algorithm's error, with the endpoint named
            raise self._fail(exc, f"running a GDS algorithm on {what}") from exc
        finally:
            self.drop_graph(name)

    def close(self) -> None:
        try:
            self._driver.close()
        except Exception:  # noqa: BLE001
            pass

