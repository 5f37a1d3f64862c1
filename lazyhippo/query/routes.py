"""The route registry (one signature: `RouteRequest -> RouteResult`), query typing, the auto route and the local
route's options that take steps of their own: `multi_hop` (a walk confined to the question's neighbourhood) and
`subquestions` (DRIFT-style decomposition)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from lazyhippo.query.assist import assisted_local
from lazyhippo.query.communities import (CommunityEvidence, community_seeds, hub_seeds, matched_communities,
                                         matched_evidence, retrieve_global)
from lazyhippo.query.config import QueryConfig
from lazyhippo.query.loader import GraphIndex
from lazyhippo.query.local import (LocalScores, documents_first, fuse_ranks, local_ranking, ranked_chunks,
                                   retrieve_local)
from lazyhippo.query.multihop import SubgraphPPR
from lazyhippo.query.text import QUESTION_WORDS, tokens
from lazyhippo.query.types import PreparedQuery


@dataclass(frozen=True)
class RouteRequest:
    """What every route receives: the question prepared (embedded lazily, once) and classified once."""

    idx: GraphIndex
    query: PreparedQuery
    kind: str                 # classify_query(question)
    cfg: QueryConfig
    top_k: int
    ppr: object = None        # PPRBackend replacing the embedded power iteration (e.g. Neo4j GDS)
    llm: object = None        # splits a question for the subquestions option, when configured
    assist: object = None     # RetrievalAssist: LLM steps of the local route, only when a caller opts in

    def prepare(self, text: str) -> PreparedQuery:
        """Another question (a sub-question) against the same index and embedder."""
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
    as a whole (its themes), else `local`, which on the development sets scores at least as well as `global` on
    every other type (docs/query-routes.md)."""
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


def walk_backend(req: RouteRequest):
    """The PPR backend of one walk: confined to the `multi_hop` subgraph when that option is on (always in memory:
    a store-side backend does not apply), else the request's."""
    params = req.cfg.multi_hop
    return SubgraphPPR(params, req.cfg.local.hub_df_share) if params.levels else req.ppr


def local_order(req: RouteRequest, q: PreparedQuery, seeds: dict[int, float] | None = None
                ) -> tuple[np.ndarray, np.ndarray, LocalScores, dict]:
    """The local ranking of `q` (`local_ranking`), kept inside the walk's subgraph under `multi_hop`; with the
    walk's diagnostics."""
    backend = walk_backend(req)
    order, values, ls = local_ranking(req.idx, q, req.cfg.local, req.top_k, backend, seeds)
    if not isinstance(backend, SubgraphPPR):
        return order, values, ls, {}
    keep = backend.holds(req.idx, order)
    return order[keep], values[keep], ls, backend.diagnostics()


def with_subquestions(req: RouteRequest, order: np.ndarray, values: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """The `subquestions` option (DRIFT's follow-ups): a compound question is split into parts (`split_question`);
    each part is matched to the community summaries as `global` matches them, the hubs of the communities it
    matches seed its walk beside its own links, and the parts' rankings join the whole question's: its best
    passage stays first, the rest of its ranking and the parts' are fused by rank, each chunk scoring 1 / the place
    it lands on. A question of one part keeps its ranking and values."""
    idx, cfg = req.idx, req.cfg
    parts = split_question(req.query.text, req.llm, cfg.max_subquestions)
    if len(parts) <= 1 or not len(order):
        return order, values, []
    per_doc = cfg.local.chunks_per_document
    whole = documents_first(idx, order, per_doc, len(order))
    rankings, followups = [whole[1:]], []
    for text in parts:
        pq = req.prepare(text)
        matched = matched_evidence(idx, matched_communities(idx, pq, cfg.global_))
        seeds = hub_seeds(idx, matched, cfg.global_)
        part = local_order(req, pq, seeds or None)[0]
        part = documents_first(idx, part, per_doc, len(part))
        rankings.append(part[part != whole[0]])
        followups.append({"question": text, "communities": [e.community_id for e in matched],
                          "hubs": sorted({idx.entities.names[e] for e in seeds})})
    fused, _ = fuse_ranks(rankings, [1.0] * len(rankings))
    order = np.concatenate([whole[:1], fused])
    return order, 1.0 / np.arange(1.0, len(order) + 1.0), followups


def retrieve_local_route(req: RouteRequest) -> RouteResult:
    """The local route, with the `multi_hop` and `subquestions` options when they are on (the second with the
    `graph` chunk selection only: the LightRAG picks skip every reorder)."""
    idx, q, cfg = req.idx, req.query, req.cfg
    if req.assist is not None:
        if cfg.multi_hop.levels or cfg.subquestions:
            raise ValueError("the LLM-assisted local route takes neither multi_hop nor subquestions: its own rounds "
                             "stand in for them")
        return RouteResult(*assisted_local(idx, req.prepare, q.text, cfg.local, req.top_k, req.ppr, req.assist))
    if cfg.selection.mode != "graph":
        backend = walk_backend(req)
        chunks, diag = retrieve_local(idx, q, cfg.local, req.top_k, backend, selection=cfg.selection)
        walk = backend.diagnostics() if isinstance(backend, SubgraphPPR) else {}
        return RouteResult(chunks, {**diag, **({"multi_hop": walk} if walk else {})})
    order, values, ls, walk = local_order(req, q)
    diag = {**ls.diagnostics, **({"multi_hop": walk} if walk else {})}
    if cfg.subquestions:
        order, values, diag["subquestions"] = with_subquestions(req, order, values)
    return RouteResult(ranked_chunks(idx, q, cfg.local, order, values, ls, req.top_k, "local"), diag)


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


Route = Callable[[RouteRequest], RouteResult]
ROUTES: dict[str, Route] = {"local": retrieve_local_route, "global": retrieve_global_route}


def check_route(route: str) -> str:
    """`route` if it is "auto" or registered, else a ValueError naming the choices."""
    if route != "auto" and route not in ROUTES:
        raise ValueError(f"unknown route {route!r} (expected auto or one of {', '.join(ROUTES)})")
    return route


def run_route(route: str, req: RouteRequest) -> tuple[str, RouteResult]:
    """Run `route` ("auto" picks one from the question's type); returns the route used and its result."""
    name = auto_route(req.kind) if check_route(route) == "auto" else route
    return name, ROUTES[name](req)
