"""Every CLI option is checked before a run is launched, so a bad value is one line naming the option, not a
Dagster traceback from inside the run (and never a run that writes empty chunks over good ones)."""

from __future__ import annotations

from pathlib import Path

from lazyhippo.config import MIN_CHUNK_TOKENS, check_namespace
from lazyhippo.documents import SUPPORTED, iter_files

GRAPH_STORES = ("embedded", "neo4j")
OBJECT_STORES = ("local", "minio")
EXTRACTORS = ("nlp", "llm")
COMMUNITY_ALGORITHMS = ("leiden", "louvain")


class OptionError(ValueError):
    """A bad command-line value; the message is the whole explanation."""


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise OptionError(f"{option} {value!r} is not one of: {', '.join(allowed)}")


def _at_least(option: str, value: float, low: float) -> None:
    if value < low:
        raise OptionError(f"{option} must be at least {low:g} (got {value:g})")


def check_namespace_option(namespace: str) -> None:
    try:
        check_namespace(namespace)
    except ValueError as exc:
        raise OptionError(f"--namespace: {exc}") from None


def check_index_options(source: Path, namespace: str, *, chunk_size: int, chunk_overlap: int, knn_top_k: int,
                        knn_cutoff: float, community_algorithm: str, graph_store: str, object_store: str,
                        extractor: str) -> None:
    if not source.exists():
        raise OptionError(f"{source} does not exist")
    if not iter_files(source):
        raise OptionError(f"{source} holds no readable {'/'.join(sorted(SUPPORTED))} file: nothing to index "
                          "(to empty a namespace, delete it explicitly)")
    check_namespace_option(namespace)
    _at_least("--chunk-size", chunk_size, MIN_CHUNK_TOKENS)
    _at_least("--chunk-overlap", chunk_overlap, 0)
    if chunk_overlap >= chunk_size:
        raise OptionError(f"--chunk-overlap ({chunk_overlap}) must be smaller than --chunk-size ({chunk_size})")
    _at_least("--knn-top-k", knn_top_k, 0)
    if not -1.0 <= knn_cutoff <= 1.0:
        raise OptionError(f"--knn-cutoff is a cosine similarity in [-1, 1] (got {knn_cutoff:g})")
    _choice("--community-algorithm", community_algorithm, COMMUNITY_ALGORITHMS)
    _choice("--graph-store", graph_store, GRAPH_STORES)
    _choice("--object-store", object_store, OBJECT_STORES)
    _choice("--extractor", extractor, EXTRACTORS)


def check_query_options(question: str, namespace: str, *, route: str, top_k: int, budget: int,
                        graph_store: str) -> None:
    from lazyhippo.query import ROUTES

    if not question.strip():
        raise OptionError("the question is empty")
    check_namespace_option(namespace)
    _choice("--route", route, ("auto", *ROUTES))
    _at_least("--top-k", top_k, 1)
    _at_least("--budget", budget, 64)
    _choice("--graph-store", graph_store, GRAPH_STORES)
