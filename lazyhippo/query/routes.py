"""The route registry (one signature: `RouteRequest -> RouteResult`), query typing, the auto route,
DRIFT-style decomposition and the hybrid RRF route."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from lazyhippo.query.assist import assisted_local
from lazyhippo.query.communities import (CommunityEvidence, community_seeds, hub_seeds, matched_communities,
                                         matched_evidence, retrieve_global)
from lazyhippo.query.config import QueryConfig
from lazyhippo.query.loader import GraphIndex
from lazyhippo.query.local import local_scores, retrieve_local
from lazyhippo.query.multihop import SubgraphPPR
from lazyhippo.query.text import QUESTION_WORDS, tokens
from lazyhippo.query.types import PreparedQuery, ScoredChunk, hub_entities, top_indices


@dataclass(frozen=True)
class RouteRequest:
    """What every route receives: the question prepared (embedded lazily, once) and classified once."""

    idx: GraphIndex
    query: PreparedQuery
    kind: str                 # classify_query(question)
    cfg: QueryConfig
    top_k: int
    ppr: object = None        # PPRBackend replacing the embedded power iteration (e.g. Neo4j GDS)
    llm: object = None        # used by drift to split the question, when configured
    assist: object = None     # RetrievalAssist: LLM steps of the local route, only when a caller opts in

    def prepare(self, text: str) -> PreparedQuery:
        """Another question (a drift sub-question) against the same index and embedder."""
        return self.query if text == self.query.text else PreparedQuery(self.idx, text, self.query.embedder)


@dataclass
class RouteResult:
    chunks: list[ScoredChunk]
    diagnostics: dict
    evidence: list[CommunityEvidence] = field(default_factory=list)  # communities behind a global answer

_CODE = re.compile(  # case-sensitive shapes of code, identifiers, versions and error codes
    r"`|\b\w+_\w+\b|\b[a-z]+[A-Z]\w*\b|\b\w+\.(py|js|ts|rs|go|java|json|yaml|yml|toml|sql|md|txt|csv)\b|"
    r"\b[A-Z]{2,}-?\d+\b|\bv?\d+\.\d+\.\d+\b|(?:^|\s)--?[a-z][\w-]*|\w\(\)|::|=>|->")
_TECH_WORDS = re.compile(
    r"\b(error|exception|traceback|stack ?trace|config(uration)?|install(ation)?|api|endpoint|function|parameter|"
    r"argument|command|cli|flag|syntax|compile|version|timeout|schema|sql|http|status code|debug|stderr)\b", re.I)
_EXPLORATORY = re.compile(  # about the collection as a whole: not a bare "topic", "broad" or "across" ("topic branch")
    r"\b(main|major|key|common|recurring|overall|general) (themes?|topics?|ideas?|trends?|points?)\b|\bthemes?\b|"
    r"\boverview\b|\bsummar(y|ise|ize)\b|"
    r"\bwhat (is|are) (this|these|the) (collection|corpus|documents?|dataset)\b|\bhow are .+ (connected|related)\b",
    re.I)
_RELATIONAL = re.compile(
    r"\b(who|whom|whose)\b|\b(father|mother|son|daughter|wife|husband|spouse|child|children|parent|sibling|brother|"
    r"sister|founder|founded|director|directed|author|wrote|composer|performer|member|owner|owned|successor|"
    r"succeeded|predecessor|teacher|taught|student|married|born|died|related|relationship|between|connected)\b",
    re.I)
_CLAUSE_SPLIT = re.compile(r"\?\s+|;\s*|\.\s+(?=[A-Z])|,?\s+(?:and|also|as well as|then)\s+(?=(?:who|whom|whose|what|when|where|which|why|how|did|does|do|is|are|was|were)\b)", re.I)
_COMPARE = re.compile(r"^(?P<stem>.+?),\s*(?P<a>[^,]+?)\s+or\s+(?P<b>[^,?]+)\??$", re.I)
_REFERENCE = re.compile(r"\b(it|its|they|them|their|this|that|these|those|he|she|him|his|her|one)\b", re.I)


_ABOUT_CORPUS = re.compile(r"\b(?:this|these|the) (?:collection|corpus|documents?|dataset|index|knowledge base)\b", re.I)


def subject_words(question: str) -> str:
    """The question without the words that ask for an overview ("the main themes of this collection"): what is
    left names its subject, empty when it asks about the collection as a whole."""
    return _ABOUT_CORPUS.sub(" ", _EXPLORATORY.sub(" ", question))


def classify_query(question: str) -> str:
    """'multi_part', 'exploratory', 'technical', 'relational' or 'general' (heuristic, no LLM)."""
    q = question.strip()
    if len(split_question(q)) > 1 and not _COMPARE.match(q):
        return "multi_part"
    if _EXPLORATORY.search(q):
        return "exploratory"
    if _CODE.search(q) or _TECH_WORDS.search(q):
        return "technical"
    if _RELATIONAL.search(q):
        return "relational"
    return "general"


def auto_route(kind: str) -> str:
    """The route for a question of type `kind` (see classify_query): `global` for a question about the collection
    as a whole (its themes), else `local`, which on the development sets scores at least as well as `drift`,
    `hybrid` and `global` on every other type (docs/query-routes.md)."""
    return "global" if kind == "exploratory" else "local"


def split_question(question: str, llm=None, max_parts: int = 4) -> list[str]:
    """Sub-questions of a multi-part question. Rule-based: question marks, semicolons, sentences and
    'and/also + question word' joints; 'X, A or B?' comparisons become one question per alternative.
    With an LLM, it is asked for a JSON list and the rules are the fallback."""
    question = question.strip()
    if llm is not None:
        try:
            comp = llm.complete("Split this question into the minimal list of self-contained sub-questions needed to "
                                "answer it (resolve pronouns). Answer as a JSON object {\"questions\": [...]}.\n"
                                f"Question: {question}", json_mode=True)
            parts = [str(p).strip() for p in json.loads(comp.text).get("questions", []) if str(p).strip()]
            if parts:
                return parts[:max_parts]
        except Exception:  # noqa: BLE001 - fall back to the rules
            pass
    m = _COMPARE.match(question)
    if m and len(m.group("a").split()) <= 12 and len(m.group("b").split()) <= 12:
        stem = m.group("stem").strip()
        return [f"{stem}: {m.group('a').strip()}?", f"{stem}: {m.group('b').strip()}?"][:max_parts]
    parts = [p.strip(" ,;.?") for p in _CLAUSE_SPLIT.split(question)]
    parts = [p for p in parts if p and len(p.split()) >= 2]
    if len(parts) <= 1:
        return [question]
    subject = question_subject(parts[0])
    return [p + "?" if i == 0 or not subject or not _REFERENCE.search(p) else f"{subject}: {p}?"
            for i, p in enumerate(parts)][:max_parts]


def question_subject(part: str) -> str:
    """What the first part of a compound question is about, for the later parts that refer to it ("..., and
    what happens if it is set to None?" loses "it" on its own): its content words, as written."""
    return " ".join(w.strip(",;:") for w in part.split() if tokens(w) and w.lower() not in QUESTION_WORDS)


def retrieve_drift(req: RouteRequest) -> RouteResult:
    """DRIFT: the whole question (the primer) and each sub-question are matched to the community summaries, and
    the hubs of the communities each matches seed its local route beside its own links; the results are merged,
    each chunk keeping its best score normalized within its sub-question, so every part is represented."""
    idx, cfg, top_k, question = req.idx, req.cfg, req.top_k, req.query.text
    subs = split_question(question, req.llm, cfg.drift_max_subquestions)
    queries = [question] + subs if len(subs) > 1 else [question]
    best: dict[int, tuple[float, str, float]] = {}
    followups = []
    for sq in queries:
        pq = req.prepare(sq)
        matched = matched_evidence(idx, matched_communities(idx, pq, cfg.global_))
        seeds = hub_seeds(idx, matched, cfg.global_)
        followups.append({"question": sq, "communities": [e.community_id for e in matched],
                          "hubs": sorted({idx.entities.names[e] for e in seeds})})
        found, _ = retrieve_local(idx, pq, cfg.local, top_k, req.ppr, seeds, route="drift")
        peak = found[0].score if found else 0.0
        if peak <= 0:
            continue
        for ch in found:
            c, s = idx.chunks.pos[ch.chunk_id], ch.score / peak
            if s > best.get(c, (-1.0, "", 0.0))[0]:
                best[c] = (s, sq, ch.score)
    ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top_k]
    chunks = [ScoredChunk.from_index(idx, c, s, "drift", local=raw) for c, (s, sq, raw) in ranked]
    for ch, (_, (_, sq, _)) in zip(chunks, ranked):
        ch.channels["subquestion"] = float(queries.index(sq))
    return RouteResult(chunks, {"subquestions": queries, "followups": followups})


