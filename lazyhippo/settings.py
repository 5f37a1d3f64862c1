"""The one module that reads the environment.

`Settings` describes an index (home, namespace, source, models, stores): `Settings.from_env()` fills it from the
LAZYHIPPO_* variables (the home, unset, from DAGSTER_HOME: `<home>/dagster`) when a run starts, never at import; CLI options or resource config then override with
`.with_(...)`, and the result is passed down to every stage. `environment()` holds the process-level values
(threads, model cache, endpoints and credentials of the servers) that the stores and models are built from.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Literal, Sequence

PACKAGE_DIR = Path(__file__).resolve().parent
SAMPLE_CORPUS = PACKAGE_DIR / "sample_corpus"  # package data: a non-editable install indexes it too


class GraphStoreKind(str, Enum):
    """The graph stores: a typed choice (bad values fail in config validation, before a run starts)."""

    embedded = "embedded"
    neo4j = "neo4j"


class ObjectStoreKind(str, Enum):
    local = "local"
    minio = "minio"


LlmKind = Literal["none", "openai"]
RERANK_PROVIDERS = ("none", "http", "cross-encoder")
CHUNK_SELECTIONS = ("graph", "vector", "weight")
IndexMode = Literal["replace", "add"]
INDEX_MODES = ("replace", "add")

MIN_CHUNK_TOKENS = 16  # below this a chunk cannot hold a sentence
NAMESPACE_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_namespace(namespace: str) -> str:
    """One rule for every store (warehouse rows, snapshot file, object keys, Neo4j): 1-64 letters, digits,
    '_' or '-', starting with a letter or digit. No '/', '.', or spaces, so keys stay inside the namespace."""
    if not isinstance(namespace, str) or not NAMESPACE_RULE.fullmatch(namespace):
        raise ValueError(f"invalid namespace {namespace!r}: use 1-64 letters, digits, '_' or '-', "
                         "starting with a letter or digit")
    return namespace


INSTANCE_HOME_FILE = "lazyhippo_home"  # in a Dagster instance folder other than <home>/dagster: its home


def instance_home(instance_dir: str | Path) -> Path:
    """The index home a Dagster instance folder belongs to: the one recorded in it, else its parent (the CLI
    creates the instance at `<home>/dagster`)."""
    marker = Path(instance_dir) / INSTANCE_HOME_FILE
    return Path(marker.read_text().strip()) if marker.exists() else Path(instance_dir).resolve().parent


# Settings field -> environment variable read by `from_env`
ENV = {"home": "LAZYHIPPO_HOME", "namespace": "LAZYHIPPO_NAMESPACE", "source": "LAZYHIPPO_SOURCE",
       "extractor": "LAZYHIPPO_EXTRACTOR", "embedder": "LAZYHIPPO_EMBEDDER", "llm_model": "LAZYHIPPO_LLM_MODEL",
       "graph_store": "LAZYHIPPO_GRAPH_STORE", "object_store": "LAZYHIPPO_OBJECT_STORE", "llm": "LAZYHIPPO_LLM",
       "rerank": "LAZYHIPPO_RERANK", "rerank_top_n": "LAZYHIPPO_RERANK_TOP_N",
       "chunk_selection": "LAZYHIPPO_CHUNK_SELECTION", "max_related_chunks": "LAZYHIPPO_MAX_RELATED_CHUNKS",
       "community_algorithm": "LAZYHIPPO_COMMUNITY_ALGORITHM",
       "community_resolutions": "LAZYHIPPO_COMMUNITY_RESOLUTIONS", "knn_structural": "LAZYHIPPO_KNN_STRUCTURAL"}
# fields that change how an index is queried, not what it holds (an index built with other values is the same)
QUERY_FIELDS = ("rerank", "rerank_top_n", "chunk_selection", "max_related_chunks")
KNN_STRUCTURAL = ("off", "concat", "replace")
# where the offline extraction's noun phrases come from: spaCy's parser (its noun chunks, the default), the
# tagger's parts of speech (a third less extraction CPU, not the default: docs/decisions.md), or nowhere
NOUN_PHRASES = ("parser", "tags", "none")


def check_resolutions(resolutions: Sequence[float] | str) -> tuple[float, ...]:
    """Community levels coarse to fine: one or more increasing positive resolutions ("0.25,0.5,1.0" too)."""
    try:
        res = tuple(float(r) for r in (resolutions.split(",") if isinstance(resolutions, str) else resolutions))
    except (TypeError, ValueError):
        res = ()
    if not res or not all(math.isfinite(r) and r > 0 for r in res) or any(a >= b for a, b in zip(res, res[1:])):
        raise ValueError(f"community resolutions {resolutions!r}: need one or more positive finite values, increasing "
                         "(coarse to fine, e.g. 0.25,0.5,1.0)")
    return res


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=lambda: Path(".lazyhippo").resolve())
    namespace: str = "default"
    source: str = str(SAMPLE_CORPUS)
    chunk_size: int = 256
    chunk_overlap: int = 32
    max_file_bytes: int = 20_000_000
    extractor: str = "nlp"  # "nlp" (offline spaCy) or "llm" (OpenAI-compatible)
    nlp_noun_phrases: str = "parser"  # NOUN_PHRASES
    embedder: str = "static-minilm"  # profile: lazyhippo.embedding.PROFILES
    llm: LlmKind = "none"   # "openai": community summaries and answers use the OpenAI-compatible endpoint
    llm_model: str = "gpt-4o-mini"
    embedding_model: str = "text-embedding-3-small"
    # co-occurrence relations a chunk contributes to the graph, its strongest pairs first (0: all of them)
    relations_per_chunk: int = 0
    knn_top_k: int = 3
    knn_cutoff: float = 0.60
    community_algorithm: str = "leiden"  # or "louvain"
    graph_store: str = "embedded"   # a GraphStoreKind value
    object_store: str = "local"     # an ObjectStoreKind value
    # query time: the reranker (URL, model and key in `environment()`) and how the local routes pick chunks
    rerank: str = "none"            # a RERANK_PROVIDERS value
    rerank_top_n: int = 20          # best retrieved chunks the reranker reorders
    chunk_selection: str | None = None   # a CHUNK_SELECTIONS value; None: the query config's (graph)
    max_related_chunks: int | None = None  # chunks the vector/weight selections keep; None: the query config's (20)
    # "replace": the namespace becomes exactly the source (documents it no longer yields are dropped); "add":
    # nothing is dropped; None (sensor, UI and rebuild runs): only what vanished from the source it was indexed from
    mode: IndexMode | None = None
    # community levels coarse to fine: Leiden runs once per resolution; Louvain keeps as many of its own passes
    community_resolutions: tuple[float, ...] = (0.25, 0.5, 1.0)
    # FastRP structural vectors in the entity KNN (Neo4j + GDS only): "concat" joins them to the text vectors,
    # "replace" searches on them alone
    knn_structural: str = "off"

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        """Defaults, then LAZYHIPPO_* variables, then `overrides` (None values are ignored). Without
        LAZYHIPPO_LLM, an LLM is used when OPENAI_BASE_URL or OPENAI_API_KEY is set."""
        env = {k: os.environ[v] for k, v in ENV.items() if os.environ.get(v)}
        for k in ("rerank_top_n", "max_related_chunks"):
            if k in env:
                env[k] = _int(ENV[k], env[k])
        if "home" not in env and os.environ.get("DAGSTER_HOME"):  # the instance and its home belong together
            env["home"] = str(instance_home(os.environ["DAGSTER_HOME"]))
        if "llm" not in env and (os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY")):
            env["llm"] = "openai"
        return cls().with_(**env).with_(**overrides)

    def __post_init__(self) -> None:
        check_namespace(self.namespace)  # before any stage or store sees it
        if self.mode is not None and self.mode not in INDEX_MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {', '.join(INDEX_MODES)}")
        object.__setattr__(self, "community_resolutions", check_resolutions(self.community_resolutions))
        if isinstance(self.nlp_noun_phrases, bool):  # as a namespace indexed before recorded it: on was the parser's
            object.__setattr__(self, "nlp_noun_phrases", "parser" if self.nlp_noun_phrases else "none")
        if self.nlp_noun_phrases not in NOUN_PHRASES:
            raise ValueError(f"nlp_noun_phrases {self.nlp_noun_phrases!r}: expected one of {', '.join(NOUN_PHRASES)}")
        if self.knn_structural not in KNN_STRUCTURAL:
            raise ValueError(f"knn_structural {self.knn_structural!r}: expected one of {', '.join(KNN_STRUCTURAL)}")
        if self.chunk_size < MIN_CHUNK_TOKENS or not 0 <= self.chunk_overlap < self.chunk_size:
            raise ValueError(f"chunk_size {self.chunk_size} / chunk_overlap {self.chunk_overlap}: need chunk_size >= "
                             f"{MIN_CHUNK_TOKENS} and 0 <= chunk_overlap < chunk_size")
        if self.rerank not in RERANK_PROVIDERS:
            raise ValueError(f"rerank {self.rerank!r} is not one of {', '.join(RERANK_PROVIDERS)} ({ENV['rerank']})")
        if self.chunk_selection is not None and self.chunk_selection not in CHUNK_SELECTIONS:
            raise ValueError(f"chunk_selection {self.chunk_selection!r} is not one of {', '.join(CHUNK_SELECTIONS)} "
                             f"({ENV['chunk_selection']})")
        if self.relations_per_chunk < 0 or self.knn_top_k < 0:
            raise ValueError(f"relations_per_chunk {self.relations_per_chunk} / knn_top_k {self.knn_top_k}: "
                             "need 0 or more")
        for name in ("rerank_top_n", "max_related_chunks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (got {value}; {ENV[name]})")

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


class MissingCredentials(RuntimeError):
    pass


def credentials_file() -> Path:
    """LAZYHIPPO_SERVICES_DIR/credentials.env (default ./.services, where scripts/services.sh writes it)."""
    return Path(os.environ.get("LAZYHIPPO_SERVICES_DIR") or ".services").resolve() / "credentials.env"


def _from_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    values = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values


def credential(*names: str, required: bool = True) -> str | None:
    """The first of `names` set in the environment, else in the services credentials file."""
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    path = credentials_file()
    stored = _from_file(path)
    for name in names:
        if stored.get(name):
            return stored[name]
    if required:
        raise MissingCredentials(f"{names[0]} is not set: export it, or run `bash scripts/services.sh install` "
                                 f"(writes a random one to {path})")
    return None


def _int(variable: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{variable}={value!r} is not a whole number") from None


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _names(variable: str) -> frozenset[str] | None:
    """The environment variable's comma-separated namespace list (each checked); None when unset."""
    value = os.environ.get(variable) or ""
    if not value.strip():
        return None
    try:
        return frozenset(check_namespace(n.strip()) for n in value.split(",") if n.strip())
    except ValueError as exc:
        raise ValueError(f"{variable}: {exc}") from None


