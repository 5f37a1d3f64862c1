"""Packed arrays for the query index (lazyhippo.query.loader) and the BM25 matrices it holds
(lazyhippo.query.lexical): sorted indices in fewer bytes, texts in one UTF-8 buffer or as parts of other texts,
key -> row maps over them. Numpy only (pyarrow read lazily), so both can import it."""

from __future__ import annotations

import zlib
from abc import abstractmethod
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Ascending:
    """Indices ascending within each segment of an `indptr` (a CSR matrix's columns in each row), as the
    differences from the previous index of their segment (the first: from 0) in uint16, those that do not fit kept
    whole beside: half of int32 where few differences reach 65536 (at 10,000 documents 0.03-0.7% of a matrix's
    entries). Read back by blocks of a cumulative sum, so no int64 copy of them all is ever held."""

    low: np.ndarray    # each difference modulo 65536 (uint16)
    at: np.ndarray     # ascending positions of the differences of 65536 or more
    whole: np.ndarray  # their values
    dtype: np.dtype

    BLOCK = 1 << 22

    @classmethod
    def of(cls, indices: np.ndarray, indptr: np.ndarray) -> "Ascending | np.ndarray":
        """The packed form of `indices`, or `indices` itself when it is not smaller or they do not ascend. The
        differences are taken by blocks: int64 copies of them all took 24 bytes an index (720 MB for the BM25
        matrix of 1.09M facts) beside the 2 bytes kept."""
        starts = indptr[:-1][np.diff(indptr) > 0]
        low = np.empty(len(indices), dtype=np.uint16)
        at, whole, top = [], [], 0
        for a in range(0, len(indices), cls.BLOCK):
            b = min(a + cls.BLOCK, len(indices))
            d = indices[a:b].astype(np.int64)
            d[1:] -= indices[a:b - 1]
            d[:1] -= indices[a - 1] if a else 0
            first = starts[np.searchsorted(starts, a):np.searchsorted(starts, b)]
            d[first - a] = indices[first]
            if d.min() < 0:
                return indices
            low[a:b] = d & 0xFFFF
            big = np.flatnonzero(d >> 16)
            at.append(big + a)
            whole.append(d[big])
            top = max(top, int(d.max()))
        at = np.concatenate(at) if at else np.zeros(0, dtype=np.int64)
        whole = np.concatenate(whole) if whole else np.zeros(0, dtype=np.int64)
        packed = cls(low, at.astype(np.min_scalar_type(max(len(low) - 1, 0))),
                     whole.astype(np.min_scalar_type(top)), indices.dtype)
        return packed if packed.low.nbytes + packed.at.nbytes + packed.whole.nbytes < indices.nbytes else indices

    def array(self, indptr: np.ndarray) -> np.ndarray:
        """The indices again. A segment's first difference is made relative to the previous segment's last index
        (the sum of that segment's differences), which turns the segments' sums into one running sum."""
        d_at_starts, starts = self._starts(indptr)
        out = np.empty(len(self.low), dtype=self.dtype)
        carry = 0
        for a in range(0, len(out), self.BLOCK):
            b = min(a + self.BLOCK, len(out))
            d = self.low[a:b].astype(np.int64)
            i, j = np.searchsorted(self.at, [a, b])
            d[self.at[i:j] - a] = self.whole[i:j]
            i, j = np.searchsorted(starts, [a, b])
            d[starts[i:j] - a] = d_at_starts[i:j]
            run = np.cumsum(d)
            run += carry
            out[a:b] = run
            carry = int(run[-1]) if len(run) else carry
        return out

    def _starts(self, indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each non-empty segment starts, and its first difference from the previous segment's last index."""
        nonempty = np.diff(indptr) > 0
        starts = indptr[:-1][nonempty].astype(np.int64)
        first = self.low[starts].astype(np.int64)
        big = np.isin(starts, self.at)
        first[big] = self.whole[np.searchsorted(self.at, starts[big])]
        last = np.zeros(len(starts), dtype=np.int64)  # each segment's last index: the sum of its differences
        if len(starts):
            last += np.add.reduceat(self.low, starts, dtype=np.int64)
            np.add.at(last, np.searchsorted(starts, self.at, side="right") - 1,
                      self.whole.astype(np.int64) - self.low[self.at])
        return first - np.concatenate([[0], last[:-1]]), starts


def unpacked(indices: "Ascending | np.ndarray", indptr: np.ndarray) -> np.ndarray:
    return indices.array(indptr) if isinstance(indices, Ascending) else indices


class _TextSequence(Sequence):
    """A sequence of `str`s made when read: indexes, negative ones and slices, checked once here for `_at`."""

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(len(self)))]
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._at(i)

    @abstractmethod
    def _at(self, i: int) -> str:
        """The `i`th text, `0 <= i < len(self)`."""


