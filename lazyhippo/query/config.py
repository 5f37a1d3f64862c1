"""Query-time settings. Separate from `Settings` (which describes the index): every knob has a default
that serves any corpus, and callers override per call with `QueryConfig(...)` or `.with_(...)`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from lazyhippo.graph.passage import GraphParams


@dataclass(frozen=True)
class LocalParams:
    """HippoRAG-2-style local retrieval. Seed weights are relative to an exact name match, which weighs its
    entity's IDF (PPR normalizes the seeds, so only their ratios count)."""

    damping: float = 0.5              # probability of following an edge in PPR
    tol: float = 1e-3                 # L1 change between iterations that stops PPR (~8 iterations at damping 0.5)
    max_iter: int = 50
    subsumed_factor: float = 0.1      # a match inside a longer matched span counts this much
    lowercase_span_factor: float = 0.05 # a span written in lower case (in a question that uses capitals)
    title_seed_weight: float = 2.0    # passages whose document title the query names (times IDF)
    embed_link_min: float = 0.80      # cosine a query phrase's nearest entity needs for an embedding link
    embed_weight: float = 0.5         # seed weight of embedding links (times cosine and IDF)
    fact_top_k: int = 3               # facts (sentences) matched to the query by embedding
    fact_lexical: float = 0.5         # + this * the fact's BM25 (max-normalized): names and rare words static vectors blur
    fact_seed_boost: float = 3.0      # facts naming exactly linked entities: score * (1 + boost * affinity)
    fact_weight: float = 0.5          # seed weight of entities of matched facts (times normalized score, IDF)
    passage_weight: float = 0.05      # dense passage seeds (min-max normalized similarity) times this
    passage_seed_top: int = 200       # passages seeded by dense similarity
    title_mass_weight: float = 2.0    # chunk score += this * PPR mass of its title entity (or of the title less "(...)")
    hub_df_share: float = 0.05        # entities in more than this share of passages count as hubs (IDF floor)
    coverage_weight: float = 0.3      # reorder of the best chunks: + this * share of the question's words (IDF) a chunk adds
    coverage_pool: int = 10           # best chunks that reorder can move (0 or weight 0: the graph's order)
    bridge_depth: int = 100           # chunks sharing an entity with the reorder's first pick join it from this deep (0: off)
    bridge_min_gain: float = 0.2      # ... if they hold this share (IDF) of the question's words the first pick lacks
    lexical_weight: float = 0.15      # the final order: the graph's and BM25's fused by rank, 1 / rank and this / rank (0: graph only)
    chunks_per_document: int = 1      # each document's best chunks ahead of any document's next ones (0: off)


@dataclass(frozen=True)
class GlobalParams:
    top_communities: int = 5
    min_similarity: float = 0.15      # communities below this cosine are dropped (unless keywords match)
    keyword_weight: float = 0.5
    size_weight: float = 0.1          # prior for larger communities (log size, normalized)
    chunks_per_community: int = 6
    min_evidence: float = 0.20        # a community's evidence needs this relevance to be kept
    hub_seed_weight: float = 0.1      # weight of community hub entities when they seed the local route
    level_min_score: float = 0.15     # the coarsest community level whose best match scores this much answers


@dataclass(frozen=True)
class MultiHopParams:
    """The local route's `multi_hop` option: breadth-first expansion from the linked entities, `levels` passage
    levels deep, then PPR on that subgraph only (0 levels: the whole graph, the default)."""

    levels: int = 0                   # 1 = the passages naming the linked entities, 2 = and the passages of the
                                      # entities those name, ... (graph hops: 2 * levels - 1); 0: off
    max_nodes: int = 20_000           # expansion stops growing once the subgraph holds this many nodes
    min_new_nodes: int = 3            # a hop that adds fewer new nodes than this ends the expansion
    hub_top_share: float = 0.01       # a hub (not expanded) is also among this share of entities named most often

    @property
    def hops(self) -> int:
        return 2 * self.levels - 1


