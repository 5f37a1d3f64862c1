"""Every CLI option is checked before a run is launched, so a bad value is one line naming the option, not a
Dagster traceback from inside the run (and never a run that writes empty chunks over good ones)."""

from __future__ import annotations

from pathlib import Path

from lazyhippo.models.embedders import PROFILES as EMBEDDER_PROFILES
from lazyhippo.settings import check_resolutions
from lazyhippo.settings import KNN_STRUCTURAL, MIN_CHUNK_TOKENS, GraphStoreKind, ObjectStoreKind, Settings, check_namespace
from lazyhippo.sources.files import SUPPORTED, iter_files

GRAPH_STORES = tuple(k.value for k in GraphStoreKind)
OBJECT_STORES = tuple(k.value for k in ObjectStoreKind)
EXTRACTORS = ("nlp", "llm")
COMMUNITY_ALGORITHMS = ("leiden", "louvain")


class OptionError(ValueError):
    """A bad command-line value; the message is the whole explanation."""


class NothingToIndex(ValueError):
    """The source has files but not one readable document, and the namespace holds none: no run could build a
    graph, so none starts. The message names each file and why it cannot be read."""


def _choice(option: str, value: str | None, allowed) -> None:
    if value is not None and value not in allowed:
        raise OptionError(f"{option} {value!r} is not one of: {', '.join(allowed)}")


def _at_least(option: str, value: float | None, low: float) -> None:
    if value is not None and value < low:
        raise OptionError(f"{option} must be at least {low:g} (got {value:g})")


def check_namespace_option(namespace: str) -> None:
    try:
        check_namespace(namespace)
    except ValueError as exc:
        raise OptionError(f"--namespace: {exc}") from None


def check_index_options(source: Path, namespace: str, *, chunk_size: int | None, chunk_overlap: int | None,
                        knn_top_k: int | None, knn_cutoff: float | None, community_algorithm: str | None,
                        graph_store: str | None, object_store: str | None, extractor: str | None,
                        embedder: str | None = None, community_resolutions: str | None = None,
                        knn_structural: str | None = None, relations_per_chunk: int | None = None) -> None:
    """Unset (None) options take the Settings defaults, which are valid."""
    if not source.exists():
        raise OptionError(f"{source} does not exist")
    if not iter_files(source):
        raise OptionError(f"{source} holds no readable {'/'.join(sorted(SUPPORTED))} file: nothing to index "
                          "(to empty a namespace, delete it explicitly)")
    check_namespace_option(namespace)
    defaults = Settings()
    size = defaults.chunk_size if chunk_size is None else chunk_size
    overlap = defaults.chunk_overlap if chunk_overlap is None else chunk_overlap
    _at_least("--chunk-size", size, MIN_CHUNK_TOKENS)
    _at_least("--chunk-overlap", overlap, 0)
    if overlap >= size:
        raise OptionError(f"--chunk-overlap ({overlap}) must be smaller than --chunk-size ({size})")
    _at_least("--knn-top-k", knn_top_k, 0)
    _at_least("--relations-per-chunk", relations_per_chunk, 0)
    if knn_cutoff is not None and not -1.0 <= knn_cutoff <= 1.0:
        raise OptionError(f"--knn-cutoff is a cosine similarity in [-1, 1] (got {knn_cutoff:g})")
    _choice("--community-algorithm", community_algorithm, COMMUNITY_ALGORITHMS)
    _choice("--graph-store", graph_store, GRAPH_STORES)
    _choice("--object-store", object_store, OBJECT_STORES)
    _choice("--extractor", extractor, EXTRACTORS)
    _choice("--embedder", embedder, EMBEDDER_PROFILES)
    resolutions_list(community_resolutions)
    _choice("--knn-structural", knn_structural, KNN_STRUCTURAL)
    if knn_structural not in (None, "off") and (graph_store or Settings.from_env().graph_store) != "neo4j":
        raise OptionError(f"--knn-structural {knn_structural} needs --graph-store neo4j (FastRP runs in GDS)")


def resolutions_list(value: str | None) -> list[float] | None:
    """--community-resolutions "0.25,0.5,1.0" as the list the resource config takes (None: unset)."""
    if value is None:
        return None
    try:
        return list(check_resolutions(value))
    except ValueError as exc:
        raise OptionError(f"--community-resolutions: {exc}") from None


def check_query_options(question: str, namespace: str, *, route: str, top_k: int, budget: int,
                        graph_store: str | None) -> None:
    from lazyhippo.query import ROUTES

    if not question.strip():
        raise OptionError("the question is empty")
    check_namespace_option(namespace)
    _choice("--route", route, ("auto", *ROUTES))
    _at_least("--top-k", top_k, 1)
    _at_least("--budget", budget, 64)
    _choice("--graph-store", graph_store, GRAPH_STORES)
