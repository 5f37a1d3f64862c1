"""Dagster resources: thin adapters from configuration (and EnvVar secrets) to engine objects."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import dagster as dg
import duckdb
from pydantic import PrivateAttr

from lazyhippo.config import SAMPLE_CORPUS, Settings
from lazyhippo.graphstore import GraphStore, open_graph_store
from lazyhippo.objectstore import LocalObjectStore, ObjectStore
from lazyhippo.warehouse import connect

PARTITION_TAG = "dagster/partition"


class LazyhippoResource(dg.ConfigurableResource):
    """Where the index lives, which knowledge base (namespace), and how each stage behaves."""

    home: str = os.environ.get("LAZYHIPPO_HOME", ".lazyhippo")
    namespace: str = os.environ.get("LAZYHIPPO_NAMESPACE", "default")
    source: str = os.environ.get("LAZYHIPPO_SOURCE", str(SAMPLE_CORPUS))
    chunk_size: int = 256
    chunk_overlap: int = 32
    max_file_bytes: int = 20_000_000
    extractor: str = os.environ.get("LAZYHIPPO_EXTRACTOR", "nlp")
    nlp_noun_phrases: bool = True
    embedder: str = os.environ.get("LAZYHIPPO_EMBEDDER", "static-minilm")
    llm_model: str = os.environ.get("LAZYHIPPO_LLM_MODEL", "gpt-4o-mini")
    embedding_model: str = "text-embedding-3-small"
    knn_top_k: int = 10
    knn_cutoff: float = 0.60
    community_algorithm: str = "leiden"
    # benchmark asset checks (questions.json / themes.json beside the source are used when present)
    check_budget: int = 4000
    noise_share_max: float = 0.25
    theme_coverage_min: float = 0.9
    recall_at_5_min: float = 0.6

    # the run's namespace partition (assets are partitioned by namespace); None outside partitioned runs
    _partition: Optional[str] = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.run
        self._partition = run.tags.get(PARTITION_TAG) if run is not None else None

    def settings(self) -> Settings:
        """The partition key, when the run has one, is the namespace: one knowledge base per partition."""
        fields = {k: getattr(self, k) for k in Settings.__dataclass_fields__ if hasattr(self, k)}
        fields["home"] = Path(self.home).resolve()
        fields["namespace"] = self._partition or self.namespace
        return Settings(**fields)

    @contextmanager
    def warehouse(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with connect(self.settings()) as con:
            yield con


class GraphStoreResource(dg.ConfigurableResource):
    """`embedded` (DuckDB + in-process algorithms) or `neo4j` (Bolt + GDS; credentials from the environment)."""

    kind: str = os.environ.get("LAZYHIPPO_GRAPH_STORE", "embedded")
    neo4j_uri: str = os.environ.get("NEO4J_URI", "bolt://127.0.0.1:7687")
    neo4j_user: str = os.environ.get("NEO4J_USER", "neo4j")
    neo4j_password: Optional[str] = None
    knn_structural: bool = os.environ.get("LAZYHIPPO_KNN_STRUCTURAL", "0").lower() in ("1", "true", "yes")

    def open(self) -> GraphStore:
        if self.kind == "neo4j":
            from lazyhippo.neo4j_store import Neo4jGraphStore

            # unset password: NEO4J_PASSWORD, else the loopback dev default of scripts/services.sh
            return Neo4jGraphStore.from_env(uri=self.neo4j_uri, user=self.neo4j_user, password=self.neo4j_password,
                                            knn_structural=self.knn_structural)
        return open_graph_store(self.kind)

    @contextmanager
    def session(self) -> Iterator[GraphStore]:
        store = self.open()
        try:
            yield store
        finally:
            store.close()

    def ppr_backend(self, namespace: str):
        """None on the embedded store (in-process sparse PPR); gds.pageRank on a warm projection on Neo4j."""
        return self.open().ppr_backend(namespace) if self.kind == "neo4j" else None


class ObjectStoreResource(dg.ConfigurableResource):
    """`local` (a folder under the index home) or `minio` (S3-compatible; credentials from the environment)."""

    kind: str = os.environ.get("LAZYHIPPO_OBJECT_STORE", "local")
    root: Optional[str] = None
    endpoint: str = os.environ.get("MINIO_ENDPOINT", "127.0.0.1:9000")
    bucket: str = os.environ.get("MINIO_BUCKET", "lazyhippo")
    access_key: Optional[str] = None
    secret_key: Optional[str] = None
    secure: bool = False

    def open(self, settings: Settings) -> ObjectStore:
        if self.kind == "minio":
            from lazyhippo.minio_store import DEV_ACCESS_KEY, DEV_SECRET_KEY, MinioObjectStore

            # unset keys: MINIO_ROOT_USER / MINIO_ROOT_PASSWORD, else the loopback dev defaults of scripts/services.sh
            return MinioObjectStore(self.endpoint, self.bucket,
                                    self.access_key or os.environ.get("MINIO_ROOT_USER") or DEV_ACCESS_KEY,
                                    self.secret_key or os.environ.get("MINIO_ROOT_PASSWORD") or DEV_SECRET_KEY, self.secure)
        if self.kind != "local":
            raise ValueError(f"unknown object_store {self.kind!r} (expected 'local' or 'minio')")
        return LocalObjectStore(Path(self.root) if self.root else settings.export_dir)


def _secret(name: str):
    """An EnvVar where the variable is set (resolved at run time, never logged), else nothing."""
    return dg.EnvVar(name) if os.environ.get(name) else None


def default_resources() -> dict:
    return {
        "lazyhippo": LazyhippoResource(),
        "graph_store": GraphStoreResource(neo4j_password=_secret("NEO4J_PASSWORD")),
        "object_store": ObjectStoreResource(access_key=_secret("MINIO_ROOT_USER"), secret_key=_secret("MINIO_ROOT_PASSWORD")),
    }
