"""A small content-addressed SQLite store of JSON payloads: LLM results are cached by what produced them."""

from __future__ import annotations

import json
import sqlite3
import threading
import zlib
from pathlib import Path
from typing import Iterable


def _compress(text: str) -> bytes:
    # an extraction repeats its sentences in entities, relations and facts: compressed it is ~8x smaller
    return zlib.compress(text.encode(), 6)


def _text(payload: bytes | str) -> str:
    """A BLOB is compressed JSON; TEXT is a payload written before compression (still read, never rewritten)."""
    return zlib.decompress(payload).decode() if isinstance(payload, bytes) else payload


def dumps(value: object) -> str:
    """The JSON text a payload is stored as."""
    return json.dumps(value, separators=(",", ":"))


class JsonCache:
    """key -> JSON payload. Keys hash the inputs, model and prompt version, so they are shared by all
    namespaces and a changed prompt or model simply misses."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._con = sqlite3.connect(str(path), check_same_thread=False)
        self._lock = threading.Lock()
        # 64 KiB pages for a new file (SQLite's default is 4 KiB): most payloads overflow a small page, and each
        # row's last overflow page was half empty (10,000 documents: 38.5 -> 30.9 MB); a file keeps its page size
        self._con.execute("PRAGMA page_size = 65536")
        self._con.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, payload TEXT NOT NULL)")

    def get_texts(self, keys: Iterable[str]) -> dict[str, str]:
        """The JSON texts held for `keys`, not parsed: a caller that passes them on as JSON spares the round trip."""
        keys = list(keys)
        found: dict[str, str] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                rows = self._con.execute(f"SELECT key, payload FROM cache WHERE key IN ({','.join('?' * len(part))})", part)
                found.update({k: _text(p) for k, p in rows})
        return found

    def get_many(self, keys: Iterable[str]) -> dict[str, object]:
        return {k: json.loads(v) for k, v in self.get_texts(keys).items()}

    def get(self, key: str):
        return self.get_many([key]).get(key)

    def put_texts(self, items: dict[str, str]) -> None:
        """Store JSON texts as they are (`dumps` of a payload)."""
        with self._lock:
            self._con.executemany("INSERT OR REPLACE INTO cache VALUES (?, ?)",
                                  [(k, _compress(v)) for k, v in items.items()])
            self._con.commit()

    def put_many(self, items: dict[str, object]) -> None:
        self.put_texts({k: dumps(v) for k, v in items.items()})

    def put(self, key: str, value: object) -> None:
        self.put_many({key: value})

    def close(self) -> None:
        self._con.close()