@dataclass(frozen=True)
class ContextParams:
    noise_penalty: float = 0.05       # score multiplier for form-label, bare-heading and near-empty chunks
    min_content_words: int = 6        # fewer content words than this: near-empty
    dedup_min_chars: int = 20         # shorter sentences are never treated as duplicates
    dedup_cover: float = 0.8          # a seen sentence covering this share of a new one makes it a duplicate
    group_neighbours: bool = False    # pull same-section neighbour chunks in after their anchor
    neighbour_decay: float = 0.5      # a neighbour's score is its anchor's times this


@dataclass(frozen=True)
class ChunkSelectionParams:
    """How the local route turns the graph's answer into chunks. `graph` ranks every chunk by
    its PPR score (HippoRAG 2, the default); LightRAG's two picks take the chunks that mention the question's
    entities (the `entities` with the most PPR mass) and keep `max_related_chunks` of them: `vector` by their
    similarity to the question, `weight` by the PPR mass of the entities each one mentions."""

    mode: str = "graph"               # graph | vector | weight
    max_related_chunks: int = 20
    entities: int = 20                # top entities by PPR mass whose chunks are the candidates


@dataclass(frozen=True)
class QueryConfig:
    graph: GraphParams = GraphParams()
    local: LocalParams = LocalParams()
    global_: GlobalParams = GlobalParams()
    context: ContextParams = ContextParams()
    multi_hop: MultiHopParams = MultiHopParams()
    candidates: int = 50              # chunks handed from retrieval to assembly (before budget)
    answer_sentences: int = 3         # at most, per part of the question, in an extractive answer
    subquestions: bool = False        # the local route splits a compound question and ranks each part too
    max_subquestions: int = 4
    selection: ChunkSelectionParams = ChunkSelectionParams()

    def with_(self, **sections) -> "QueryConfig":
        """`cfg.with_(local={"damping": 0.6})` -> a copy with those fields changed."""
        changes = {}
        for name, values in sections.items():
            key = "global_" if name == "global" else name
            current = getattr(self, key)
            changes[key] = replace(current, **values) if isinstance(values, dict) and hasattr(current, "__dataclass_fields__") else values
        return replace(self, **changes)


DEFAULT_CONFIG = QueryConfig()


def config_for(settings, config: QueryConfig | None = None) -> QueryConfig:
    """`config` (default: DEFAULT_CONFIG) with the query-time choices `settings` makes (LAZYHIPPO_*, resource
    config, CLI options); the same object when it makes none, so the default path is untouched."""
    config = config or DEFAULT_CONFIG
    chosen = {k: v for k, v in (("mode", settings.chunk_selection), ("max_related_chunks", settings.max_related_chunks))
              if v is not None and v != getattr(config.selection, k)}
    return config.with_(selection=chosen) if chosen else config


def _option(help_: str):
    return field(default=None, metadata={"help": help_})


