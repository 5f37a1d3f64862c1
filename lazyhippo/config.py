"""One settings object shared by the CLI, the Dagster resources and library callers."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = REPO_ROOT / "dbt_like_sql"
SAMPLE_CORPUS = REPO_ROOT / "sample_corpus"


MIN_CHUNK_TOKENS = 16  # below this a chunk cannot hold a sentence
NAMESPACE_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_namespace(namespace: str) -> str:
    """One rule for every store (warehouse rows, snapshot file, object keys, Neo4j): 1-64 letters, digits,
    '_' or '-', starting with a letter or digit. No '/', '.', or spaces, so keys stay inside the namespace."""
    if not isinstance(namespace, str) or not NAMESPACE_RULE.fullmatch(namespace):
        raise ValueError(f"invalid namespace {namespace!r}: use 1-64 letters, digits, '_' or '-', "
                         "starting with a letter or digit")
    return namespace


def default_home() -> Path:
    return Path(os.environ.get("LAZYHIPPO_HOME", ".lazyhippo")).resolve()


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=default_home)
    namespace: str = "default"
    source: str = str(SAMPLE_CORPUS)
    chunk_size: int = 256
    chunk_overlap: int = 32
    max_file_bytes: int = 20_000_000
    extractor: str = "nlp"  # "nlp" (offline spaCy) or "llm" (OpenAI-compatible)
    nlp_noun_phrases: bool = True
    embedder: str = "static-minilm"  # or "openai"
    llm_model: str = "gpt-4o-mini"
    embedding_model: str = "text-embedding-3-small"
    knn_top_k: int = 10
    knn_cutoff: float = 0.60
    community_algorithm: str = "leiden"  # or "louvain"
    graph_store: str = "embedded"  # or "neo4j"
    object_store: str = "local"  # or "minio"

    def __post_init__(self) -> None:
        check_namespace(self.namespace)  # before any stage or store sees it
        if self.chunk_size < MIN_CHUNK_TOKENS or not 0 <= self.chunk_overlap < self.chunk_size:
            raise ValueError(f"chunk_size {self.chunk_size} / chunk_overlap {self.chunk_overlap}: need chunk_size >= "
                             f"{MIN_CHUNK_TOKENS} and 0 <= chunk_overlap < chunk_size")

    def with_(self, **changes) -> "Settings":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def db_path(self) -> Path:
        return self.home / "warehouse.duckdb"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def export_dir(self) -> Path:
        return self.home / "objects"
