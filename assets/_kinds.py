"""Kind tags that name the stores the code location's runs use (LAZYHIPPO_GRAPH_STORE, LAZYHIPPO_OBJECT_STORE as
the definitions load): the catalog shows `neo4j` or `minio` only when the runs write there."""

from __future__ import annotations

from lazyhippo.settings import Settings


def store_kinds(*kinds: str, graph: bool = False, objects: bool = False) -> set[str]:
    """`kinds`, plus the graph store when the asset syncs to it, plus the object store when it writes there
    (the embedded graph store lives in the warehouse, the local object store is a folder: neither adds a tag)."""
    settings = Settings.from_env()
    stores = {("neo4j" if graph and settings.graph_store == "neo4j" else None),
              ("minio" if objects and settings.object_store == "minio" else None)}
    return set(kinds) | (stores - {None})