def expand_scores(idx: GraphIndex, q: PreparedQuery, cfg: QueryConfig) -> np.ndarray:
    """Vector-first graph augmentation: chunks sharing (non-hub) entities with the top dense hits,
    scored by the IDF-weighted overlap."""
    hits = top_indices(q.dense, cfg.hybrid.expand_top)
    out = np.zeros(idx.n_chunks)
    if not len(hits) or not idx.n_entities:
        return out
    hub = hub_entities(idx, cfg.local.hub_df_share)
    ents = np.unique(idx.mentions.counts[hits].indices)
    ents = ents[~hub[ents]]
    if not len(ents):
        return out
    weights = np.zeros(idx.n_entities, dtype=np.float32)
    weights[ents] = idx.entities.idf[ents]
    out = np.asarray(idx.mentions.counts.sign() @ weights).ravel().astype(np.float64)
    out[hits] = 0.0  # the hits themselves come through the dense channel
    return out


def rrf(channels: dict[str, np.ndarray], weights: dict[str, float], k: int, depth: int) -> tuple[np.ndarray, dict]:
    n = len(next(iter(channels.values())))
    fused = np.zeros(n)
    ranks: dict[str, dict[int, int]] = {}
    for name, scores in channels.items():
        w = weights.get(name, 0.0)
        if w <= 0:
            continue
        top = [c for c in top_indices(scores, depth) if scores[c] > 0]
        ranks[name] = {int(c): r + 1 for r, c in enumerate(top)}
        for r, c in enumerate(top):
            fused[c] += w / (k + r + 1)
    return fused, ranks


