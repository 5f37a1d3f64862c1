"""Typed results of the indexing stages. `figures()` gives their plain numbers and strings (what Dagster
shows as metadata and plots across runs); lists and maps (errors, previews) stay typed fields."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from lazyhippo.sources.files import ReadError


@dataclass(frozen=True, kw_only=True)
class StageResult:
    synced: dict = field(default_factory=dict)   # what the graph store's sync of this asset reported
    llm_usage: list[dict] = field(default_factory=list)  # LLM calls and tokens per operation and model

    def figures(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {k: v for k, v in out.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        out.update({f"graph_store_{k}": v for k, v in self.synced.items() if isinstance(v, (int, float, str))})
        return out


@dataclass(frozen=True, kw_only=True)
class DocumentsResult(StageResult):
    documents: int
    changed: int
    removed: int
    kept_after_error: int
    skipped_deleted: int = 0   # deleted by `lazyhippo delete`, unchanged since: kept out
    errors: list[ReadError] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ChunksResult(StageResult):
    chunks: int
    tokens_total: int
    tokens_max: int
    rechunked_documents: int = 0   # new or changed since their chunks were made (the rest kept their rows)
    capped_documents: int = 0      # cut at MAX_CHUNKS_PER_DOCUMENT chunks


@dataclass(frozen=True, kw_only=True)
class ExtractionsResult(StageResult):
    chunks: int
    cached: int
    computed: int
    failed: int
    extractor: str
    raw_entities: int
    raw_relations: int
    facts: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: dict[str, str] = field(default_factory=dict)   # chunk id -> reason


@dataclass(frozen=True, kw_only=True)
class GraphTablesResult(StageResult):
    entities: int
    relations: int
    mentions: int
    facts: int
    merged_entities: int = 0   # recorded merges folded in (`lazyhippo merge`)
    scoped_entities: int | None = None  # the entities an update rebuilt rows for (None: the tables were rebuilt whole)
    entities_summarized: int = 0    # descriptions map-reduced by the LLM
    relations_summarized: int = 0


@dataclass(frozen=True, kw_only=True)
class EmbeddingsResult(StageResult):
    model: str
    chunks: int
    entities: int
    facts: int
    newly_embedded: int


@dataclass(frozen=True, kw_only=True)
class KnnResult(StageResult):
    edges: int
    entities: int
    top_k: int
    cutoff: float
    score_min: float
    score_mean: float
    searched: int = 0   # entities whose neighbours were searched (all of them unless the update was incremental)


@dataclass(frozen=True, kw_only=True)
class CommunitiesResult(StageResult):
    communities: int
    modularity: float
    algorithm: str
    levels: int            # levels of the hierarchy stored (communities.level 0 .. levels - 1)
    largest: int
    singletons: int
    size_distribution: dict[int, int] = field(default_factory=dict)   # size (50 = 50+) -> communities
    reused: bool = False   # the graph was unchanged: the recorded communities and PageRank stand
    seeded: bool = False   # Leiden started from the previous partition (a small change)
    per_level: list[int] = field(default_factory=list)   # communities per level, coarse to fine (the counts above: finest)


@dataclass(frozen=True, kw_only=True)
class SummariesResult(StageResult):
    summaries: int
    embedded: int
    llm: str
    reports: int = 0                # community reports written by the LLM (cached ones included)
    report_failures: int = 0
    report_cached: int = 0
    report_errors: dict[str, str] = field(default_factory=dict)   # community id -> reason
    preview: list[dict] = field(default_factory=list)   # the largest communities: id, size, title, summary


@dataclass(frozen=True, kw_only=True)
class ExportsResult(StageResult):
    store: str
    run_key: str
    objects: dict[str, dict] = field(default_factory=dict)   # table -> key, rows, bytes, md5
    written: list[str] = field(default_factory=list)   # the tables written this run (the others were unchanged)
