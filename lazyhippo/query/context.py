"""Context assembly shared by every route: merge, noise demotion, score order, sentence-level dedup,
optional neighbour grouping, a hard token budget and citation metadata on every chunk.

Scores travel from retrieval to here unchanged (`retrieval_score`, per-channel `channels`), the order is
strictly by the final score, and the rendered context never exceeds the budget (counted with tiktoken).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from lazyhippo.models.tokens import count_tokens
from lazyhippo.query.config import ContextParams
from lazyhippo.query.text import norm_key, sentences, strip_heading, tokens
from lazyhippo.query.types import ScoredChunk

SEPARATOR = "\n\n"
_BLANK = re.compile(r"_{2,}|\.{4,}|\[\s*\]")
_LABEL = re.compile(r"(?:^|\s)[A-Za-z][\w ]{0,40}:\s*(?:_{2,}|\.{4,}|\[\s*\]|$)")
_HEADING_ONLY = re.compile(r"^\s*#{1,6}\s+[^\n]{0,120}$")


@dataclass
class ContextChunk:
    n: int                      # citation number [n], 1-based, in context order
    chunk_id: str
    title: str
    doc_id: str
    source: str
    section: str | None
    page: int | None
    position: int
    text: str                   # the text placed in the context (duplicate sentences removed)
    score: float                # the score that ordered the context (after noise demotion / rerank)
    retrieval_score: float      # the score retrieval gave
    tokens: int                 # tokens of the rendered block
    route: str
    channels: dict = field(default_factory=dict)
    noise: str | None = None            # why the chunk was demoted
    removed_sentences: int = 0          # sentences dropped as duplicates of higher-ranked chunks
    merged: list[str] = field(default_factory=list)  # ids of duplicate chunks folded into this one
    neighbour_of: str | None = None     # anchor chunk id when pulled in as a same-section neighbour

    @property
    def citation(self) -> dict:
        return {"n": self.n, "chunk_id": self.chunk_id, "title": self.title, "doc_id": self.doc_id,
                "source": self.source, "section": self.section, "page": self.page, "score": self.score}

    def header(self) -> str:
        head = f"[{self.n}] {self.title}"
        if self.section and self.section != self.title:
            head += f" — {self.section}"
        if self.page is not None:
            head += f" (p. {self.page})"
        return head

    def render(self) -> str:
        return f"{self.header()}\n{self.text}"

    def to_dict(self) -> dict:
        return asdict(self)


@lru_cache(maxsize=65536)
def noise_reason(text: str, min_content_words: int) -> str | None:
    """'form' (label: ____ fields), 'heading' (a bare heading), 'empty' (almost no content words) or None.

    Cached: it depends on the chunk text only, and the same chunks come back query after query."""
    blanks = len(_BLANK.findall(text)) if ("__" in text or "...." in text or "[" in text) else 0
    words = tokens(_BLANK.sub(" ", text)) if blanks else tokens(text)
    if blanks >= 2 and (len(words) <= 4 * blanks or len(_LABEL.findall(text)) >= 2):
        return "form"
    if text.lstrip().startswith("#") and _HEADING_ONLY.match(text.strip()) and len(words) < 12:
        return "heading"
    if len(words) < min_content_words:
        return "empty"
    return None


def _shingles(words: list[str], n: int = 4) -> set[str]:
    if len(words) <= n:
        return {" ".join(words)}
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


class _SeenText:
    """Sentences already in the context, as word 4-gram shingles: a new sentence is a duplicate when
    `cover` of its shingles were seen (it repeats a seen sentence, or a seen one makes up most of it)."""

    def __init__(self, min_chars: int, cover: float):
        self.min_chars = min_chars
        self.cover = cover
        self.shingles: set[str] = set()

    def is_duplicate(self, sentence: str) -> bool:
        key = norm_key(strip_heading(sentence))
        if len(key) < self.min_chars:
            return False
        sh = _shingles(key.split())
        return len(sh & self.shingles) >= self.cover * len(sh)

    def add(self, sentence: str) -> None:
        key = norm_key(strip_heading(sentence))
        if key:
            self.shingles |= _shingles(key.split())


def merge_chunks(chunks: list[ScoredChunk]) -> tuple[list[ScoredChunk], dict[str, list[str]]]:
    """One entry per chunk id and per content hash, credited with its best score."""
    best: dict[str, ScoredChunk] = {}
    merged: dict[str, list[str]] = {}
    for c in chunks:
        cur = best.get(c.chunk_id)
        if cur is None or c.score > cur.score:
            if cur is not None:
                c.channels = {**cur.channels, **c.channels}
            best[c.chunk_id] = c
    by_hash: dict[str, ScoredChunk] = {}
    for c in sorted(best.values(), key=lambda c: (-c.score, c.chunk_id)):
        key = c.content_hash or c.chunk_id
        if key in by_hash:
            merged.setdefault(by_hash[key].chunk_id, []).append(c.chunk_id)
        else:
            by_hash[key] = c
    return list(by_hash.values()), merged


def by_demoted_score(chunks: list[ScoredChunk],
                     params: ContextParams) -> Iterator[tuple[float, ScoredChunk, str | None]]:
    """(score after noise demotion, chunk, noise reason), best first (ties by chunk id), judging a chunk's noise
    only when it could come next: a chunk scores at most the larger of its score and its demoted score, so while
    the best judged chunk beats that of the next one, it comes first. The chunks after a full context (most of
    the 50 candidates) are never judged, and judging a chunk seen for the first time costs ~0.1 ms."""
    def best_key(c: ScoredChunk) -> tuple[float, str]:
        return -max(c.score, c.score * params.noise_penalty), c.chunk_id

    pending = sorted(chunks, key=best_key)
    judged: list[tuple[float, str, ScoredChunk, str | None]] = []  # a heap by (-score, chunk id): ids are unique
    i = 0
    while i < len(pending) or judged:
        if i < len(pending) and (not judged or best_key(pending[i]) < judged[0][:2]):
            c = pending[i]
            i += 1
            reason = noise_reason(c.text, params.min_content_words)
            heapq.heappush(judged, (-(c.score * (params.noise_penalty if reason else 1.0)), c.chunk_id, c, reason))
        else:
            score, _, c, reason = heapq.heappop(judged)
            yield -score, c, reason


def assemble_context(chunks: list[ScoredChunk], budget: int = 32000, params: ContextParams | None = None,
                     neighbours=None, max_chunks: int | None = None) -> tuple[list[ContextChunk], dict]:
    """`neighbours(chunk) -> list[ScoredChunk]` supplies same-section neighbours when grouping is on;
    `max_chunks` caps how many chunks the context holds (the budget caps tokens)."""
    params = params or ContextParams()
    uniq, merged = merge_chunks(chunks)

    seen = _SeenText(params.dedup_min_chars, params.dedup_cover)
    taken: set[str] = set()
    out: list[ContextChunk] = []
    used = 0
    stats = {"candidates": len(chunks), "unique": len(uniq), "duplicates_removed": 0, "demoted": 0,
             "over_budget": 0, "sentences_removed": 0}

    separator = count_tokens(SEPARATOR)

    def place(c: ScoredChunk, score: float, reason: str | None, anchor: str | None) -> bool:
        nonlocal used
        if max_chunks is not None and len(out) >= max_chunks:
            return False
        sents = sentences(c.text) or [c.text]
        keep = [s for s in sents if not seen.is_duplicate(s)]
        removed = len(sents) - len(keep)
        if not keep or (removed and len(tokens(" ".join(keep))) < params.min_content_words):
            stats["duplicates_removed"] += 1
            return False
        text = c.text if not removed else " ".join(keep)
        item = ContextChunk(n=len(out) + 1, chunk_id=c.chunk_id, title=c.title, doc_id=c.doc_id, source=c.source,
                            section=c.section, page=c.page, position=c.position, text=text, score=float(score),
                            retrieval_score=float(c.channels.get("retrieval", c.score)), tokens=0, route=c.route,
                            channels=dict(c.channels), noise=reason, removed_sentences=removed,
                            merged=merged.get(c.chunk_id, []), neighbour_of=anchor)
        item.tokens = count_tokens(item.render())
        cost = item.tokens + (separator if out else 0)
        if used + cost > budget:
            stats["over_budget"] += 1
            return False
        for s in keep:
            seen.add(s)
        out.append(item)
        taken.add(c.chunk_id)
        used += cost
        stats["sentences_removed"] += removed
        stats["demoted"] += bool(reason)
        return True

    for score, c, reason in by_demoted_score(uniq, params):
        if max_chunks is not None and len(out) >= max_chunks:
            break
        if c.chunk_id in taken:
            continue
        if place(c, score, reason, None) and params.group_neighbours and neighbours is not None and not reason:
            for nb in neighbours(c):
                if nb.chunk_id not in taken:
                    nb_reason = noise_reason(nb.text, params.min_content_words)
                    if not nb_reason:
                        place(nb, score * params.neighbour_decay, None, c.chunk_id)

    # the budget is a hard cap on the rendered text: near it, verify the whole and trim from the end if BPE
    # merges across separators disagree with the sum (they move a join by a token or two, so far below the
    # budget the sum is the count and the second tokenization of everything is skipped)
    total = count_tokens(render_context(out)) if out and used + 4 * len(out) > budget else used
    while total > budget:
        out.pop()
        stats["over_budget"] += 1
        total = count_tokens(render_context(out)) if out else 0
    stats["tokens"] = total
    stats["chunks"] = len(out)
    stats["budget"] = budget
    return out, stats


def render_context(chunks: list[ContextChunk]) -> str:
    return SEPARATOR.join(c.render() for c in chunks)
