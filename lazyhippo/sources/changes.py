"""What changed in a source since the last look, document by document (the source sensor's engine).

A folder's files are compared by (path, size, mtime), a bucket prefix's objects by (key, size, etag); only
files or objects whose stamp changed are read again, and their documents are compared by content hash. A change names the added, changed and removed documents with their hashes, so
a run key made from it identifies the change, never the folder's whole state.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lazyhippo.settings import Settings
from lazyhippo.sources.files import ReadError, iter_files, read_path
from lazyhippo.sources.pdf import cpu_budget

HASH_CHARS = 12  # enough to tell two versions of one document apart, short enough for a cursor
CURSOR_VERSION = 2  # documents by source (their partition names derive from it)


@dataclass(frozen=True)
class FileState:
    size: int
    stamp: int | str      # a file's mtime_ns, an object's etag
    docs: dict[str, str]  # document source (`rel`, `rel#row_id`) -> content hash (prefix)


@dataclass(frozen=True)
class SourceChange:
    added: dict[str, str] = field(default_factory=dict)    # document source -> content hash
    changed: dict[str, str] = field(default_factory=dict)  # document source -> new content hash
    removed: dict[str, str] = field(default_factory=dict)  # document source -> last known content hash
    files: tuple[str, ...] = ()                            # files added, changed or removed

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed)

    def digest(self) -> str:
        body = json.dumps({"added": self.added, "changed": self.changed, "removed": self.removed}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def summary(self, limit: int = 5) -> str:
        files = ", ".join(self.files[:limit]) + (f" (+{len(self.files) - limit} more)" if len(self.files) > limit else "")
        return f"{len(self.added)} added, {len(self.changed)} changed, {len(self.removed)} removed document(s) in {files}"


@dataclass(frozen=True)
class SourceState:
    """The cursor: every file seen, and how many changes were requested so far (so run keys never repeat)."""

    files: dict[str, FileState] = field(default_factory=dict)
    requested: int = 0

    def encode(self) -> str:
        data = {"v": CURSOR_VERSION, "n": self.requested, "f": {p: [s.size, s.stamp, s.docs] for p, s in self.files.items()}}
        return base64.b64encode(zlib.compress(json.dumps(data, sort_keys=True).encode())).decode()

    @classmethod
    def decode(cls, cursor: str | None) -> "SourceState | None":
        if not cursor:
            return None
        data = json.loads(zlib.decompress(base64.b64decode(cursor)))
        if data.get("v") != CURSOR_VERSION:  # an older layout: start again from what the index holds
            return None
        return cls({p: FileState(size, stamp, docs) for p, (size, stamp, docs) in data["f"].items()}, data["n"])

    @classmethod
    def from_index(cls, sources: list[tuple[str, str, str]]) -> "SourceState":
        """A baseline from the indexed documents (doc_id, source, content_hash), with unknown file stats."""
        files: dict[str, dict[str, str]] = {}
        for _doc_id, source, h in sources:
            files.setdefault(source.split("#")[0], {})[source] = h[:HASH_CHARS]
        return cls({p: FileState(-1, -1, docs) for p, docs in files.items()})

    def run_key(self, change: SourceChange) -> str:
        return f"change-{self.requested}-{change.digest()}"


def read_docs(path: Path, root: Path, max_bytes: int) -> dict[str, str] | None:
    """document source -> hash of one file, or None when the file cannot be read (its indexed version is kept)."""
    docs: dict[str, str] = {}
    rel = path.relative_to(root).as_posix()
    for item in read_path(path, root, max_bytes):
        if isinstance(item, ReadError):
            if item.source == rel:  # the whole file failed, not one JSONL row
                return None
            continue
        docs[item.source] = item.content_hash[:HASH_CHARS]
    return docs


def scan_source(source: Path, max_bytes: int, previous: SourceState) -> tuple[SourceState, SourceChange]:
    """The new state of the folder (or file) `source` and the change from `previous`; unchanged stats mean
    unchanged files."""
    source = source.resolve()
    root = source.parent if source.is_file() else source
    stamps = {}
    for path in iter_files(source):
        stat = path.stat()
        stamps[path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    with cpu_budget():  # the PDFs of one scan share a CPU budget: files past it count as unreadable
        return diff_source(stamps, lambda rel: read_docs(root / rel, root, max_bytes), previous)


def diff_source(stamps: dict[str, tuple[int, int | str]], read: Callable[[str], dict[str, str] | None],
                previous: SourceState) -> tuple[SourceState, SourceChange]:
    """The new state and the change, given every file's (size, stamp) by relative name and a reader of one
    file's documents (source -> hash, None when unreadable: its last known state is kept)."""
    files: dict[str, FileState] = {}
    added, changed, touched = {}, {}, []
    for rel, (size, stamp) in sorted(stamps.items()):
        old = previous.files.get(rel)
        if old and (old.size, old.stamp) == (size, stamp):
            files[rel] = old
            continue
        docs = read(rel)
        if docs is None:
            if old:
                files[rel] = old
            continue
        files[rel] = FileState(size, stamp, docs)
        before = old.docs if old else {}
        new = {d: h for d, h in docs.items() if d not in before}
        diff = {d: h for d, h in docs.items() if d in before and before[d] != h}
        gone = set(before) - set(docs)
        if new or diff or gone:
            touched.append(rel)
        added.update(new)
        changed.update(diff)
    removed = {d: h for rel, old in previous.files.items() if rel in files for d, h in old.docs.items()
               if d not in files[rel].docs}
    for rel, old in previous.files.items():
        if rel not in files:
            removed.update(old.docs)
            if old.docs:
                touched.append(rel)
    change = SourceChange(added, changed, removed, tuple(sorted(set(touched))))
    return SourceState(files, previous.requested + (0 if change.empty else 1)), change


def indexed_state(settings: Settings) -> SourceState:
    """The baseline for a sensor without a cursor: what the namespace holds, deleted documents included
    (a reindex skips those anyway). A snapshot that cannot be read is published again from the warehouse first.
    Raises duckdb.Error while an index run holds the warehouse (or nothing complete can repair the snapshot)."""
    import duckdb

    from lazyhippo.stores.warehouse import republish, snapshot_path

    if not settings.db_path.exists():
        return SourceState()
    try:
        return _indexed_rows(settings)
    except duckdb.Error:  # a damaged snapshot: published again from the warehouse, then read
        if not snapshot_path(settings).exists() or not republish(settings):
            raise
    return _indexed_rows(settings)


def _indexed_rows(settings: Settings) -> SourceState:
    from lazyhippo.stores.warehouse import connect

    with connect(settings, read_only=True) as con:
        rows = con.execute("SELECT doc_id, source, content_hash FROM documents WHERE namespace = $1 UNION ALL "
                           "SELECT doc_id, source, content_hash FROM deleted_documents WHERE namespace = $1",
                           [settings.namespace]).fetchall()
    return SourceState.from_index(rows)
