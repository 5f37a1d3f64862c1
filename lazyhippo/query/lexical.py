"""BM25 over one collection of texts (bm25s), its index built in numpy instead of one Python loop per text.

bm25s scores every (text, token) pair in a loop over the texts; here the same formulas run once over all
pairs (`FlatBM25.build_index_from_ids`, the method bm25s documents for building the index another way), in a
fifth of the time on 2Wiki's 21k facts. Scores come from term counts by bm25s's own idf and tf formulas, so every
column's scores are those of the matrix bm25s builds (a test compares them bit for bit, and so catches a bm25s
version that scores otherwise).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from zlib import crc32

import bm25s
import numpy as np
import scipy.sparse as sp
from bm25s.scoring import _select_idf_scorer, _select_tfc_scorer

from lazyhippo.query.packing import Ascending, unpacked
from lazyhippo.query.text import tokens


@dataclass(frozen=True)
class TokenIds:
    """The corpus object bm25s.BM25.index takes (`ids`, `vocab`): here every text's token ids as one flat
    array, with each text's number of tokens."""
    ids: tuple[np.ndarray, np.ndarray]   # (flat token ids, tokens per text)
    vocab: dict[str, int]

    @classmethod
    def of(cls, texts: Iterable[list[str]]) -> "TokenIds":
        """Read one text's tokens at a time: a million facts' token lists, all held at once, took 2.5 GB. Token
        ids in 32 bits: there are never 2^31 distinct tokens, and a passage corpus has tens of millions of them."""
        vocab: dict[str, int] = {}
        flat, lengths = array("i"), array("q")
        for toks in texts:
            lengths.append(len(toks))
            flat.extend([vocab.setdefault(t, len(vocab)) for t in toks])
        return cls((np.frombuffer(flat, dtype=np.int32), np.frombuffer(lengths, dtype=np.int64)), vocab)


class FlatBM25(bm25s.BM25):
    """bm25s.BM25 whose index is built from a `TokenIds` corpus with array operations. It holds each (token, text)
    pair's count in its smallest integer type, not its float32 score: a query scores only its tokens' columns, by
    bm25s's formulas over the counts and the texts' lengths, to the same float32 values (the scores of every pair
    were four bytes an entry, a fifth of the index, and a cached load computed them all again). Its vocabulary is
    a `Vocabulary`; bm25s's `unique_token_ids_set`, which only `retrieve` reads (never called here), is not kept."""

    counts: np.ndarray  # each entry's term frequency, aligned with scores["indices"] (token-major, texts ascending)
    lengths: np.ndarray  # each text's number of tokens
    avg_doc_len: float

    def index(self, corpus, create_empty_token=True, show_progress=True, leave_progress=False):
        super().index(corpus, create_empty_token=create_empty_token, show_progress=show_progress,
                      leave_progress=leave_progress)
        self.vocab_dict = Vocabulary.of(self.vocab_dict)
        del self.unique_token_ids_set

    def build_index_from_ids(self, unique_token_ids, corpus_token_ids, show_progress=True, leave_progress=False):
        if self.method in self.methods_requiring_nonoccurrence:
            raise ValueError(f"FlatBM25 builds {self.method!r} indexes the bm25s way only: use bm25s.BM25")
        flat, lengths = corpus_token_ids
        # each token's texts ascending, with the token's count in each: the order of bm25s's CSC matrix
        by_token = _columns(flat, lengths, len(unique_token_ids))
        self.nonoccurrence_array = None
        self.counts = by_token.data.astype(np.min_scalar_type(int(by_token.data.max(initial=0))), copy=False)
        self.lengths = lengths.astype(np.min_scalar_type(int(lengths.max(initial=0))))
        self.avg_doc_len = float(np.asarray(lengths, dtype=np.int64).mean())  # as bm25s: the mean of the int lengths
        return {"indices": by_token.indices.astype(self.int_dtype, copy=False),
                "indptr": by_token.indptr.astype(np.int64, copy=False), "num_docs": len(lengths)}

    def columns(self, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """These tokens' entries one column after another: their texts, their scores (bm25s's `data`: the token's
        idf, from its document frequency in Python floats, then float32, times the entry's tf component, in
        float64, stored in float32) and where each column ends. All columns' formulas run at once: a column at a
        time took 26 us a token."""
        s, token_ids = self.scores, np.asarray(token_ids, dtype=np.int64)
        starts, ends = s["indptr"][token_ids], s["indptr"][token_ids + 1]
        entries = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(starts.tolist(), ends.tolist())]
                                 or [np.zeros(0, dtype=np.int64)])
        texts = s["indices"][entries]
        idf_of = _select_idf_scorer(self.idf_method)
        idf = np.array([idf_of(int(d), N=s["num_docs"]) for d in ends - starts], dtype=self.dtype)
        tfc = _select_tfc_scorer(self.method)(tf_array=self.counts[entries].astype(self.dtype), l_d=self.lengths[texts],
                                             l_avg=self.avg_doc_len, k1=self.k1, b=self.b, delta=self.delta)
        return texts, (np.repeat(idf, ends - starts) * tfc).astype(self.dtype), np.cumsum(ends - starts)

    def get_scores_from_ids(self, query_tokens_ids, weight_mask=None) -> np.ndarray:
        """Each text's summed score over the query's tokens, column after column as bm25s's
        `_compute_relevance_from_scores` adds them (a token's column holds a text once, so `+=` is its `add.at`).
        A token without a column (bm25s's "" added to the vocabulary) adds nothing."""
        scores = np.zeros(self.scores["num_docs"], dtype=self.dtype)
        texts, data, ends = self.columns([i for i in query_tokens_ids if i + 1 < len(self.scores["indptr"])])
        for a, b in zip([0, *ends.tolist()], ends.tolist()):
            scores[texts[a:b]] += data[a:b]
        if weight_mask is not None:
            scores *= weight_mask
        return scores

    def __getstate__(self) -> dict:
        s = self.scores
        return {**vars(self), "scores": {**s, "indices": Ascending.of(s["indices"], s["indptr"])}}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        s = self.scores
        self.scores = {**s, "indices": unpacked(s["indices"], s["indptr"])}


