"""Small content-addressed SQLite stores of JSON payloads: LLM results and extractions are cached by what produced
them; extractions packed against the text they were extracted from."""

from __future__ import annotations

import json
import sqlite3
import threading
import zlib
from pathlib import Path
from typing import Iterable, Mapping


def _compress(text: str) -> bytes:
    # an extraction repeats its sentences in entities, relations and facts: compressed it is ~8x smaller
    return zlib.compress(text.encode(), 6)


def _text(payload: bytes | str) -> str:
    """A BLOB is compressed JSON; TEXT is a payload written before compression (still read, never rewritten)."""
    return zlib.decompress(payload).decode() if isinstance(payload, bytes) else payload


def dumps(value: object) -> str:
    """The JSON text a payload is stored as."""
    return json.dumps(value, separators=(",", ":"))


class _Store:
    """An SQLite file of key -> payload rows, written from any thread."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._con = sqlite3.connect(str(path), check_same_thread=False)
        self._lock = threading.Lock()
        # 64 KiB pages for a new file (SQLite's default is 4 KiB): most payloads overflow a small page, and each
        # row's last overflow page was half empty (10,000 documents: 38.5 -> 30.9 MB); a file keeps its page size
        self._con.execute("PRAGMA page_size = 65536")
        self._con.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, payload TEXT NOT NULL)")

    def _payloads(self, table: str, keys: Iterable[str]) -> dict[str, bytes | str]:
        """The stored payloads of `keys` in `table`, as they are stored."""
        keys = list(keys)
        found: dict[str, bytes | str] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                found.update(self._con.execute(
                    f"SELECT key, payload FROM {table} WHERE key IN ({','.join('?' * len(part))})", part))
        return found

    def _write(self, table: str, rows: list[tuple[str, bytes]]) -> None:
        with self._lock:
            self._con.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?, ?)", rows)
            self._con.commit()

    def close(self) -> None:
        self._con.close()


class JsonCache(_Store):
    """key -> JSON payload. Keys hash the inputs, model and prompt version, so they are shared by all
    namespaces and a changed prompt or model simply misses."""

    def get_texts(self, keys: Iterable[str]) -> dict[str, str]:
        """The JSON texts held for `keys`, not parsed: a caller that passes them on as JSON spares the round trip."""
        return {k: _text(p) for k, p in self._payloads("cache", keys).items()}

    def get_many(self, keys: Iterable[str]) -> dict[str, object]:
        return {k: json.loads(v) for k, v in self.get_texts(keys).items()}

    def get(self, key: str):
        return self.get_many([key]).get(key)

    def put_texts(self, items: dict[str, str]) -> None:
        """Store JSON texts as they are (`dumps` of a payload)."""
        self._write("cache", [(k, _compress(v)) for k, v in items.items()])

    def put_many(self, items: dict[str, object]) -> None:
        self.put_texts({k: dumps(v) for k, v in items.items()})

    def put(self, key: str, value: object) -> None:
        self.put_many({key: value})


# An extraction packed against the text it was extracted from. Its JSON repeats each sentence in every relation
# of its pairs (41 KB a chunk on average at 10,000 documents, for 0.7 KB of text): packed, each distinct string is
# kept once, as its place in the chunk's text where it occurs there, and entities, relations and facts are
# columns of indices into those strings. A payload that does not come back exactly (an LLM's few typed relations)
# is kept whole (PLAIN).
PLAIN, COLUMNS = 0, 1
_quote = json.encoder.encode_basestring_ascii  # a string as `dumps` writes it


def _columns(value: dict, source: str) -> list:
    strings: list = []
    index: dict[str, int] = {}

    def ref(s: str) -> int:
        i = index.get(s)
        if i is None:
            i = index[s] = len(strings)
            at = source.find(s)  # not a string: TypeError, the payload is kept whole
            strings.append([at, len(s)] if at >= 0 else s)
        return i

    ents, rels, facts = value["entities"], value["relations"], value["facts"]
    return [strings,
            [[ref(e["name"]) for e in ents], [ref(e["type"]) for e in ents], [ref(e["description"]) for e in ents]],
            [[ref(r["source"]) for r in rels], [ref(r["target"]) for r in rels], [ref(r["description"]) for r in rels],
             [r["weight"] for r in rels]],
            [[ref(f["text"]) for f in facts], [[ref(n) for n in f["names"]] for f in facts]],
            value["usage"]]


def _json(packed: list, source: str) -> str:
    """The JSON text (`dumps`) of packed columns, written directly: each string is quoted once, not once per
    relation that repeats it."""
    held, ents, rels, facts, usage = packed
    s = [_quote(x if isinstance(x, str) else source[x[0]:x[0] + x[1]]) for x in held]
    weights = dumps(rels[3])[1:-1].split(",")  # numbers: one call for all (a weight of another kind fails the check)
    e = ",".join(f'{{"name":{s[n]},"type":{s[t]},"description":{s[d]}}}' for n, t, d in zip(*ents))
    r = ",".join(f'{{"source":{s[a]},"target":{s[b]},"description":{s[d]},"weight":{w}}}'
                 for a, b, d, w in zip(*rels[:3], weights))
    f = ",".join(f'{{"text":{s[x]},"names":[{",".join(s[n] for n in names)}]}}' for x, names in zip(*facts))
    return f'{{"entities":[{e}],"relations":[{r}],"facts":[{f}],"usage":{dumps(usage)}}}'


def pack_extraction(text: str, source: str) -> bytes:
    """An extraction's JSON (`dumps`) as a compressed payload that `unpack_extraction` gives back exactly, given
    the same `source` (the text extracted from)."""
    try:
        packed = _columns(json.loads(text), source)
        if _json(packed, source) == text:
            return bytes([COLUMNS]) + _compress(dumps(packed))
    except (KeyError, TypeError, AttributeError, ValueError):  # another shape, or not JSON
        pass
    return bytes([PLAIN]) + _compress(text)


def unpack_extraction(payload: bytes, source: str) -> str:
    """The JSON text `pack_extraction` packed against `source`."""
    body = zlib.decompress(payload[1:]).decode()
    if payload[0] == PLAIN:
        return body
    if payload[0] != COLUMNS:
        raise ValueError(f"extraction cache payload of unknown format {payload[0]}")
    return _json(json.loads(body), source)


class PackedExtractions(_Store):
    """Extractions packed against their chunks' texts (`pack_extraction`), in a table of their own; the rows of
    the `cache` table (whole JSON, written before) are still read."""

    def __init__(self, path: Path):
        super().__init__(path)
        # WITHOUT ROWID: the key is stored once, not in the table and again in its primary key's index
        self._con.execute("CREATE TABLE IF NOT EXISTS packed (key TEXT PRIMARY KEY, payload BLOB NOT NULL) WITHOUT ROWID")

    def get_texts(self, sources: Mapping[str, str]) -> dict[str, str]:
        """The JSON texts held for the keys of `sources` (key -> the text its extraction was extracted from)."""
        found = {k: unpack_extraction(p, sources[k]) for k, p in self._payloads("packed", sources).items()}
        rest = [k for k in sources if k not in found]
        return {**found, **{k: _text(p) for k, p in self._payloads("cache", rest).items()}}

    def put_texts(self, items: dict[str, str], sources: Mapping[str, str]) -> None:
        """Store extractions' JSON texts, each packed against its source text (`sources`: key -> text)."""
        self._write("packed", [(k, pack_extraction(v, sources[k])) for k, v in items.items()])
