"""Global route (LazyGraphRAG over communities): match the question to community summaries by embedding
and keywords, map each top community to the evidence it holds for the question (communities with
nothing relevant are dropped), reduce to one ranked list of evidence chunks.

Offline the map step is extractive (the community's most relevant chunks and summary sentences); with
an LLM the answer stage turns the same evidence into a synthesized answer (see answer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lazyhippo.query.config import GlobalParams
from lazyhippo.query.loader import GraphIndex
from lazyhippo.query.text import norm_key, sentences, tokens
from lazyhippo.query.nearest import top_indices
from lazyhippo.query.types import PreparedQuery, ScoredChunk


@dataclass
class CommunityEvidence:
    community_id: str
    title: str
    score: float                    # query-community match
    relevance: float                # best evidence relevance (the map step's keep/drop test)
    hubs: list[str]
    chunks: list[tuple[int, float]] = field(default_factory=list)  # (chunk index, relevance)
    summary_points: list[str] = field(default_factory=list)

    def chunk_ids(self, idx: GraphIndex) -> list[str]:
        return [idx.chunks.ids[c] for c, _ in self.chunks]

    def to_dict(self) -> dict:
        return {"community_id": self.community_id, "title": self.title, "score": round(self.score, 4),
                "relevance": round(self.relevance, 4), "hubs": self.hubs, "summary_points": self.summary_points}


def community_scores(idx: GraphIndex, q: PreparedQuery, p: GlobalParams) -> np.ndarray:
    """Embedding similarity + keyword overlap with the summary + a small size prior (big themes first)."""
    if not idx.communities.ids:
        return np.zeros(0)
    sims = idx.communities.vecs @ q.vec
    kw = set(q.keywords)
    overlap = np.array([len(kw & toks) / max(len(kw), 1) for toks in idx.communities.tokens])
    sizes = np.array([len(m) for m in idx.communities.members], dtype=np.float64)
    prior = np.log1p(sizes) / np.log1p(max(sizes.max(), 1.0))
    return sims + p.keyword_weight * overlap + p.size_weight * prior


def _relevance(idx: GraphIndex, q: PreparedQuery) -> np.ndarray:
    """Per-chunk query relevance in [0, ~1]: dense similarity plus normalized BM25."""
    bm = q.bm25
    top = float(bm.max()) if bm.size else 0.0
    return np.clip(q.dense, 0, None) + (0.5 * bm / top if top > 0 else 0.0)


def matched_communities(idx: GraphIndex, q: PreparedQuery, p: GlobalParams) -> tuple[list[int], np.ndarray, int]:
    """The communities the question matches, best first, on one level: the coarsest level that has at least
    `top_communities` communities (fewer leave the map step nothing to choose from) and whose best match reaches
    `level_min_score`, else the finest (a coarse match is too weak to trust). A community matches with a score
    of at least `min_similarity` or a keyword of the question in its summary. Returns the matched indices, every
    community's score and the level used."""
    scores = community_scores(idx, q, p)
    if scores.size == 0:
        return [], scores, 0
    levels = idx.communities.levels
    level = next((lv for lv in np.unique(levels) if np.count_nonzero(levels == lv) >= p.top_communities
                  and scores[levels == lv].max() >= p.level_min_score), levels.max())
    on_level = np.where(levels == level, scores, -np.inf)
    kw = set(q.keywords)
    top = [int(ci) for ci in top_indices(on_level, p.top_communities)
           if np.isfinite(on_level[ci]) and (scores[ci] >= p.min_similarity or kw & idx.communities.tokens[ci])]
    return top, scores, int(level)


