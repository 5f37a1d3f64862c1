"""Dagster resources: thin adapters from configuration to engine objects.

Nothing is read from the environment at import: an unset field (None) falls back to `Settings.from_env()`
when a run starts. The store resources hold one client per run (opened in `setup_for_execution`, closed in
`teardown_after_execution`); credentials come from the environment or the services credentials file.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import dagster as dg
import duckdb
from pydantic import PrivateAttr

from lazyhippo.config import Settings
from lazyhippo.graphstore import GraphStore, open_graph_store
from lazyhippo.objectstore import ObjectStore, open_object_store
from lazyhippo.warehouse import connect

PARTITION_TAG = "dagster/partition"


class LazyhippoResource(dg.ConfigurableResource):
    """Where the index lives, which knowledge base (namespace), and how each stage behaves.
    Unset fields: LAZYHIPPO_* from the environment, else the defaults of `lazyhippo.config.Settings`."""

    home: Optional[str] = None
    namespace: Optional[str] = None
    source: Optional[str] = None
    chunk_size: Optional[int] = None
    chunk_overlap: Optional[int] = None
    max_file_bytes: Optional[int] = None
    extractor: Optional[str] = None
    nlp_noun_phrases: Optional[bool] = None
    embedder: Optional[str] = None
    llm: Optional[str] = None
    llm_model: Optional[str] = None
    embedding_model: Optional[str] = None
    knn_top_k: Optional[int] = None
    knn_cutoff: Optional[float] = None
    community_algorithm: Optional[str] = None
    # benchmark asset checks (questions.json / themes.json beside the source are used when present)
    check_budget: int = 4000
    noise_share_max: float = 0.25
    theme_coverage_min: float = 0.9
    recall_at_5_min: float = 0.6
    _settings: Optional[Settings] = PrivateAttr(default=None)
    # the run's namespace partition (assets are partitioned by namespace); None outside partitioned runs
    _partition: Optional[str] = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._settings = None  # filled once per run, on first use
        run = context.run
        self._partition = run.tags.get(PARTITION_TAG) if run is not None else None

    def settings(self) -> Settings:
        """The run's Settings: filled once (environment, then this resource's config) and reused by every asset.
        The partition key, when the run has one, is the namespace: one knowledge base per partition."""
        if self._settings is None:
            fields = {k: getattr(self, k) for k in Settings.__dataclass_fields__ if hasattr(self, k)}
            self._settings = Settings.from_env(**{**fields, "namespace": self._partition or self.namespace})
        return self._settings

    @contextmanager
    def warehouse(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with connect(self.settings()) as con:
            yield con


class GraphStoreResource(dg.ConfigurableResource):
    """`embedded` (DuckDB + in-process algorithms) or `neo4j` (Bolt + GDS): one store per run.
    Unset: LAZYHIPPO_GRAPH_STORE, NEO4J_URI / NEO4J_USER / NEO4J_PASSWORD, else the services credentials file."""

    kind: Optional[str] = None   # "embedded" | "neo4j" (lazyhippo.config.GraphStoreKind)
    neo4j_uri: Optional[str] = None
    neo4j_user: Optional[str] = None
    neo4j_password: Optional[str] = None
    _store: Optional[GraphStore] = PrivateAttr(default=None)

    @property
    def resolved_kind(self) -> str:
        return self.kind or Settings.from_env().graph_store

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._store = open_graph_store(self.resolved_kind, uri=self.neo4j_uri, user=self.neo4j_user,
                                       password=self.neo4j_password)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def store(self) -> GraphStore:
        """The run's store (opened on first use when the resource is invoked directly, outside a run)."""
        if self._store is None:
            self.setup_for_execution(None)
        return self._store


class ObjectStoreResource(dg.ConfigurableResource):
    """`local` (a folder under the index home) or `minio` (S3-compatible): one client per run.
    Unset: LAZYHIPPO_OBJECT_STORE, MINIO_ENDPOINT / MINIO_BUCKET / MINIO_ROOT_USER / MINIO_ROOT_PASSWORD,
    else the services credentials file."""

    kind: Optional[str] = None   # "local" | "minio" (lazyhippo.config.ObjectStoreKind)
    root: Optional[str] = None
    endpoint: Optional[str] = None
    bucket: Optional[str] = None
    access_key: Optional[str] = None
    secret_key: Optional[str] = None

    def open(self, settings: Settings) -> ObjectStore:
        return open_object_store(self.kind or settings.object_store, settings, root=self.root, endpoint=self.endpoint,
                                 bucket=self.bucket, access_key=self.access_key, secret_key=self.secret_key)


def default_resources() -> dict:
    return {"lazyhippo": LazyhippoResource(), "graph_store": GraphStoreResource(), "object_store": ObjectStoreResource()}