@dataclass(frozen=True, eq=False)
class Texts(_TextSequence):
    """Texts as one UTF-8 buffer and their offsets in it, a `str` made when one is read: as a list of strings
    the passages took twice their UTF-8 size and more (one character past Latin-1 makes its whole string two or
    four bytes a character), 600 MB for the 193 MB of 100,000 documents."""

    data: np.ndarray     # uint8
    offsets: np.ndarray  # int64, one more than texts: text i is data[offsets[i]:offsets[i + 1]]

    @classmethod
    def of_bytes(cls, encoded: Sequence[bytes]) -> "Texts":
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets)

    @classmethod
    def of_arrow(cls, columns: Sequence) -> "Texts":
        """From Arrow string arrays, their bytes copied once (a null is an empty text). A `string` array's 32-bit
        offsets are read as they are: cast to `large_string`, every batch of texts was copied once more before
        the copy into the buffer (at 50,000 documents the passages' read held their 102 MB three times)."""
        import pyarrow as pa

        data, offsets, at = [], [np.zeros(1, dtype=np.int64)], 0
        for column in columns:
            if column.null_count:
                column = column.fill_null("")
            if column.type not in (pa.string(), pa.large_string()):
                column = column.cast(pa.large_string())
            width = np.int32 if column.type == pa.string() else np.int64
            for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else (column,):
                bounds = np.frombuffer(chunk.buffers()[1], dtype=width)[chunk.offset:chunk.offset + len(chunk) + 1]
                bounds = bounds.astype(np.int64)
                data.append(np.frombuffer(chunk.buffers()[2], dtype=np.uint8)[bounds[0]:bounds[-1]]
                            if len(chunk) else np.zeros(0, dtype=np.uint8))
                offsets.append(bounds[1:] - bounds[0] + at)
                at += int(bounds[-1] - bounds[0])
        return cls(np.concatenate(data) if data else np.zeros(0, dtype=np.uint8), np.concatenate(offsets))

    def arrow(self):
        """The texts as an Arrow array over the same buffers (no copy): for joins and lookups in Arrow."""
        import pyarrow as pa

        return pa.LargeStringArray.from_buffers(len(self), pa.py_buffer(self.offsets), pa.py_buffer(self.data))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _at(self, i: int) -> str:
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes().decode()

    BLOCK = 1 << 16

    def __iter__(self):
        """By blocks of texts, each block's bytes copied out once: a numpy slice a text took three times as long."""
        for a in range(0, len(self), self.BLOCK):
            cuts = self.offsets[a:a + self.BLOCK + 1]
            block, cuts = self.data[cuts[0]:cuts[-1]].tobytes(), (cuts - cuts[0]).tolist()
            yield from (block[x:y].decode() for x, y in zip(cuts, cuts[1:]))

    def __eq__(self, other) -> bool:
        if isinstance(other, Texts):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.data, other.data)
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))


