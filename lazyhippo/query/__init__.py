"""Query engine: local (HippoRAG 2 PPR, with the multi_hop and subquestions options), global (communities) and auto
routes over an in-memory GraphIndex loaded once per warehouse version. Pure Python: no Dagster imports.

    from lazyhippo.query import answer_question, retrieve
    result = answer_question(settings, "Who succeeded the founder of the Marlow Observatory?")
    print(result.answer, result.citations, result.to_dict())
"""

from lazyhippo.graph.ppr import EmbeddedPPR, PPRBackend, PPRResult, personalized_pagerank, transition_matrix
from lazyhippo.query.answer import (
                                    NO_ANSWER,
                                    QueryResult,
                                    Retrieval,
                                    answer_question,
                                    extractive_answer,
                                    retrieve,
                                    search,
)
from lazyhippo.query.config import (
                                    DEFAULT_CONFIG,
                                    ChunkSelectionParams,
                                    ContextParams,
                                    GlobalParams,
                                    GraphParams,
                                    LocalParams,
                                    MultiHopParams,
                                    QueryConfig,
                                    QueryOptions,
)
from lazyhippo.query.context import ContextChunk, assemble_context, noise_reason, render_context
from lazyhippo.query.loader import GraphIndex, clear_cache, load_index
from lazyhippo.query.rerank import (
                                    CircuitBreaker,
                                    CrossEncoderReranker,
                                    HttpReranker,
                                    Reranker,
                                    RerankError,
                                    RerankStage,
                                    RerankUnavailable,
                                    configured_reranker,
)
from lazyhippo.query.routes import (
                                    ROUTES,
                                    RouteRequest,
                                    RouteResult,
                                    auto_route,
                                    classify_query,
                                    run_route,
                                    split_question,
)
from lazyhippo.query.types import PreparedQuery, ScoredChunk

__all__ = [
    "answer_question", "retrieve", "search", "Retrieval", "QueryResult", "ChunkSelectionParams", "configured_reranker", "ScoredChunk", "ContextChunk", "QueryConfig", "QueryOptions", "DEFAULT_CONFIG",
    "GraphParams", "LocalParams", "MultiHopParams", "GlobalParams", "ContextParams", "GraphIndex",
    "load_index", "clear_cache", "PPRBackend", "EmbeddedPPR", "PPRResult", "personalized_pagerank", "transition_matrix",
    "Reranker", "RerankStage", "RerankUnavailable", "CircuitBreaker", "HttpReranker", "CrossEncoderReranker", "RerankError",
    "assemble_context", "render_context", "noise_reason", "extractive_answer", "NO_ANSWER", "ROUTES",
    "auto_route", "classify_query", "split_question", "PreparedQuery", "RouteRequest", "RouteResult", "run_route",
]
