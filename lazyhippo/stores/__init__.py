"""Storage, each a small protocol with its implementations side by side: the DuckDB warehouse, the object store
(local folder | MinIO) and the graph store (embedded | Neo4j + GDS). The factories below pick one by name; the
server implementations are imported only when chosen."""

from __future__ import annotations

from pathlib import Path

from lazyhippo.stores.graphs import EmbeddedGraphStore, GraphStore
from lazyhippo.stores.objects import LocalObjectStore, ObjectStore


def open_graph_store(kind: str, **neo4j) -> GraphStore:
    """`embedded`, or `neo4j` connected now (a server that is down fails within the connect timeout);
    `neo4j` arguments left None (uri, user, password) come from the environment or the credentials file."""
    if kind == "embedded":
        return EmbeddedGraphStore()
    if kind == "neo4j":
        from lazyhippo.stores.neo4j import Neo4jConnection, Neo4jGraphStore

        store = Neo4jGraphStore(Neo4jConnection.from_env(**neo4j))
        try:
            store.connect()
        except Exception:
            store.close()
            raise
        return store
    raise ValueError(f"unknown graph_store {kind!r} (expected 'embedded' or 'neo4j')")


def open_object_store(kind: str, settings, root: str | None = None, **minio) -> ObjectStore:
    """`local` (a folder, default under the index home) or `minio` (arguments left None come from the
    environment or the services credentials file)."""
    if kind == "local":
        return LocalObjectStore(Path(root) if root else settings.export_dir)
    if kind == "minio":
        from lazyhippo.stores.minio import MinioObjectStore

        return MinioObjectStore.from_env(**minio)
    raise ValueError(f"unknown object_store {kind!r} (expected 'local' or 'minio')")