@dataclass(frozen=True, eq=False)
class Spans(_TextSequence):
    """Texts that are each a part of another text (a fact's sentence of its passage), as that text's row and the
    part's character start and length there: the facts' own copy of their sentences was 104 of the query index's
    1,055 MB at 50,000 documents. A text not found in its passage is held whole beside (its length -1, its start
    its place in `whole`), so any text reads back equal. Offsets count characters of the `str`s `within` gives."""

    within: Sequence[str] | None  # the texts they are parts of; None in the disk cache, which holds those apart
    row: np.ndarray     # int32
    start: np.ndarray   # int32
    length: np.ndarray  # int32
    whole: Texts

    @classmethod
    def placed(cls, within: Sequence[str], rows: np.ndarray, start: np.ndarray, length: np.ndarray,
               texts: Sequence[str | None]) -> "Spans":
        """Spans placed already (the warehouse's, schema.sql): a negative start is a text not in its row, held
        whole from `texts` (a null is an empty text); the other texts are not read."""
        start, length = np.array(start, dtype=np.int32), np.array(length, dtype=np.int32)
        held = np.flatnonzero(start < 0)
        whole = [(texts[i] or "").encode() for i in held.tolist()]
        start[held], length[held] = np.arange(len(held), dtype=np.int32), -1
        return cls(within, np.asarray(rows, dtype=np.int32), start, length, Texts.of_bytes(whole))

    @classmethod
    def joined(cls, parts: Sequence["Spans"]) -> "Spans":
        """The parts' texts in turn (all within the same texts)."""
        if not parts:
            return cls(None, *(np.zeros(0, dtype=np.int32) for _ in range(3)), Texts.of_bytes([]))
        start = [p.start + np.where(p.length < 0, n, 0).astype(np.int32)
                 for p, n in zip(parts, np.cumsum([0] + [len(p.whole) for p in parts[:-1]]))]
        return cls(parts[0].within, np.concatenate([p.row for p in parts]), np.concatenate(start),
                   np.concatenate([p.length for p in parts]),
                   Texts.of_bytes([t.encode() for p in parts for t in p.whole]))

    def __len__(self) -> int:
        return len(self.row)

    def _at(self, i: int) -> str:
        start, length = int(self.start[i]), int(self.length[i])
        return self.whole[start] if length < 0 else self.within[int(self.row[i])][start:start + length]


@dataclass(frozen=True, eq=False)
class Rows(Mapping):
    """Key -> row of packed keys (`Texts`), by a binary search over them in ascending order: the keys' own
    buffer and at most one int32 a row (none where the rows ascend by key already, as entities read ORDER BY
    id do), where a dict of them took ~100 bytes a key beside the keys' strings (63 MB for 50,000 documents'
    entities). A key given twice maps to its last row, as a dict of them does."""

    ids: Texts
    order: np.ndarray | None  # the rows by ascending key (stable), None when that is every row in turn

    @classmethod
    def of(cls, ids: Texts) -> "Rows":
        """Sorted by their UTF-8 bytes, which is the order of their code points, as Python compares `str`s."""
        import pyarrow.compute as pc

        order = pc.sort_indices(ids.arrow()).to_numpy().astype(np.int32)  # a stable sort
        return cls(ids, None if np.array_equal(order, np.arange(len(order))) else order)

    def __getitem__(self, key: str) -> int:
        """Compared as UTF-8 bytes, none decoded."""
        if not isinstance(key, str):
            raise KeyError(key)
        want, data, offsets, order = key.encode(), self.ids.data, self.ids.offsets, self.order
        lo, hi = 0, len(self.ids)
        while lo < hi:  # the first row past the key
            mid = (lo + hi) // 2
            row = mid if order is None else order[mid]
            if want < data[offsets[row]:offsets[row + 1]].tobytes():
                hi = mid
            else:
                lo = mid + 1
        row = lo - 1 if order is None else int(order[lo - 1])
        if not lo or data[offsets[row]:offsets[row + 1]].tobytes() != want:
            raise KeyError(key)
        return row

    def __iter__(self):
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, eq=False)
class DocRows(Mapping):
    """(doc_id, position) -> row of passages ordered by document and position, by a binary search over the
    document ids and then their positions: no dict of a tuple a passage (~20 MB at 50,000 documents)."""

    doc_ids: Sequence[str]  # ascending
    positions: np.ndarray   # ascending within a document

    @classmethod
    def of(cls, doc_ids: Sequence[str], positions: np.ndarray) -> "DocRows | None":
        """None when the rows are not in that order."""
        same = np.fromiter((a == b for a, b in zip(doc_ids, doc_ids[1:])), dtype=bool, count=max(len(doc_ids) - 1, 0))
        ascending = all(a <= b for a, b in zip(doc_ids, doc_ids[1:]))
        return cls(doc_ids, positions) if ascending and np.all(np.diff(positions)[same] >= 0) else None

    def __getitem__(self, key: tuple[str, int]) -> int:
        doc, position = key
        a, b = bisect_left(self.doc_ids, doc), bisect_right(self.doc_ids, doc)
        i = a + int(np.searchsorted(self.positions[a:b], position, side="right"))
        if i == a or self.positions[i - 1] != position:
            raise KeyError(key)
        return i - 1

    def __iter__(self):
        return zip(self.doc_ids, self.positions.tolist())

    def __len__(self) -> int:
        return len(self.doc_ids)