class Vocabulary(Mapping):
    """token -> column id, read-only: the tokens' UTF-8 bytes packed in one string in the order of their CRC-32,
    each found by bisecting the sorted CRCs (C-level) and comparing the bytes of the few with its CRC; 12 bytes a
    token beside its text. A dict of 64k str keys and int values held 7.3 MB; this holds about 1.3. A binary search
    by the tokens' own bytes, one Python step per halving, took 15 us a lookup on a loaded host; this one 2-3.5, the
dict 0.07."""

    __slots__ = ("packed", "ends", "ids", "crcs")

    def __init__(self, packed: bytes, ends: array, ids: array, crcs: array):
        self.packed, self.ends, self.ids, self.crcs = packed, ends, ids, crcs

    @classmethod
    def of(cls, vocab: dict[str, int]) -> "Vocabulary":
        keys = list(vocab)
        crcs = np.fromiter((crc32(k.encode()) for k in keys), dtype=np.uint32, count=len(keys))
        order = np.argsort(crcs, kind="stable").tolist()
        keys = [keys[i] for i in order]
        ends = np.cumsum(np.fromiter((len(k.encode()) for k in keys), dtype=np.int64, count=len(keys)))
        return cls("".join(keys).encode(), array("I", ends.astype(np.uint32).tobytes()),
                   array("i", (vocab[k] for k in keys)), array("I", crcs[order].tobytes()))

    def _find(self, token: str) -> int:
        """The position of `token`, or -1."""
        key = token.encode()
        crc, crcs, ends = crc32(key), self.crcs, self.ends
        m = bisect_left(crcs, crc)
        while m < len(crcs) and crcs[m] == crc:
            if self.packed[ends[m - 1] if m else 0:ends[m]] == key:
                return m
            m += 1
        return -1

    def get(self, token, default=None):
        m = self._find(token) if isinstance(token, str) else -1
        return self.ids[m] if m >= 0 else default

    def __getitem__(self, token: str) -> int:
        if (i := self.get(token)) is None:
            raise KeyError(token)
        return i

    def __contains__(self, token) -> bool:
        return self.get(token) is not None

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self):
        packed, start = self.packed, 0
        for end in self.ends:
            yield packed[start:end].decode()
            start = end


_BLOCK = 1 << 18  # token occurrences counted at once