def retrieve_hybrid(req: RouteRequest) -> RouteResult:
    """Reciprocal-rank fusion of dense, BM25, local (PPR), global and graph-expansion channels, weighted
    by the question's type; the local channel's PPR is seeded by the matched communities' hubs too."""
    idx, q, cfg, kind = req.idx, req.query, req.cfg, req.kind
    weights = cfg.hybrid.weights.get(kind if kind in cfg.hybrid.weights else "relational")
    gp = replace(cfg.global_, level_min_score=cfg.hybrid.level_min_score)
    g_chunks, g_diag, evidence = retrieve_global(idx, q, gp, cfg.hybrid.depth, broad=kind == "exploratory")
    ls = local_scores(idx, q, cfg.local, req.ppr, community_seeds(idx, q, gp, evidence))
    glob = np.zeros(idx.n_chunks)
    for ch in g_chunks:
        glob[idx.chunks.pos[ch.chunk_id]] = ch.score
    channels = {"dense": np.clip(q.dense, 0, None).astype(np.float64), "sparse": q.bm25.astype(np.float64),
                "local": ls.scores, "global": glob, "expand": expand_scores(idx, q, cfg)}
    fused, ranks = rrf(channels, weights, cfg.hybrid.rrf_k, cfg.hybrid.depth)
    top = [c for c in top_indices(fused, req.top_k) if fused[c] > 0]
    chunks = [ScoredChunk.from_index(idx, int(c), fused[c], "hybrid",
                                     **{f"rank_{name}": float(r.get(int(c), 0)) for name, r in ranks.items()})
              for c in top]
    return RouteResult(chunks, {"query_type": kind, "weights": weights, "local": ls.diagnostics, "global": g_diag})


