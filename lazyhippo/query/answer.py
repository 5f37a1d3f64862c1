"""Public entry points: `retrieve` (ranked chunks, no answer) and `answer_question` (route, rerank,
assemble, answer). Offline answers are extractive (best-supported sentences, cited [n]); with an
OpenAI-compatible LLM configured the same context is synthesized into a cited answer. The local route never
calls an LLM while retrieving, unless a caller passes a RetrievalAssist or its `subquestions` option splits a
question with the configured LLM."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, fields, is_dataclass
from typing import NamedTuple

import numpy as np

from lazyhippo.graph.ppr import one_blas_thread
from lazyhippo.models.embedders import get_embedder
from lazyhippo.models.llm import configured_llm
from lazyhippo.models.tokens import count_tokens
from lazyhippo.query.communities import CommunityEvidence
from lazyhippo.query.config import QueryConfig, config_for
from lazyhippo.query.context import ContextChunk, assemble_context, render_context
from lazyhippo.query.loader import GraphIndex, load_index
from lazyhippo.query.rerank import RerankStage, configured_reranker
from lazyhippo.query.routes import RouteRequest, RouteResult, check_route, classify_query, run_route, split_question, subject_words
from lazyhippo.query.text import prose_sentences, stems, tokens
from lazyhippo.query.types import PreparedQuery, ScoredChunk, chunk_entities
from lazyhippo.settings import Settings

NO_ANSWER = "No relevant information was found in the index."
ANSWER_CHARS = 400  # an offline answer, citations included
# The least support (`Extract.support`) that counts as an answer: inside the range of thresholds at which the
# tune halves of the shared question sets, each asked of its own index and of the others', meet every target
# (docs/benchmarks.md, `lazyhippo bench answerable`).
SUPPORT_THRESHOLD = 0.54


@dataclass
class QueryResult:
    question: str
    route: str
    query_type: str
    answer: str
    answerable: bool                    # some passage supports an answer (else `answer` says none does)
    citations: list[dict]
    closest: list[dict]                 # when not answerable: the passages that came nearest
    context: list[ContextChunk]
    timings: dict[str, float]           # milliseconds per stage
    context_tokens: int
    budget: int
    llm: str | None = None              # model that wrote the answer (None: extractive)
    diagnostics: dict = field(default_factory=dict)
    usage: list[dict] = field(default_factory=list)  # LLM tokens per operation for this question
    history: list[dict] = field(default_factory=list)  # the turns that were sent along (after the budget)
    tokens: dict = field(default_factory=lambda: {"input": 0, "output": 0})  # `usage` summed: LLM tokens in, out

    @property
    def context_text(self) -> str:
        return render_context(self.context)

    def to_dict(self) -> dict:
        """Plain JSON types, dataclasses as dicts of their fields (one pass: no deep copy before encoding)."""
        return json.loads(json.dumps(self, default=_jsonable))


def _jsonable(o):
    if is_dataclass(o) and not isinstance(o, type):
        return {f.name: getattr(o, f.name) for f in fields(o)}
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _embedder(settings: Settings, embedder):
    return embedder or get_embedder(settings.embedder, settings.embedding_model)


def _resolve_llm(settings: Settings, llm):
    return configured_llm(settings) if llm == "auto" else llm


def _retrieve(idx: GraphIndex, question: str, route: str, k: int, cfg: QueryConfig, emb, ppr, llm, assist=None
              ) -> tuple[str, str, RouteResult]:
    """Classify the question once, run the route (auto resolves here); (route used, query type, result)."""
    check_route(route)
    req = RouteRequest(idx, PreparedQuery(idx, question, emb), classify_query(question), cfg, k, ppr, llm, assist)
    used, out = run_route(route, req)
    return used, req.kind, out


def _reranker(settings: Settings, reranker) -> RerankStage | None:
    return configured_reranker(settings) if reranker == "auto" else reranker


def _rerank(stage: RerankStage | None, question: str, chunks: list[ScoredChunk], diag: dict) -> list[ScoredChunk]:
    """The chunks reordered by `stage`; `diag["rerank"]` says whether it ran, was skipped by its breaker,
    timed out or failed (the retrieval order is kept), or is off."""
    if stage is None:
        diag["rerank"] = {"status": "off"}
        return chunks
    chunks, diag["rerank"] = stage.apply(question, chunks)
    return chunks


@dataclass
class Retrieval:
    route: str               # the route used (auto resolved)
    query_type: str
    chunks: list[ScoredChunk]
    diagnostics: dict
    entities: list[list[str]] = field(default_factory=list)  # per chunk, the entities it mentions (when asked)
    answerable: bool | None = None  # whether the chunks support an answer (when asked)


@one_blas_thread
def search(settings: Settings, question: str, route: str = "local", top_k: int = 8, *,
           config: QueryConfig | None = None, ppr=None, embedder=None, llm=None, index: GraphIndex | None = None,
           reranker="auto", with_entities: bool = False, with_support: bool = False, assist=None) -> Retrieval:
    """Ranked chunks (with document title, scores and citation metadata) without answer synthesis, and how they
    were found. `index` is an already loaded index to use (a server's warm one); by default the cached one is
    loaded. `reranker="auto"` uses the one the settings name (none by default), None turns it off.
    `with_entities`: also the names of the entities each chunk mentions; `with_support`: also whether the chunks
    support an answer (as `answer_question` decides it)."""
    cfg = config_for(settings, config)
    idx = index or load_index(settings, cfg.graph)
    stage = _reranker(settings, reranker)
    k = max(top_k, stage.top_n) if stage is not None else top_k  # the reranker sees its top_n candidates
    emb = _embedder(settings, embedder)
    used, kind, out = _retrieve(idx, question, route, k, cfg, emb, ppr, llm, assist)
    chunks = _rerank(stage, question, out.chunks, out.diagnostics)
    chunks = chunks[:top_k]
    entities = [chunk_entities(idx, c.chunk_id) for c in chunks] if with_entities else []
    answerable = None
    if with_support:
        passages = [Passage(i + 1, c.title, c.section, c.text) for i, c in enumerate(chunks)]
        found = extract(question, passages, emb, idx.lexical.idf, cfg.answer_sentences, kind=kind)
        out.diagnostics["support"] = {"score": found.support, "threshold": SUPPORT_THRESHOLD}
        answerable = found.answerable
    return Retrieval(used, kind, chunks, out.diagnostics, entities, answerable)


def retrieve(settings: Settings, question: str, route: str = "local", top_k: int = 8, *,
             config: QueryConfig | None = None, ppr=None, embedder=None, llm=None,
             index: GraphIndex | None = None, reranker="auto", assist=None,
             diagnostics: dict | None = None) -> list[ScoredChunk]:
    """The chunks of `search`. `assist` (a RetrievalAssist) opts the local route into its LLM steps;
    `diagnostics`, when given, is filled with the route's."""
    found = search(settings, question, route, top_k, config=config, ppr=ppr, embedder=embedder, llm=llm, index=index,
                   reranker=reranker, assist=assist)
    if diagnostics is not None:
        diagnostics.update(found.diagnostics)
    return found.chunks


@one_blas_thread
def answer_question(settings: Settings, question: str, route: str = "auto", top_k: int = 8, budget: int = 32000,
                    *, config: QueryConfig | None = None, reranker="auto", llm="auto", ppr=None,
                    embedder=None, index: GraphIndex | None = None, history: list[dict] | None = None,
                    history_budget: int = 2000) -> QueryResult:
    """Answer `question` from the index of `settings`: route -> (rerank) -> context assembly -> answer.

    `llm="auto"` uses the configured OpenAI-compatible endpoint if any (else extractive); pass None to
    force the offline answer or an LLM object to use it. `reranker` is a RerankStage (breaker included); "auto"
    uses the one the settings name (none by default).
    `ppr` is a PPRBackend (or function) replacing the embedded power iteration, e.g. Neo4j GDS. `index` is
    an already loaded index (a server's warm one, kept for the whole call even if a newer one is swapped in).
    `history`: earlier turns ({"role": "user"|"assistant", "content"}), newest last; the newest that fit
    `history_budget` tokens are sent to the LLM and make a follow-up question standalone for retrieval.
    """
    cfg = config_for(settings, config)
    t = {}
    t0 = time.perf_counter()
    idx = index or load_index(settings, cfg.graph)
    t["load_ms"] = (time.perf_counter() - t0) * 1000
    emb = _embedder(settings, embedder)
    model = _resolve_llm(settings, llm)
    before = model.meter.snapshot() if hasattr(model, "meter") else {}
    turns = bound_history(history or [], history_budget)
    standalone = standalone_question(question, turns, model)
    t1 = time.perf_counter()
    candidates = max(top_k * 3, cfg.candidates)
    used_route, kind, out = _retrieve(idx, standalone, route, candidates, cfg, emb, ppr, model)
    chunks, diag, evidence = out.chunks, out.diagnostics, out.evidence
    if standalone != question:
        diag["search_question"] = standalone
    t["retrieve_ms"] = (time.perf_counter() - t1) * 1000
    for c in chunks:
        c.channels.setdefault("retrieval", c.score)
    stage = _reranker(settings, reranker)
    t2 = time.perf_counter()
    chunks = _rerank(stage, standalone, chunks, diag)
    if stage is not None:
        t["rerank_ms"] = (time.perf_counter() - t2) * 1000
    t3 = time.perf_counter()
    neighbours = _neighbour_fn(idx) if cfg.context.group_neighbours else None
    context, stats = assemble_context(chunks, budget, cfg.context, neighbours, max_chunks=top_k)
    diag["assembly"] = stats
    t["assemble_ms"] = (time.perf_counter() - t3) * 1000
    t4 = time.perf_counter()
    llm_name = None
    found = extract(standalone, context, emb, idx.lexical.idf, cfg.answer_sentences, kind=kind)
    answerable = found.answerable
    diag["support"] = {"score": found.support, "threshold": SUPPORT_THRESHOLD, "parts": found.parts}
    if model is not None and context:  # the LLM judges (it reads any language); answerable when it cites
        answer, cited, llm_diag = llm_answer(model, question, context, evidence if used_route == "global" else [],
                                             idx, turns)
        diag.update(llm_diag)
        llm_name = model.model
        answerable = bool(cited)
    elif not answerable:
        answer, cited = NO_ANSWER, []
    elif used_route == "global" and evidence:
        answer, cited = community_answer(standalone, context, evidence, emb, idx, kind)
    else:
        answer, cited = found.text, found.cited
    t["answer_ms"] = (time.perf_counter() - t4) * 1000
    t["total_ms"] = (time.perf_counter() - t0) * 1000
    usage = model.meter.since(before) if hasattr(model, "meter") else []
    by_n = {c.n: c for c in context}
    citations = [by_n[n].citation for n in cited if n in by_n]
    passage_model = getattr(getattr(emb, "passages", emb), "name", None)
    if idx.embedding_model and passage_model and idx.embedding_model != passage_model:
        diag["warning"] = f"index embedded with {idx.embedding_model}, queries with {passage_model}"
    return QueryResult(question=question, route=used_route, query_type=kind, answer=answer, answerable=answerable,
                       citations=citations, closest=[] if answerable else [c.citation for c in context[:3]],
                       context=context, timings={k: round(v, 3) for k, v in t.items()},
                       context_tokens=stats["tokens"], budget=budget, llm=llm_name, diagnostics=diag,
                       usage=usage, history=turns, tokens={"input": sum(u["prompt_tokens"] for u in usage),
                                                           "output": sum(u["completion_tokens"] for u in usage)})


def warm(settings: Settings, config: QueryConfig | None = None) -> None:
    """Load what `answer_question` reads before it retrieves (the embedder, the tokenizer, the index) into this
    process's caches. A caller whose other work waits on the disk (a CLI query starting its Dagster run) runs it
    in a thread beside that work; the embedder goes first, so a question that arrives meanwhile waits for the
    index alone (`load_index` builds it once under its lock)."""
    _embedder(settings, None)
    count_tokens("")
    load_index(settings, config_for(settings, config).graph)


def _neighbour_fn(idx: GraphIndex):
    pos = idx.chunks.doc_pos

    def neighbours(c: ScoredChunk) -> list[ScoredChunk]:
        out = []
        for d in (-1, 1):
            j = pos.get((c.doc_id, c.position + d))
            if j is not None and idx.chunks.sections[j] == c.section:
                out.append(ScoredChunk.from_index(idx, j, 0.0, c.route, neighbour=1.0))
        return out

    return neighbours


def community_answer(question: str, context: list[ContextChunk], evidence: list[CommunityEvidence], embedder,
                     idx: GraphIndex, kind: str | None = None, max_chars: int = ANSWER_CHARS) -> tuple[str, list[int]]:
    """Offline reduce of the global route: one line per kept community (its title, then its best cited
    evidence sentence), strongest community first, within `max_chars`."""
    by_id = {c.chunk_id: c for c in context}
    lines, cited, used = [], [], set()
    for ev in evidence:
        ctx = [by_id[cid] for cid in ev.chunk_ids(idx) if cid in by_id]
        if not ctx:
            continue
        found = extract(question, ctx, embedder, idx.lexical.idf, kind=kind)
        picked = next(((t, n) for t, n in found.sentences if t not in used), None)  # one no other community used
        if picked is None:
            continue
        line = f"- {ev.title}: {picked[0]} [{picked[1]}]"
        if sum(len(x) + 1 for x in lines) + len(line) > max_chars:
            break
        used.add(picked[0])
        lines.append(line)
        if picked[1] not in cited:
            cited.append(picked[1])
    if not lines:
        found = extract(question, context, embedder, idx.lexical.idf, kind=kind)
        return found.text, found.cited
    return "\n".join(lines), cited


@dataclass(frozen=True)
class Extract:
    """The sentences an offline answer is made of, each with its citation number, and how well the passages
    they come from support the question: the rarity-weighted share of its content words those passages (and
    their titles) hold, the words of a name the question writes capitalized counting only where one passage
    holds the whole name. The passages rather than the chosen sentences: an answer of 400 characters cannot
    hold every word of a long question that the passages do answer (benchmarks.md, answerable or not)."""

    sentences: list[tuple[str, int]]
    support: float
    parts: int = 1

    @property
    def text(self) -> str:
        return " ".join(f"{s} [{n}]" for s, n in self.sentences) or NO_ANSWER

    @property
    def cited(self) -> list[int]:
        return list(dict.fromkeys(n for _, n in self.sentences))

    @property
    def answerable(self) -> bool:
        return self.support >= SUPPORT_THRESHOLD


class Passage(NamedTuple):
    """What an extractive answer reads of a passage (a ContextChunk has these fields too)."""

    n: int                  # its citation number
    title: str
    section: str | None
    text: str
    noise: str | None = None


@dataclass(frozen=True)
class _Candidate:
    text: str
    n: int                  # citation number of its passage
    rank: int               # its passage's place among the context's passages
    words: frozenset[str]   # stems of its words
    title: frozenset[str]   # stems of its passage's title


def _stems(words) -> frozenset[str]:
    """The stems of a sentence's or a title's words (`stems`), what question words are matched against."""
    return frozenset(stems(words))


# A command synopsis ("git add [--verbose | -v] [--dry-run | -n] ...", "git replace [-f] <object> <replacement>"):
# three option or placeholder groups in a row make a usage line, not a sentence to read.
_SYNOPSIS = re.compile(r"(?:[\[<][^\]>]*[\]>][\s.…]*){3,}")


def _candidates(context: list[ContextChunk | Passage], max_chunks: int) -> list[_Candidate]:
    """The readable sentences of the top passages: markup removed, wrapped lines joined, at least 3 words, no
    command synopsis."""
    pool, seen = [], set()
    for rank, c in enumerate([c for c in context if not c.noise][:max_chunks]):
        title = _stems(tokens(c.title))
        for s in prose_sentences(c.text):
            s = _without_heading(s, c.section)
            words = tokens(s)
            if len(words) >= 3 and s not in seen and not _SYNOPSIS.search(s):
                seen.add(s)
                anchored = _anchored(s, c.title)
                pool.append(_Candidate(anchored, c.n, rank, _stems(tokens(anchored)), title))
    return pool


_NUMBERED = re.compile(r"^\d+(?:\.\d+)+\.?\s+|^\d+\.\s+")  # a manual's section number: "3. ", "4.6. ", "5.0 "


def _without_heading(sentence: str, section: str | None) -> str:
    """A sentence without the heading that the chunker ran into it: the section, or its heading path as the
    text reads it ("OPTIONS > --onto <newbase>" as "OPTIONS --onto <newbase> Starting point ..."), or its last
    heading without the number the sentence split off ("3. The AUTOINCREMENT Keyword" as "The AUTOINCREMENT
    Keyword If a column ...")."""
    if not section:
        return sentence
    last = section.rsplit(" > ", 1)[-1]
    for head in dict.fromkeys((section, section.replace(" > ", " "), _NUMBERED.sub("", last))):
        if head and sentence.startswith(head + " "):
            return sentence[len(head) + 1:]
    return sentence


def _weights(keywords: list[str], idf) -> np.ndarray:
    """How much each question word counts: its idf in the index, so the rare words that name what the question
    is about (and that an index which cannot answer it lacks) outweigh the common ones."""
    return np.asarray(idf(keywords), dtype=np.float64) if idf is not None else np.ones(len(keywords))


def _clip(text: str, limit: int) -> str:
    """`text` cut at a word boundary to at most `limit` characters (an ellipsis marks the cut)."""
    if len(text) <= limit:
        return text
    cut = text[:max(limit - 1, 1)].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


def extract(question: str, context: list[ContextChunk | Passage], embedder, idf=None, per_part: int = 3,
            max_chars: int = ANSWER_CHARS, max_chunks: int = 8, kind: str | None = None) -> Extract:
    """The best one to `per_part` sentences for each part of the question ("..., and ...?" has two), within
    `max_chars` with their citations. A sentence is considered only when it shares a content word with its
    part; the best is taken first, then others only while they hold a word of the part the taken ones lack.
    Scores: similarity to the part, the rarity-weighted share of its words held (`idf`: keywords -> idf,
    uniform when None), the passage's rank, and a bridge: a sentence of a passage whose title a taken sentence
    names ("B Boy is a song by Meek Mill" -> Meek Mill's passage) goes before others, as a multi-hop answer reads.
    `kind`: the question's type when already classified."""
    pool = _candidates(context, max_chunks)
    if not pool:
        return Extract([], 0.0)
    keywords = list(dict.fromkeys(tokens(subject_words(question))))
    parts = split_question(question) if (kind or classify_query(question)) == "multi_part" else [question]
    vecs = embedder.embed([*parts, *(c.text for c in pool)])
    sims = vecs[len(parts):] @ vecs[:len(parts)].T  # sentence x part
    budget = max_chars // len(parts)
    chosen: dict[int, str] = {}  # candidate -> its text in the answer (clipped to the room left)
    total = 0
    for p, part in enumerate(parts):
        kw = list(dict.fromkeys(tokens(subject_words(part)))) or keywords
        w = _weights(kw, idf)
        w = w / max(w.sum(), 1e-9)
        kw_stems = stems(kw)
        kw_forms = [_forms(t) for t in kw_stems]
        held = np.array([[not f.isdisjoint(c.words) for f in kw_forms] for c in pool],
                        dtype=bool).reshape(len(pool), len(kw))
        score = sims[:, p] + held @ w + 0.2 / (1 + np.array([c.rank for c in pool]))
        have = np.zeros(len(kw), dtype=bool)
        used = 0
        for _ in range(per_part if kw else 1):  # no subject words: the one sentence nearest the question
            gain = (held & ~have) @ w if kw else np.ones(len(pool))  # words of the part the taken ones lack
            named = frozenset().union(*(pool[i].words for i in chosen))  # a passage a taken sentence names
            bridge = np.array([0.5 if c.title and c.title <= named and all(pool[i].n != c.n for i in chosen) else 0.0
                               for c in pool])
            best = next((int(i) for i in np.argsort(-(score + gain + bridge), kind="stable")
                         if gain[i] > 0 and int(i) not in chosen), None)
            if best is None:
                break
            mark = len(f" [{pool[best].n}]") + (1 if chosen else 0)  # its citation, the space before it
            room = min(budget - used, max_chars - total) - mark
            if used and room < 40:
                break
            chosen[best] = _clip(pool[best].text, room)
            used += len(chosen[best]) + mark
            total += len(chosen[best]) + mark
            have |= held[best]
    # no sentence bears on the question: no support; no keywords: it asks about the whole collection
    support = 0.0 if not chosen else _support(keywords, idf, pool, names(question)) if keywords else 1.0
    return Extract([(t, pool[i].n) for i, t in chosen.items()], support, len(parts))


def _forms(stem: str) -> frozenset[str]:
    """A question word's stem and, for an agent noun, its verb's ("founder" -> "found", "director" -> "direct",
    "producer" -> "produc"): a passage answers "the founder of X" with "founded X", which stemming alone misses."""
    return frozenset((stem, stem[:-2])) if len(stem) >= 6 and stem.endswith(("er", "or")) else frozenset((stem,))


_CODE_SPAN = re.compile(r"`[^`]*`")
_NAME = re.compile(r"[A-Z0-9][^\s,;:?!()\"]*(?:\s+[A-Z0-9][^\s,;:?!()\"]*)*")


def names(question: str) -> list[frozenset[str]]:
    """The stems of each name of two or more content words that the question writes as a run of capitalized
    words or numbers ("Billy Elliot", "Tottenham Hotspur"); code spans are the asker's own text, not names."""
    found = (_stems(tokens(m.group())) for m in _NAME.finditer(_CODE_SPAN.sub(" ", question)))
    return [n for n in found if len(n) > 1]


def _support(keywords: list[str], idf, sentences: list[_Candidate], whole: list[frozenset[str]] = ()) -> float:
    """The weighted share (`_weights`) of the question's content words that the sentences or their passages'
    titles hold. The words of a name in `whole` count only when one passage holds all of them: an index that
    knows "Billy" and "Elliot" from two unrelated passages does not know Billy Elliot, and out-of-corpus
    questions are mostly about names the index lacks."""
    if not sentences:
        return 0.0
    w = _weights(keywords, idf)
    passages: dict[int, frozenset[str]] = {}
    for c in sentences:
        passages[c.n] = passages.get(c.n, frozenset()) | c.words | c.title
    words = frozenset().union(*passages.values())
    broken = frozenset().union(*(n for n in whole if not any(n <= p for p in passages.values())))
    return round(float(sum(wt for t, wt in zip(stems(keywords), w) if t in words and t not in broken)
                       / max(w.sum(), 1e-9)), 4)


def extractive_answer(question: str, context: list[ContextChunk], embedder, n_sentences: int = 3,
                      max_chunks: int = 8, idf=None) -> tuple[str, list[int]]:
    """The text and citation numbers of `extract`."""
    found = extract(question, context, embedder, idf, n_sentences, max_chunks=max_chunks)
    return found.text, found.cited


_PRONOUN_START = re.compile(r"^(?:He|She|It|They|His|Her|Its|Their|This|These)\b")


def _anchored(sentence: str, title: str) -> str:
    """A sentence lifted out of its passage loses its subject: name the passage when it opens with a pronoun."""
    return f"{title}: {sentence}" if _PRONOUN_START.match(sentence) and title else sentence


_CITE_RUN = re.compile(r"( ?)((?:\[\d+(?:\s*,\s*\d+)*\])+)")
ANSWER_SYSTEM = ("You answer questions from a numbered context. Cite every claim with its source number in brackets, "
                 "like [1] or [2][3], and only numbers that appear in the context. If the context does not "
                 "contain the answer, say so. Answer in the language of the question, whatever the language of "
                 "the context.")
MAP_SCHEMA = {"type": "object", "required": ["answer", "score"],
              "properties": {"answer": {"type": "string", "maxLength": 600}, "score": {"type": "integer"}}}


def bound_history(history: list[dict], budget: int) -> list[dict]:
    """The newest turns whose tokens fit the budget, oldest first; malformed turns are an error."""
    kept, used = [], 0
    for turn in reversed(history):
        if turn.get("role") not in ("user", "assistant") or not isinstance(turn.get("content"), str):
            raise ValueError(f"history turns need role 'user' or 'assistant' and string content, got {turn!r}")
        used += count_tokens(turn["content"])
        if used > budget:
            break
        kept.append({"role": turn["role"], "content": turn["content"]})
    return kept[::-1]


def standalone_question(question: str, turns: list[dict], llm) -> str:
    """A follow-up ("and where was she born?") made self-contained for retrieval: rewritten by the LLM,
    offline the previous user question is prepended."""
    previous = [t["content"] for t in turns if t["role"] == "user"]
    if not previous:
        return question
    if llm is None:
        return f"{previous[-1]} {question}"
    convo = "\n".join(f"{t['role']}: {t['content'][:500]}" for t in turns[-6:])
    comp = llm.complete("Rewrite the last question so it can be understood without the conversation (resolve "
                        "pronouns and references). Reply with the question only.\n\n"
                        f"Conversation:\n{convo}\n\nLast question: {question}", max_tokens=80, operation="chat")
    line = comp.text.strip().splitlines()[0].strip() if comp.text.strip() else ""
    return line if 3 <= len(line) <= 400 else f"{previous[-1]} {question}"


def check_citations(text: str, valid: set[int]) -> tuple[str, list[int], int]:
    """Keep citations of context chunks, remove every other [n] (counted): an answer never points at
    something the reader cannot see. A run like " [7][2]" or " [3, 9]" is rewritten as a whole."""
    cited: list[int] = []
    removed = 0

    def repl(m: re.Match) -> str:
        nonlocal removed
        good = []
        for n in map(int, re.findall(r"\d+", m.group(2))):
            if n in valid:
                if n not in good:
                    good.append(n)
                if n not in cited:
                    cited.append(n)
            else:
                removed += 1
        return (m.group(1) + "".join(f"[{n}]" for n in good)) if good else ""

    return _CITE_RUN.sub(repl, text).strip(), cited, removed


def global_map(llm, question: str, context: list[ContextChunk], evidence: list[CommunityEvidence], idx: GraphIndex,
               min_score: int = 20) -> list[tuple[int, str]]:
    """Map: one partial answer per community with a 0-100 helpfulness score, from its report points and
    its chunks in the context (cited by their numbers); irrelevant ones (score < min_score) are dropped."""
    by_id = {c.chunk_id: c for c in context}

    def one(ev: CommunityEvidence) -> tuple[int, str]:
        ctx = [by_id[cid] for cid in ev.chunk_ids(idx) if cid in by_id]
        prompt = ("Using only this community's material, answer the question in at most 3 sentences, citing "
                  "passage numbers like [1]. Then score from 0 to 100 how helpful your answer is (0 if the "
                  "material holds nothing relevant).\n"
                  f"Question: {question}\nCommunity: {ev.title}\nSummary: {' '.join(ev.summary_points)}\n"
                  f"Passages:\n{render_context(ctx) if ctx else '-'}")
        data, _ = llm.complete_json(prompt, MAP_SCHEMA, operation="answer", max_tokens=300,
                                    validate=lambda d: (int(d["score"]), str(d["answer"]).strip()))
        return data

    results = llm.map(one, evidence[:5])
    fatal = next((r for r in results if isinstance(r, Exception) and not isinstance(r, ValueError)), None)
    if fatal is not None:
        raise fatal
    kept = [r for r in results if not isinstance(r, Exception) and r[0] >= min_score and r[1]]
    return sorted(kept, key=lambda r: -r[0])


def llm_answer(llm, question: str, context: list[ContextChunk], evidence: list[CommunityEvidence], idx: GraphIndex,
               history: list[dict]) -> tuple[str, list[int], dict]:
    """The cited answer: the context (and, on the global route, the mapped partial answers) as the last
    user turn after the conversation so far; citations outside the context are removed and counted."""
    diag: dict = {}
    partial = ""
    if evidence:
        notes = global_map(llm, question, context, evidence, idx)
        diag["global_map"] = {"communities": len(evidence[:5]), "kept": len(notes)}
        if notes:
            partial = "Partial answers from related communities (best first):\n" + "\n".join(
                f"- ({score}) {text}" for score, text in notes) + "\n\n"
    prompt = f"{partial}Context:\n{render_context(context)}\n\nQuestion: {question}\nAnswer:"
    messages = [{"role": "system", "content": ANSWER_SYSTEM}, *history, {"role": "user", "content": prompt}]
    comp = llm.complete(messages, max_tokens=300, operation="answer")
    text, cited, removed = check_citations(comp.text.strip(), {c.n for c in context})
    diag["citations_removed"] = removed
    return text or NO_ANSWER, cited, diag