def _columns(flat: np.ndarray, lengths: np.ndarray, n_vocab: int) -> sp.csc_matrix:
    """(text, token) counts as a (texts, tokens) matrix by columns. Each block of texts' distinct pairs is counted
    apart (texts are whole in a block) into rows of 4 bytes for the token and the texts' count type, then scipy
    turns the rows into columns: one int64 key per occurrence, sorted and counted at once, with its distinct keys
    and their counts and places beside, held 7.2 times the int32 token ids at once, these rows and columns 3.1
    (BM25 over 50,000 documents' facts, the peak of the query index's facts part: +280 MB over its token ids,
    now +106)."""
    n_docs = len(lengths)
    ends = np.cumsum(lengths, dtype=np.int64)
    tokens = np.empty(len(flat), dtype=np.int32)  # distinct pairs are at most the occurrences
    counts = np.empty(len(flat), dtype=np.min_scalar_type(int(lengths.max(initial=0))))
    indptr = np.zeros(n_docs + 1, dtype=np.int64)
    n = t = 0
    while t < n_docs:
        start = int(ends[t] - lengths[t])
        u = max(int(np.searchsorted(ends, start + _BLOCK, side="right")), t + 1)
        keys = np.repeat(np.arange(u - t, dtype=np.int64), lengths[t:u]) * n_vocab + flat[start:int(ends[u - 1])]
        keys.sort()
        first = np.empty(len(keys), dtype=bool)
        first[:1] = True
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        places = np.flatnonzero(first)
        distinct = keys[places]
        tokens[n:n + len(places)] = distinct % n_vocab
        counts[n:n + len(places)] = np.diff(places, append=len(keys))
        indptr[t + 1:u + 1] = np.bincount(distinct // n_vocab, minlength=u - t)
        n, t = n + len(places), u
    np.cumsum(indptr, out=indptr)
    by_text = sp.csr_matrix((counts[:n], tokens[:n], indptr), shape=(n_docs, n_vocab))
    del tokens, counts, indptr
    return by_text.tocsc()


@dataclass(frozen=True)
class Lexical:
    """BM25 over one collection of texts (the chunks, the facts), by the query engine's folded tokens."""

    bm25: object | None
    vocab: Mapping[str, int]
    size: int

    @classmethod
    def build(cls, docs: list[str]) -> "Lexical":
        if not docs:
            return cls(None, {}, 0)
        retriever = FlatBM25()
        retriever.index(TokenIds.of(tokens(d) or [""] for d in docs), show_progress=False)
        return cls(retriever, retriever.vocab_dict, len(docs))

    def __reduce__(self):
        """Pickled by its BM25 index, whose vocabulary this one is (held once)."""
        return _lexical, (self.bm25, self.size)

    def scores(self, keywords: list[str]) -> np.ndarray:
        """One BM25 score per text (zeros when no keyword is in the vocabulary)."""
        ids = [i for t in keywords if (i := self.vocab.get(t)) is not None]
        if self.bm25 is None or not ids:
            return np.zeros(self.size, dtype=np.float32)
        return np.asarray(self.bm25.get_scores_from_ids(ids), dtype=np.float32)

    def idf(self, keywords: list[str]) -> np.ndarray:
        """How rare each keyword is among the texts, ln((N + 1) / (df + 1)): a word no text holds weighs most."""
        indptr = self.bm25.scores["indptr"] if self.bm25 is not None else np.zeros(1, dtype=np.int64)
        df = [indptr[i + 1] - indptr[i] if (i := self.vocab.get(t)) is not None and i + 1 < len(indptr) else 0
              for t in keywords]
        return np.log((self.size + 1) / (np.asarray(df, dtype=np.float64) + 1))

    def holders(self, token: str) -> np.ndarray:
        """Positions of the texts that contain `token` (one of the folded tokens), from the BM25 matrix."""
        i, indptr = self.vocab.get(token), self.bm25.scores["indptr"] if self.bm25 is not None else ()
        if i is None or i + 1 >= len(indptr):  # bm25s adds "" to the vocabulary without a column
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.bm25.scores["indices"][indptr[i]:indptr[i + 1]], dtype=np.int64)


def _lexical(bm25: FlatBM25 | None, size: int) -> Lexical:
    return Lexical(bm25, bm25.vocab_dict if bm25 is not None else {}, size)
