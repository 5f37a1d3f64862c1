"""BM25 over one collection of texts (bm25s), its index built in numpy instead of one Python loop per text.

bm25s scores every (text, token) pair in a loop over the texts; here the same formulas run once over all
pairs (`FlatBM25.build_index_from_ids`, the method bm25s documents for building the index another way) with
bm25s's own idf and tf formulas, so the score matrix is the one bm25s builds (a test compares them bit for bit,
and so catches a bm25s version that builds otherwise), in a fifth of the time on 2Wiki's 21k facts.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import bm25s
import numpy as np
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
    """bm25s.BM25 whose index is built from a `TokenIds` corpus with array operations. It keeps each (token,
    text) pair's count beside its score, and is pickled with the counts in their smallest integer type instead of
    the float32 scores, which unpickling computes again by the same formulas (a third less in the index cache)."""

    counts: np.ndarray  # each entry's term frequency, aligned with scores["data"] (token-major, texts ascending)

    def build_index_from_ids(self, unique_token_ids, corpus_token_ids, show_progress=True, leave_progress=False):
        if self.method in self.methods_requiring_nonoccurrence:
            raise ValueError(f"FlatBM25 builds {self.method!r} indexes the bm25s way only: use bm25s.BM25")
        flat, lengths = corpus_token_ids
        n_docs, n_vocab = len(lengths), len(unique_token_ids)
        # (token, text) pairs, token-major and texts ascending within a token: the order of bm25s's CSC matrix
        pairs, tf = _counted(flat, lengths, n_docs)
        self.nonoccurrence_array = None
        self.counts = tf.astype(np.min_scalar_type(int(tf.max(initial=0))))
        indptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(np.bincount(pairs // n_docs, minlength=n_vocab), out=indptr[1:])
        indices = (pairs % n_docs).astype(self.int_dtype)
        return {"data": self._scored(self.counts, indices, indptr, n_docs), "indices": indices, "indptr": indptr,
                "num_docs": n_docs}

    def _scored(self, tf: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n_docs: int) -> np.ndarray:
        """The score of each entry of the CSC matrix by its term frequency, with bm25s's own idf and tf formulas
        (a text's length is the sum of its tokens' counts). By blocks of entries, each entry's arithmetic the same:
        the formulas' float64 temporaries over all 30M entries of 1.09M facts took 1.2 GB at once."""
        lengths = np.zeros(n_docs, dtype=np.float64)
        for a in range(0, len(tf), _BLOCK):  # whole counts: their float sums are exact in any order
            lengths += np.bincount(indices[a:a + _BLOCK], weights=tf[a:a + _BLOCK], minlength=n_docs)
        lengths = lengths.astype(np.int64)
        avg_doc_len = lengths.mean()  # as bm25s: the mean of the int lengths
        df = np.diff(indptr)
        idf_of = _select_idf_scorer(self.idf_method)   # per distinct document frequency, in Python floats as bm25s
        values, where = np.unique(df, return_inverse=True)
        idf = np.array([idf_of(int(d), N=n_docs) if d else 0.0 for d in values])[where].astype(self.dtype)
        tfc_of = _select_tfc_scorer(self.method)
        out = np.empty(len(tf), dtype=self.dtype)
        for a in range(0, len(tf), _BLOCK):
            b = min(a + _BLOCK, len(tf))
            token = np.searchsorted(indptr, np.arange(a, b), side="right") - 1  # each entry's token (its column)
            tfc = tfc_of(tf_array=tf[a:b].astype(self.dtype), l_d=lengths[indices[a:b]], l_avg=avg_doc_len,
                         k1=self.k1, b=self.b, delta=self.delta)
            out[a:b] = idf[token] * tfc
        return out

    def __getstate__(self) -> dict:
        vocab, s = self.vocab_dict, self.scores
        return {**vars(self), "scores": {**s, "data": None, "indices": Ascending.of(s["indices"], s["indptr"])},
                "unique_token_ids_set": None,
                "vocab_dict": (list(vocab), np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab)))}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        keys, ids = state["vocab_dict"]
        self.vocab_dict = dict(zip(keys, ids.tolist()))
        self.unique_token_ids_set = set(self.vocab_dict.values())
        s = self.scores
        indices = unpacked(s["indices"], s["indptr"])
        self.scores = {**s, "indices": indices, "data": self._scored(self.counts, indices, s["indptr"], s["num_docs"])}


_BLOCK = 1 << 18  # entries scored at once: ~20 MB of temporaries (1 << 22 held 190 MB for 30M entries)


def _counted(flat: np.ndarray, lengths: np.ndarray, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(token * n_docs + text, return_counts=True)` over every token occurrence, sorted in place:
    numpy's copies of the keys (each occurrence's text, the product, the sum, the sorted copy) took 1.5 GB for
    265k passages. The distinct keys are taken before the places where each first occurs, so the sorted keys go
    first, and the counts are made from those places in place: the sorted keys held beside the places and the
    distinct keys took 24 bytes an occurrence at once, now 17."""
    pairs = np.multiply(flat, n_docs, dtype=np.int64)
    pairs += np.repeat(np.arange(n_docs, dtype=np.min_scalar_type(max(n_docs - 1, 0))), lengths)
    pairs.sort()
    first = np.empty(len(pairs), dtype=bool)
    first[:1] = True
    np.not_equal(pairs[1:], pairs[:-1], out=first[1:])
    unique = pairs[first]
    del pairs
    counts = np.flatnonzero(first)  # each distinct key's first place, made its count in place by blocks
    del first
    for a in range(0, len(counts) - 1, _BLOCK):
        b = min(a + _BLOCK, len(counts) - 1)
        np.subtract(counts[a + 1:b + 1], counts[a:b], out=counts[a:b])
    counts[-1:] = len(flat) - counts[-1:]
    return unique, counts


@dataclass(frozen=True)
class Lexical:
    """BM25 over one collection of texts (the chunks, the facts), by the query engine's folded tokens."""

    bm25: object | None
    vocab: dict[str, int]
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
        toks = [t for t in keywords if t in self.vocab]
        if self.bm25 is None or not toks:
            return np.zeros(self.size, dtype=np.float32)
        return np.asarray(self.bm25.get_scores(toks), dtype=np.float32)

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