@dataclass(frozen=True, eq=False)
class KeyRows(Mapping):
    """Key -> the rows carrying it (ascending), as the keys ordered by a CRC-32 of their UTF-8 bytes, the rows flat
    and each key's offset into them: a dict of a small numpy array a key took ~110 bytes a key beside its rows (55 MB
    for the names of 50,000 documents' entities). A key is found by one search among the hashes: a bisection over
    the keys themselves took ~10 us a lookup in Python, and a question looks up hundreds of spans, most of them
    absent. Iterated in the hashes' order."""

    keys_: Texts          # distinct, by hash
    hashes: np.ndarray    # uint32, ascending: each key's zlib.crc32
    flat: np.ndarray      # int32: key i's rows at flat[offsets[i]:offsets[i + 1]]
    offsets: np.ndarray   # int32, one more than keys

    @classmethod
    def of(cls, keys, codes: np.ndarray) -> "KeyRows":
        """From an Arrow string array of distinct keys and each row's key (its position in `keys`, -1 for none);
        an empty key is left out. Grouped in numpy: a Python call per key (its hash), none per row."""
        encoded = [k.encode() for k in keys.to_pylist()]
        hashes = np.fromiter((zlib.crc32(k) for k in encoded), dtype=np.uint32, count=len(encoded))
        order = np.argsort(hashes, kind="stable")
        order = order[np.fromiter((len(k) > 0 for k in encoded), dtype=bool, count=len(encoded))[order]]
        new = np.full(len(encoded) + 1, -1, dtype=np.int64)  # each key's place among those kept; the last: none
        new[order] = np.arange(len(order))
        ranked = new[codes]
        flat = np.argsort(ranked, kind="stable")[np.count_nonzero(ranked < 0):].astype(np.int32)
        offsets = np.zeros(len(order) + 1, dtype=np.int32)  # rows are int32 too
        np.cumsum(np.bincount(ranked[ranked >= 0], minlength=len(order)), out=offsets[1:])
        return cls(Texts.of_bytes([encoded[i] for i in order]), hashes[order], flat, offsets)

    def _find(self, key) -> int:
        """The key's place, or -1."""
        if not isinstance(key, str):
            return -1
        want = key.encode()
        h = np.uint32(zlib.crc32(want))  # a Python int would have the whole array cast for the search
        hashes, data, offsets = self.hashes, self.keys_.data, self.keys_.offsets
        i = int(hashes.searchsorted(h))
        while i < len(hashes) and hashes[i] == h:  # two keys share a hash once in millions of pairs
            if data[offsets[i]:offsets[i + 1]].tobytes() == want:
                return i
            i += 1
        return -1

    def __getitem__(self, key: str) -> np.ndarray:
        i = self._find(key)
        if i < 0:
            raise KeyError(key)
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def __contains__(self, key) -> bool:
        return self._find(key) >= 0

    def __iter__(self):
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)
