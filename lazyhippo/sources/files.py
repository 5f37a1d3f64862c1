"""Read a folder (or one file) of documents into documents, reporting what cannot be read: plain text, Markdown,
reStructuredText, AsciiDoc and HTML (`sources/markup.py`), PDF (`sources/pdf.py`) and JSONL rows."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from lazyhippo.sources import asciidoc, htmldoc, markdown, rest
from lazyhippo.sources.markup import DOCUMENT_SUFFIXES, FORMAT_BY_SUFFIX, outline, pretty_name, sniff
from lazyhippo.sources.pdf import PARSE_LIMITS, ParseLimits, cpu_budget, read_pdf

SUPPORTED = {".txt", ".md", ".markdown", ".rst", ".adoc", ".asciidoc", ".html", ".htm", ".pdf", ".jsonl"}
# kinds whose readers unwrap paragraphs: every line of their text is a unit (heading, paragraph, item, code line)
MARKUP_KINDS = {"md", "rst", "adoc", "html"}
MAX_WORD_CHARS = 1000  # a run without whitespace longer than this is an encoded blob or garbage, not text
_JUNK = re.compile(r"\S{%d,}" % (MAX_WORD_CHARS + 1))


@dataclass(frozen=True)
class Section:
    text: str
    heading: str | None = None
    page: int | None = None


@dataclass(frozen=True)
class Document:
    doc_id: str
    source: str
    title: str
    kind: str
    sections: tuple[Section, ...]
    content_hash: str = field(default="")

    @property
    def text(self) -> str:
        return "\n\n".join(s.text for s in self.sections)


@dataclass(frozen=True)
class ReadError:
    source: str  # the file, or the row/part of it (file:line) the reason is about
    reason: str
    file: str = ""  # the file it belongs to (its earlier documents are kept when the file fails)

    def __post_init__(self) -> None:
        if not self.file:
            object.__setattr__(self, "file", self.source)


def sha(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def doc_id_for(source: str) -> str:
    """A document's id: a hash of its source (path relative to the source root, `file.jsonl#row_id` for a row)."""
    return "d_" + sha(source)


def _make(source: str, title: str, kind: str, sections: list[Section]) -> Document:
    sections = [s for s in sections if s.text.strip()]
    body = "\n\n".join(s.text for s in sections)
    return Document(doc_id=doc_id_for(source), source=source, title=title.strip(), kind=kind,
                    sections=tuple(sections), content_hash=sha(title + "\n" + body, 32))