def _count(variable: str) -> int:
    """The environment variable as a count (0 when unset)."""
    value = (os.environ.get(variable) or "0").strip()
    if not value.isdigit():
        raise ValueError(f"{variable}: expected a whole number, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Environment:
    """Process-level configuration, read from the environment by `environment()` at the edge (a run, a server,
    a command) and handed to the models and stores built there. Secrets never show in its repr."""

    home: Path | None = None               # LAZYHIPPO_HOME when set: an explicit home wins over the instance's
    threads: int = 0                       # LAZYHIPPO_THREADS: compute threads per process (0: up to 4 cores)
    duckdb_memory: str = "512MB"           # LAZYHIPPO_DUCKDB_MEMORY: a warehouse connection's memory; beyond it DuckDB spills to disk
    model_cache: Path = field(default_factory=lambda: Path.home() / ".cache" / "lazyhippo" / "models")
    openai_base_url: str | None = None
    openai_api_key: str | None = field(default=None, repr=False)
    llm_model: str | None = None
    api_key: str | None = field(default=None, repr=False)   # LAZYHIPPO_API_KEY: the HTTP API's write key
    read_key: str | None = field(default=None, repr=False)  # LAZYHIPPO_READ_KEY: queries only
    api_key_namespaces: frozenset[str] | None = None        # LAZYHIPPO_API_KEY_NAMESPACES: the write key's scope
    read_key_namespaces: frozenset[str] | None = None       # LAZYHIPPO_READ_KEY_NAMESPACES (unset: every namespace)
    source_roots: tuple[Path, ...] = ()    # LAZYHIPPO_SOURCE_ROOTS: folders `POST /api/kg/create` may read
    neo4j_uri: str | None = None
    neo4j_user: str | None = None
    neo4j_database: str | None = None
    minio_endpoint: str = "127.0.0.1:9000"
    minio_bucket: str = "lazyhippo"
    minio_secure: bool = False
    datasets: Path = Path("../shared/datasets")   # LAZYHIPPO_DATASETS: benchmark question sets
    rerank_url: str | None = None          # LAZYHIPPO_RERANK_URL: a /rerank endpoint (Cohere/Jina JSON)
    rerank_model: str | None = None        # LAZYHIPPO_RERANK_MODEL: its model name, or a cross-encoder's local path
    rerank_api_key: str | None = field(default=None, repr=False)  # LAZYHIPPO_RERANK_API_KEY
    verbose: bool = False                  # LAZYHIPPO_VERBOSE (`lazyhippo --verbose`): libraries' notices and debug logs
    # a Dagster cluster (lazyhippo_dagster.cluster): the executor its runs use when their config names none,
    # and the Celery broker and result backend (URLs that carry the Redis password)
    executor: str | None = None                   # LAZYHIPPO_EXECUTOR: "celery" in every cluster process
    celery_broker: str | None = field(default=None, repr=False)
    celery_backend: str | None = field(default=None, repr=False)
    snapshots: str | None = None                  # LAZYHIPPO_SNAPSHOTS: s3://bucket/prefix published snapshots go to
    # LAZYHIPPO_QUERY_DAEMON: idle minutes of the warm query process `lazyhippo query` starts and hands its
    # questions to (lazyhippo_dagster.query_daemon); 0: every query runs in its own process
    query_daemon_minutes: int = 10

    def compute_threads(self, cap: int = 4) -> int:
        """LAZYHIPPO_THREADS when set, else the cores this process may use, at most `cap`."""
        return self.threads or min(cap, len(os.sched_getaffinity(0)))


def environment() -> Environment:
    """The process-level values, read now (cheap: call it where a run, server or command starts)."""
    env = os.environ
    defaults = Environment()
    return Environment(
        home=Path(env["LAZYHIPPO_HOME"]).resolve() if env.get("LAZYHIPPO_HOME") else None,
        threads=_count("LAZYHIPPO_THREADS"),
        duckdb_memory=(env.get("LAZYHIPPO_DUCKDB_MEMORY") or "").strip() or defaults.duckdb_memory,
        model_cache=Path(env.get("LAZYHIPPO_MODEL_CACHE") or defaults.model_cache),
        openai_base_url=env.get("OPENAI_BASE_URL") or None,
        openai_api_key=env.get("OPENAI_API_KEY") or None,
        llm_model=env.get("LAZYHIPPO_LLM_MODEL") or None,
        api_key=env.get("LAZYHIPPO_API_KEY") or None,
        read_key=env.get("LAZYHIPPO_READ_KEY") or None,
        api_key_namespaces=_names("LAZYHIPPO_API_KEY_NAMESPACES"),
        read_key_namespaces=_names("LAZYHIPPO_READ_KEY_NAMESPACES"),
        source_roots=tuple(Path(p).expanduser() for p in (env.get("LAZYHIPPO_SOURCE_ROOTS") or "").split(os.pathsep) if p),
        neo4j_uri=env.get("NEO4J_URI") or None,
        neo4j_user=env.get("NEO4J_USER") or None,
        neo4j_database=env.get("NEO4J_DATABASE") or None,
        minio_endpoint=env.get("MINIO_ENDPOINT") or defaults.minio_endpoint,
        minio_bucket=env.get("MINIO_BUCKET") or defaults.minio_bucket,
        minio_secure=_flag(env.get("MINIO_SECURE")),
        datasets=Path(env.get("LAZYHIPPO_DATASETS") or defaults.datasets),
        rerank_url=env.get("LAZYHIPPO_RERANK_URL") or None,
        rerank_model=env.get("LAZYHIPPO_RERANK_MODEL") or None,
        rerank_api_key=env.get("LAZYHIPPO_RERANK_API_KEY") or None,
        verbose=_flag(env.get("LAZYHIPPO_VERBOSE")),
        executor=env.get("LAZYHIPPO_EXECUTOR") or None,
        celery_broker=env.get("LAZYHIPPO_CELERY_BROKER") or None,
        celery_backend=env.get("LAZYHIPPO_CELERY_BACKEND") or None,
        snapshots=env.get("LAZYHIPPO_SNAPSHOTS") or None,
        query_daemon_minutes=(_count("LAZYHIPPO_QUERY_DAEMON") if (env.get("LAZYHIPPO_QUERY_DAEMON") or "").strip()
                              else defaults.query_daemon_minutes),
    )


def child_environment(**variables: str) -> dict[str, str]:
    """This process's variables with `variables` set: the environment of a process started with other settings."""
    return {**os.environ, **variables}


def postgres_environment() -> dict[str, str]:
    """The PostgreSQL login a Dagster instance on PostgreSQL names by variable (the cluster's dagster.yaml)."""
    return {
        "LAZYHIPPO_PG_USER": credential("LAZYHIPPO_PG_USER"), "LAZYHIPPO_PG_PASSWORD": credential("LAZYHIPPO_PG_PASSWORD"),
        "LAZYHIPPO_PG_HOST": credential("LAZYHIPPO_PG_HOST", required=False) or "127.0.0.1",
        "LAZYHIPPO_PG_PORT": credential("LAZYHIPPO_PG_PORT"), "LAZYHIPPO_PG_DB": credential("LAZYHIPPO_PG_DB"),
    }


def cluster_environment() -> dict[str, str]:
    """The variables every process of a Dagster cluster gets (daemon, webserver, workers): the PostgreSQL
    login its dagster.yaml names (the file holds no secret), the Celery broker and result backend on Redis,
    and the shared object store. From the environment, else the services credentials file."""
    from urllib.parse import quote

    redis = (f"redis://:{quote(credential('LAZYHIPPO_REDIS_PASSWORD'), safe='')}@"
             f"{credential('LAZYHIPPO_REDIS_HOST', required=False) or '127.0.0.1'}:{credential('LAZYHIPPO_REDIS_PORT')}")
    env = environment()
    return {
        **postgres_environment(),
        "LAZYHIPPO_EXECUTOR": "celery",
        "LAZYHIPPO_CELERY_BROKER": env.celery_broker or f"{redis}/0",
        "LAZYHIPPO_CELERY_BACKEND": env.celery_backend or f"{redis}/1",
        "LAZYHIPPO_OBJECT_STORE": "minio", "MINIO_ENDPOINT": env.minio_endpoint, "MINIO_BUCKET": env.minio_bucket,
        "MINIO_ROOT_USER": credential("MINIO_ACCESS_KEY", "MINIO_ROOT_USER"),
        "MINIO_ROOT_PASSWORD": credential("MINIO_SECRET_KEY", "MINIO_ROOT_PASSWORD"),
        "LAZYHIPPO_MODEL_CACHE": str(env.model_cache),
    }
