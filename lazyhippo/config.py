"""One settings object shared by the CLI, the Dagster resources and library callers.

Filled once per run: `Settings.from_env()` reads the LAZYHIPPO_* variables (and whether an OpenAI-compatible
endpoint is configured) when called, never at import; the CLI options or the resource config then override
with `.with_(...)`, and the result is passed down to every stage.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Literal

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
SAMPLE_CORPUS = REPO_ROOT / "sample_corpus"


class GraphStoreKind(str, Enum):
    """The graph stores: a typed choice (bad values fail in config validation, before a run starts)."""

    embedded = "embedded"
    neo4j = "neo4j"


class ObjectStoreKind(str, Enum):
    local = "local"
    minio = "minio"


LlmKind = Literal["none", "openai"]

MIN_CHUNK_TOKENS = 16  # below this a chunk cannot hold a sentence
NAMESPACE_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_namespace(namespace: str) -> str:
    """One rule for every store (warehouse rows, snapshot file, object keys, Neo4j): 1-64 letters, digits,
    '_' or '-', starting with a letter or digit. No '/', '.', or spaces, so keys stay inside the namespace."""
    if not isinstance(namespace, str) or not NAMESPACE_RULE.fullmatch(namespace):
        raise ValueError(f"invalid namespace {namespace!r}: use 1-64 letters, digits, '_' or '-', "
                         "starting with a letter or digit")
    return namespace


# Settings field -> environment variable read by `from_env`
ENV = {"home": "LAZYHIPPO_HOME", "namespace": "LAZYHIPPO_NAMESPACE", "source": "LAZYHIPPO_SOURCE",
       "extractor": "LAZYHIPPO_EXTRACTOR", "embedder": "LAZYHIPPO_EMBEDDER", "llm_model": "LAZYHIPPO_LLM_MODEL",
       "graph_store": "LAZYHIPPO_GRAPH_STORE", "object_store": "LAZYHIPPO_OBJECT_STORE", "llm": "LAZYHIPPO_LLM"}


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=lambda: Path(".lazyhippo").resolve())
    namespace: str = "default"
    source: str = str(SAMPLE_CORPUS)
    chunk_size: int = 256
    chunk_overlap: int = 32
    max_file_bytes: int = 20_000_000
    extractor: str = "nlp"  # "nlp" (offline spaCy) or "llm" (OpenAI-compatible)
    nlp_noun_phrases: bool = True
    embedder: str = "static-minilm"  # profile: lazyhippo.embedding.PROFILES
    llm: LlmKind = "none"   # "openai": community summaries and answers use the OpenAI-compatible endpoint
    llm_model: str = "gpt-4o-mini"
    embedding_model: str = "text-embedding-3-small"
    knn_top_k: int = 10
    knn_cutoff: float = 0.60
    community_algorithm: str = "leiden"  # or "louvain"
    graph_store: str = "embedded"   # a GraphStoreKind value
    object_store: str = "local"     # an ObjectStoreKind value

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        """Defaults, then LAZYHIPPO_* variables, then `overrides` (None values are ignored). Without
        LAZYHIPPO_LLM, an LLM is used when OPENAI_BASE_URL or OPENAI_API_KEY is set."""
        env = {k: os.environ[v] for k, v in ENV.items() if os.environ.get(v)}
        if "llm" not in env and (os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY")):
            env["llm"] = "openai"
        return cls().with_(**env).with_(**overrides)

    def __post_init__(self) -> None:
        check_namespace(self.namespace)  # before any stage or store sees it
        if self.chunk_size < MIN_CHUNK_TOKENS or not 0 <= self.chunk_overlap < self.chunk_size:
            raise ValueError(f"chunk_size {self.chunk_size} / chunk_overlap {self.chunk_overlap}: need chunk_size >= "
                             f"{MIN_CHUNK_TOKENS} and 0 <= chunk_overlap < chunk_size")

    def with_(self, **changes) -> "Settings":
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        changes = {k: v for k, v in changes.items() if v is not None}
        if "home" in changes:
            changes["home"] = Path(changes["home"]).resolve()
        return replace(self, **changes)

    @property
    def db_path(self) -> Path:
        return self.home / "warehouse.duckdb"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def export_dir(self) -> Path:
        return self.home / "objects"