@dataclass(frozen=True)
class QueryOptions:
    """The query-time options every surface offers by the same names: `lazyhippo query | chat` options, HTTP
    request fields, MCP tool arguments and the Dagster `query` job's `options` config. None leaves the server's
    or run's value (for the first four, the LAZYHIPPO_* settings; for the rest, QueryConfig's defaults)."""

    rerank: str | None = _option("Reranker: none | http | cross-encoder.")
    rerank_top_n: int | None = _option("Best chunks the reranker reorders (1 or more).")
    chunk_selection: str | None = _option("How the local routes pick chunks: graph (PPR), vector or weight (LightRAG).")
    max_related_chunks: int | None = _option("Chunks the vector/weight selections keep (1 or more).")
    group_neighbours: bool | None = _option("Pull same-section neighbour chunks in after their anchor [off].")
    damping: float | None = _option("PPR damping: probability of following an edge, between 0 and 1 exclusive [0.5].")
    communities: int | None = _option("Communities the global route reads, 1-50 [5].")
    knn_threshold: float | None = _option("Cosine a KNN (SEMANTICALLY_SIMILAR) edge needs to join the walk's graph, "
                                          "0-1 [0.90]; another value builds that graph once per server.")
    hub_weight: float | None = _option("Seed weight of matched communities' hub entities in the global fallback and "
                                       "in each part's walk under subquestions, 0-100 [0.1].")
    lexical_weight: float | None = _option("BM25's weight in the local route's fusion by rank with the graph's order, "
                                           "0-10 (0: the graph's order alone) [0.15]; higher for exact terms.")
    multi_hop: int | None = _option("Confine the local route's walk to the passages within this many levels of the "
                                    "question's entities, 1-3 [off: the whole graph].")
    subquestions: bool | None = _option("Split a compound question: each part's ranking fills the places after the "
                                        "whole question's best passage [off].")

    def __post_init__(self):
        from lazyhippo.settings import CHUNK_SELECTIONS, RERANK_PROVIDERS

        checks = {"rerank": (lambda v: v in RERANK_PROVIDERS, f"one of {', '.join(RERANK_PROVIDERS)}"),
                  "chunk_selection": (lambda v: v in CHUNK_SELECTIONS, f"one of {', '.join(CHUNK_SELECTIONS)}"),
                  "rerank_top_n": (lambda v: _integer(v) and v >= 1, "an integer, 1 or more"),
                  "max_related_chunks": (lambda v: _integer(v) and v >= 1, "an integer, 1 or more"),
                  "group_neighbours": (lambda v: isinstance(v, bool), "true or false"),
                  "damping": (lambda v: _number(v) and 0 < v < 1, "a number between 0 and 1 (exclusive)"),
                  "communities": (lambda v: _integer(v) and 1 <= v <= 50, "an integer from 1 to 50"),
                  "knn_threshold": (lambda v: _number(v) and 0 <= v <= 1, "a number from 0 to 1"),
                  "hub_weight": (lambda v: _number(v) and 0 <= v <= 100, "a number from 0 to 100"),
                  "lexical_weight": (lambda v: _number(v) and 0 <= v <= 10, "a number from 0 to 10"),
                  "multi_hop": (lambda v: _integer(v) and 1 <= v <= 3, "an integer from 1 to 3"),
                  "subquestions": (lambda v: isinstance(v, bool), "true or false")}
        for name, (ok, expected) in checks.items():
            value = getattr(self, name)
            if value is not None and not ok(value):
                raise ValueError(f"query option {name} {value!r}: expected {expected}")

    @classmethod
    def from_mapping(cls, values: dict | None) -> "QueryOptions":
        """From a request's or a config's options (None values left out); unknown names are refused."""
        values = {k: v for k, v in (values or {}).items() if v is not None}
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown query option(s) {', '.join(unknown)} (choose from {', '.join(option_names())})")
        return cls(**values)

    def chosen(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def settings(self, settings):
        """`settings` with the options that are settings (rerank, rerank_top_n, chunk_selection, max_related_chunks)."""
        from lazyhippo.settings import QUERY_FIELDS

        chosen = {k: v for k, v in self.chosen().items() if k in QUERY_FIELDS}
        return settings.with_(**chosen) if chosen else settings

    def config(self, config: "QueryConfig | None" = None) -> "QueryConfig":
        """`config` (default: DEFAULT_CONFIG) with the options that are QueryConfig fields."""
        config = config or DEFAULT_CONFIG
        places = {"group_neighbours": ("context", "group_neighbours"), "damping": ("local", "damping"),
                  "communities": ("global", "top_communities"), "knn_threshold": ("graph", "synonym_min_score"),
                  "hub_weight": ("global", "hub_seed_weight"), "lexical_weight": ("local", "lexical_weight"),
                  "multi_hop": ("multi_hop", "levels"), "subquestions": (None, "subquestions")}
        sections: dict[str, dict] = {}
        for name, value in self.chosen().items():
            if name in places:
                section, key = places[name]
                if section is None:  # a top-level field
                    sections[key] = value
                else:
                    sections.setdefault(section, {})[key] = value
        return config.with_(**sections) if sections else config


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def option_names() -> list[str]:
    return [f.name for f in fields(QueryOptions)]


def option_fields() -> list[tuple[str, type, str]]:
    """(name, type, help) per option: what a surface needs to declare them (HTTP body, Dagster config)."""
    import typing

    hints = typing.get_type_hints(QueryOptions)
    return [(f.name, hints[f.name], f.metadata["help"]) for f in fields(QueryOptions)]