def retrieve_local_route(req: RouteRequest) -> RouteResult:
    if req.assist is not None:
        return RouteResult(*assisted_local(req.idx, req.prepare, req.query.text, req.cfg.local, req.top_k, req.ppr,
                                           req.assist))
    return RouteResult(*retrieve_local(req.idx, req.query, req.cfg.local, req.top_k, req.ppr,
                                       selection=req.cfg.selection))


def retrieve_global_route(req: RouteRequest) -> RouteResult:
    """A cascade that answers whenever the index can: the communities' evidence; when no matched community
    holds any, PPR seeded by the hub entities of the best matched communities and the question's own seeds
    (`fallback: community_seeds`); when no community matches at all, the local route (`fallback: local`)."""
    idx, q, cfg = req.idx, req.query, req.cfg
    chunks, diag, evidence = retrieve_global(idx, q, cfg.global_, req.top_k, broad=req.kind == "exploratory")
    if chunks:
        return RouteResult(chunks, {**diag, "fallback": "none"}, evidence)
    seeds = community_seeds(idx, q, cfg.global_, evidence)
    chunks, local = retrieve_local(idx, q, cfg.local, req.top_k, req.ppr, seeds or None, route="global")
    return RouteResult(chunks, {**diag, "fallback": "community_seeds" if seeds else "local", "hub_seeds": len(seeds),
                                "local": local})


def retrieve_multi_hop(req: RouteRequest) -> RouteResult:
    """Local scoring with PPR confined to the subgraph reached from the linked entities, as deep and large as
    the question's type calls for (always in memory: a store-side PPR backend does not apply)."""
    backend = SubgraphPPR(req.cfg.multi_hop, req.cfg.local.hub_df_share, req.kind)
    chunks, diag = retrieve_local(req.idx, req.query, req.cfg.local, req.top_k, backend, route="multi_hop",
                                  selection=req.cfg.selection)
    inside = np.zeros(len(req.idx.graph.node_ids), dtype=bool)
    inside[backend.nodes] = True  # dense passage seeds sit outside the subgraph too: keep the subgraph's only
    chunks = [c for c in chunks if inside[req.idx.chunks.pos[c.chunk_id] + req.idx.n_entities]]
    return RouteResult(chunks, {**diag, "query_type": req.kind, "max_hops": backend.max_hops, "hops": backend.hops,
                                "max_nodes": backend.max_nodes, "subgraph_nodes": len(backend.nodes)})


Route = Callable[[RouteRequest], RouteResult]
ROUTES: dict[str, Route] = {"local": retrieve_local_route, "global": retrieve_global_route, "drift": retrieve_drift,
                            "hybrid": retrieve_hybrid, "multi_hop": retrieve_multi_hop}


def check_route(route: str) -> str:
    """`route` if it is "auto" or registered, else a ValueError naming the choices."""
    if route != "auto" and route not in ROUTES:
        raise ValueError(f"unknown route {route!r} (expected auto or one of {', '.join(ROUTES)})")
    return route


def run_route(route: str, req: RouteRequest) -> tuple[str, RouteResult]:
    """Run `route` ("auto" picks one from the question's type); returns the route used and its result."""
    name = auto_route(req.kind) if check_route(route) == "auto" else route
    return name, ROUTES[name](req)