def _decode(path: Path, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise ValueError("binary content (NUL bytes), not text")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark is not text
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 (byte {exc.start})") from None


def _format(path: Path, text: str) -> str | None:
    """The markup a text file is in: by extension, inner extension ("index.rst.txt") or, for .txt, by content."""
    for suffix in reversed([x.lower() for x in path.suffixes]):
        if suffix in FORMAT_BY_SUFFIX:
            return FORMAT_BY_SUFFIX[suffix]
        if suffix not in DOCUMENT_SUFFIXES:
            break
    return sniff(text)


def read_markup(fmt: str, text: str) -> tuple[str | None, list[tuple[str | None, str]]]:
    """Title and sections of `text` in format 'md', 'rst', 'adoc' or 'html'."""
    reader = {"md": markdown.events, "rst": rest.events, "adoc": asciidoc.events, "html": htmldoc.events}[fmt]
    return outline(reader(text))


def read_path(path: Path, root: Path, max_bytes: int, limits: ParseLimits = PARSE_LIMITS) -> Iterator[Document | ReadError]:
    """Yield documents of one file; a bad file yields one ReadError and never raises."""
    rel = path.relative_to(root).as_posix() if path != root else path.name
    try:
        for item in _read_file(path, rel, max_bytes, limits):
            yield from _without_junk(item, rel) if isinstance(item, Document) else (item,)
    except (ValueError, OSError) as exc:
        yield ReadError(rel, str(exc))


def _read_file(path: Path, rel: str, max_bytes: int, limits: ParseLimits) -> Iterator[Document | ReadError]:
    size = path.stat().st_size
    if size == 0:
        raise ValueError("empty file")
    if size > max_bytes:
        raise ValueError(f"too large ({size} bytes > max_file_bytes {max_bytes})")
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED:
        raise ValueError(f"unsupported file type {suffix or '(none)'!r} (supported: {', '.join(sorted(SUPPORTED))})")
    if suffix == ".pdf":
        title, pages = read_pdf(path, limits)
        sections = [Section(text, None, page) for text, page in pages]
        if not any(s.text for s in sections):
            raise ValueError("PDF has no extractable text")
        yield _make(rel, title or pretty_name(path.name), "pdf", sections)
        return
    text = _decode(path, path.read_bytes())
    if not text.strip():
        raise ValueError("empty file (whitespace only)")
    if suffix == ".jsonl":
        yield from _read_jsonl(rel, text)
        return
    fmt = _format(path, text)
    if fmt is None:
        yield _make(rel, pretty_name(path.name), "txt", [Section(text.strip())])
        return
    try:
        title, parts = read_markup(fmt, text)
    except RecursionError:
        raise ValueError(f"{fmt} markup nested too deeply to read") from None
    sections = [Section(body, heading) for heading, body in parts]
    if not any(s.text.strip() for s in sections):
        raise ValueError(f"no text in this {fmt} document (markup only)")
    yield _make(rel, title or pretty_name(path.name), fmt, sections)


def _without_junk(doc: Document, rel: str) -> Iterator[Document | ReadError]:
    """Runs without whitespace longer than MAX_WORD_CHARS are cut out (they chunked into thousands of junk
    chunks); the document keeps its text and the cut is reported under the document's source."""
    runs = [len(m) for s in doc.sections for m in _JUNK.findall(s.text)]
    if not runs:
        yield doc
        return
    note = (f"dropped {len(runs)} run(s) of more than {MAX_WORD_CHARS} characters without whitespace "
            f"(longest {max(runs):,}): not text")
    cleaned = _make(doc.source, doc.title, doc.kind,
                    [Section(_JUNK.sub(" ", s.text).strip(), s.heading, s.page) for s in doc.sections])
    if cleaned.sections:
        yield cleaned
        yield ReadError(doc.source, note, rel)
    else:
        yield ReadError(doc.source, f"no text left: {note}", rel)


def _read_jsonl(rel: str, text: str) -> Iterator[Document | ReadError]:
    """One document per row {"id", "title", "text"}: a null or non-string text and a repeated id are errors
    of that row (the first row with an id wins)."""
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{rel}:{lineno}"
        try:
            row = json.loads(line)
            body = row["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            yield ReadError(where, f"bad JSONL row ({exc.__class__.__name__}: {exc})", rel)
            continue
        if not isinstance(body, str):
            yield ReadError(where, f"\"text\" is {'null' if body is None else type(body).__name__}, not a string", rel)
            continue
        row_id = str(row.get("id", lineno))
        if row_id in seen:
            yield ReadError(where, f"duplicate id {row_id!r} (first on line {seen[row_id]}): row skipped", rel)
            continue
        seen[row_id] = lineno
        if body.strip():
            yield _make(f"{rel}#{row_id}", str(row.get("title") or row_id), "jsonl", [Section(body.strip())])
        else:
            yield ReadError(where, "empty text", rel)


def scan_source(source: Path) -> tuple[list[Path], list[ReadError]]:
    """The supported files under `source` (hidden ones skipped), and every symlink skipped with its reason:
    links are never followed, so nothing outside the folder is read and loops cannot recurse."""
    source = Path(source)
    if source.is_file():
        return [source], []
    if not source.exists():
        raise FileNotFoundError(f"source folder {source} does not exist")
    root = source.resolve()
    files: list[Path] = []
    skipped: list[ReadError] = []
    for dirpath, dirnames, filenames in os.walk(root):  # followlinks=False: linked folders are not entered
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        base = Path(dirpath)
        for name in sorted(dirnames + [f for f in filenames if not f.startswith(".")]):
            path = base / name
            if path.is_symlink():
                if name in dirnames or path.suffix.lower() in SUPPORTED or not path.exists():
                    skipped.append(ReadError(path.relative_to(root).as_posix(), _symlink_reason(path, root)))
            elif name not in dirnames and path.suffix.lower() in SUPPORTED:
                files.append(path)
    return sorted(files), skipped


def _symlink_reason(path: Path, root: Path) -> str:
    try:
        target = path.resolve(strict=True)
    except FileNotFoundError:
        return f"dangling symlink (to {os.readlink(path)}): skipped"
    except (RuntimeError, OSError):
        return "symlink loop: skipped"
    if target != root and root not in target.parents:
        return f"symlink to {target}, outside the source folder: not followed"
    return f"symlink to {target.relative_to(root).as_posix() or '.'} inside the source folder: indexed under that path only"


def iter_files(source: Path) -> list[Path]:
    return scan_source(source)[0]


def iter_source(source: Path, max_bytes: int, limits: ParseLimits = PARSE_LIMITS) -> Iterator[Document | ReadError]:
    """The documents and read errors of `source`, file by file as they are read: a caller that consumes them
    as they come holds one file's documents at a time, whatever the size of the source. A document id read
    twice comes twice (the last one wins)."""
    source = source.resolve()
    root = source.parent if source.is_file() else source
    files, skipped = scan_source(source)
    yield from skipped
    with cpu_budget(limits):
        for path in files:
            yield from read_path(path, root, max_bytes, limits)


def read_source(source: Path, max_bytes: int, limits: ParseLimits = PARSE_LIMITS) -> tuple[list[Document], list[ReadError]]:
    """Every document of `source` at once (the last of a repeated id, in its first place), and the read errors."""
    docs: dict[str, Document] = {}
    errors: list[ReadError] = []
    for item in iter_source(source, max_bytes, limits):
        if isinstance(item, ReadError):
            errors.append(item)
        else:
            docs[item.doc_id] = item
    return list(docs.values()), errors
