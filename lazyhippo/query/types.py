"""Data types of the query engine: a prepared query (embedded once, shared by every channel) and scored chunks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from lazyhippo.query.loader import GraphIndex
from lazyhippo.query.nearest import products, top_indices
from lazyhippo.query.text import code_tokens, name_tokens, tokens


@dataclass
class ScoredChunk:
    """One retrieved chunk with the score that ranked it and its citation metadata."""

    chunk_id: str
    score: float
    title: str
    doc_id: str
    source: str
    section: str | None
    page: int | None
    position: int
    text: str
    content_hash: str
    n_tokens: int
    route: str
    channels: dict[str, float] = field(default_factory=dict)  # per-channel scores (ppr, dense, bm25, rrf, ...)

    @classmethod
    def from_index(cls, idx: GraphIndex, c: int, score: float, route: str, **channels: float) -> "ScoredChunk":
        return cls(chunk_id=idx.chunks.ids[c], score=float(score), title=idx.chunks.titles[c], doc_id=idx.chunks.doc_ids[c],
                   source=idx.chunks.sources[c], section=idx.chunks.sections[c], page=idx.chunks.pages[c], position=int(idx.chunks.positions[c]),
                   text=idx.chunks.texts[c], content_hash=idx.chunks.content_hashes[c], n_tokens=int(idx.chunks.n_tokens[c]),
                   route=route, channels={k: float(v) for k, v in channels.items()})

    def to_dict(self) -> dict:
        return asdict(self)


def hub_entities(idx: GraphIndex, share: float, top_share: float | None = None) -> np.ndarray:
    """Which entities are hubs: named in more than `share` of the passages (and in more than two) and, with
    `top_share`, also among that share of the entities named most often. The second test is what a walk on a
    small corpus needs: there a few passages make every well-connected entity pass the first one, and a chain of
    facts finds no entity left to go through; on a large corpus the first test is the stricter one."""
    df = idx.entities.df
    limit = max(2.0, share * idx.n_chunks)
    if top_share is not None and len(df):
        limit = max(limit, float(np.quantile(df, 1.0 - top_share)))
    return df > limit


class PreparedQuery:
    """The question, its embedding and the per-chunk dense / BM25 scores, computed once on first use."""

    def __init__(self, idx: GraphIndex, question: str, embedder):
        self.idx = idx
        self.text = question
        self.embedder = embedder
        self.passage_embedder = getattr(embedder, "passages", embedder)  # a profile may embed chunks apart
        self.raw_tokens = name_tokens(question)
        self.in_code = code_tokens(question)  # per raw token: inside a code span (backticks)
        self.keywords = tokens(question)
        self._vec: np.ndarray | None = None
        self._passage_vec: np.ndarray | None = None
        self._dense: np.ndarray | None = None
        self._bm25: np.ndarray | None = None

    def embed(self, texts: list[str], passages: bool = False) -> np.ndarray:
        """Vectors to match against entities, facts and communities (or, with `passages`, against chunks)."""
        embedder, dim = (self.passage_embedder, self.idx.chunks.vecs.shape[1]) if passages \
            else (self.embedder, self.idx.dim)
        vecs = embedder.embed(texts)
        if vecs.shape[1] != dim:  # index built with another embedder: dense channels go blank
            return np.zeros((len(texts), dim), dtype=np.float32)
        return np.asarray(vecs, dtype=np.float32)

    @property
    def vec(self) -> np.ndarray:
        if self._vec is None:
            self._vec = self.embed([self.text])[0]
        return self._vec

    @property
    def passage_vec(self) -> np.ndarray:
        """The question's vector to match against chunks."""
        if self._passage_vec is None:
            self._passage_vec = self.vec if self.passage_embedder is self.embedder \
                else self.embed([self.text], passages=True)[0]
        return self._passage_vec

    @property
    def dense(self) -> np.ndarray:
        """Cosine similarity of the question with every chunk."""
        if self._dense is None:
            self._dense = self.idx.chunks.vecs @ self.passage_vec if self.idx.n_chunks \
                else np.zeros(0, dtype=np.float32)
        return self._dense

    def dense_top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The `k` chunks most similar to the question, best first, and their cosines: of every chunk (`dense`), or,
        when the chunks are searched by clusters (`Chunks.near`, a large index), of the chunks in the clusters
        nearest the question, without a product with every chunk."""
        near = self.idx.chunks.near
        if near is None or self._dense is not None:
            top = top_indices(self.dense, k)
            return top, self.dense[top]
        rows = near.rows(self.passage_vec)
        sims = products(self.idx.chunks.vecs, rows, self.passage_vec)
        best = top_indices(sims, k)  # ties: the lower chunk index, as over all chunks
        return rows[best], sims[best]

    def dense_at(self, rows: np.ndarray) -> np.ndarray:
        """The cosines of the chunks `rows` (of `dense`, unless the chunks are searched by clusters)."""
        if self.idx.chunks.near is None or self._dense is not None:
            return self.dense[rows]
        return products(self.idx.chunks.vecs, np.asarray(rows, dtype=np.int64), self.passage_vec)

    @property
    def bm25(self) -> np.ndarray:
        if self._bm25 is None:
            self._bm25 = self.idx.lexical.scores(self.keywords)
        return self._bm25


def chunk_entities(idx: GraphIndex, chunk_id: str, limit: int = 10) -> list[str]:
    """Names of the entities a chunk mentions, the most mentioned first (ties by entity order)."""
    c = idx.chunks.pos.get(chunk_id)
    if c is None or not idx.n_entities:
        return []
    row = idx.mentions.counts[c]
    order = np.lexsort((row.indices, -row.data))[:limit]
    return [idx.entities.names[row.indices[i]] for i in order]