def map_communities(idx: GraphIndex, q: PreparedQuery, p: GlobalParams, broad: bool = False,
                    matched: tuple[list[int], np.ndarray, int] | None = None) -> list[CommunityEvidence]:
    """Map step over the matched communities. A specific question keeps a community only if some chunk of it
    is relevant enough; a broad one (themes, overview) keeps the top communities with their most central chunks."""
    top, scores, _ = matched or matched_communities(idx, q, p)
    if not top:
        return []
    rel = _relevance(idx, q)
    kw = set(q.keywords)
    out = []
    for ci in top:
        coverage = idx.communities.coverage  # by community, its chunks ascending
        span = slice(coverage.indptr[ci], coverage.indptr[ci + 1])
        cand, touched = coverage.indices[span].astype(np.int64), coverage.data[span]
        # a chunk speaks for the community in proportion to how much of it the chunk mentions
        cover = np.log1p(touched) / np.log1p(max(float(touched.max()) if len(cand) else 1.0, 1.0)) if len(cand) else cand
        if broad:
            local_rel = 0.5 * rel[cand] + 0.5 * cover if len(cand) else cand
        else:
            local_rel = rel[cand] * (0.5 + 0.5 * cover) if len(cand) else cand
        best = top_indices(np.asarray(local_rel, dtype=np.float64), p.chunks_per_community)
        chunks = [(int(cand[b]), float(local_rel[b])) for b in best if broad or local_rel[b] >= p.min_evidence]
        points = [s for s in sentences(idx.communities.summaries[ci]) if broad or kw & set(tokens(s))][:3]
        relevance = max([r for _, r in chunks], default=0.0)
        if not chunks and not points:
            continue  # nothing relevant: the map step drops the community
        out.append(CommunityEvidence(idx.communities.ids[ci], idx.communities.titles[ci], float(scores[ci]), relevance,
                                     list(idx.communities.hubs[ci]), chunks, points))
    return out


def retrieve_global(idx: GraphIndex, q: PreparedQuery, p: GlobalParams, top_k: int, broad: bool = False
                    ) -> tuple[list[ScoredChunk], dict, list[CommunityEvidence]]:
    """Reduce: every kept community's evidence chunks, scored community match x chunk relevance."""
    matched = matched_communities(idx, q, p)
    evidence = map_communities(idx, q, p, broad, matched)
    best: dict[int, tuple[float, str]] = {}
    for ev in evidence:
        for c, r in ev.chunks:
            s = max(ev.score, 0.0) * r
            if s > best.get(c, (-1.0, ""))[0]:
                best[c] = (s, ev.community_id)
    ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top_k]
    chunks = [ScoredChunk.from_index(idx, c, s, "global", community=float(ci[2:]) if ci[2:].isdigit() else -1.0,
                                     dense=float(q.dense[c])) for c, (s, ci) in ranked]
    diag = {"communities": [e.to_dict() for e in evidence], "kept": len(evidence), "level": matched[2],
            "matched": [idx.communities.ids[ci] for ci in matched[0]]}
    return chunks, diag, evidence


def matched_evidence(idx: GraphIndex, matched: tuple[list[int], np.ndarray, int]) -> list[CommunityEvidence]:
    """The matched communities without evidence of their own: what `hub_seeds` needs when the map step kept none."""
    top, scores, _ = matched
    c = idx.communities
    return [CommunityEvidence(c.ids[ci], c.titles[ci], float(scores[ci]), 0.0, list(c.hubs[ci])) for ci in top]


def hub_seeds(idx: GraphIndex, evidence: list[CommunityEvidence], p: GlobalParams) -> dict[int, float]:
    """Hub entities of the matched communities, to seed the local route's PPR (community-aware seeding)."""
    seeds: dict[int, float] = {}
    for ev in evidence:
        for rank, name in enumerate(ev.hubs):
            for e in idx.entities.name_index.get(norm_key(name), ()):
                w = p.hub_seed_weight * max(ev.score, 0.0) / (1.0 + rank)
                seeds[int(e)] = max(seeds.get(int(e), 0.0), w)
    return seeds


def community_seeds(idx: GraphIndex, q: PreparedQuery, p: GlobalParams, evidence: list[CommunityEvidence]
                    ) -> dict[int, float]:
    """Hub seeds of the communities behind `evidence`, else of the best matched communities (none: {})."""
    return hub_seeds(idx, evidence or matched_evidence(idx, matched_communities(idx, q, p)), p)
