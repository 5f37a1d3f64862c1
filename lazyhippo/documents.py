"""Read a folder (or one file) of .txt, .md, .pdf and .jsonl into documents, reporting what cannot be read."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

SUPPORTED = {".txt", ".md", ".pdf", ".jsonl"}


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
    source: str
    reason: str


def sha(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def _make(source: str, title: str, kind: str, sections: list[Section]) -> Document:
    sections = [s for s in sections if s.text.strip()]
    body = "\n\n".join(s.text for s in sections)
    return Document(doc_id="d_" + sha(source), source=source, title=title.strip(), kind=kind,
                    sections=tuple(sections), content_hash=sha(title + "\n" + body, 32))


def _decode(path: Path, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise ValueError("binary content (NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 (byte {exc.start})") from None


def _markdown_sections(text: str) -> tuple[str | None, list[Section]]:
    sections, heading, buf, title = [], None, [], None
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            if buf:
                sections.append(Section("\n".join(buf).strip(), heading))
            heading, buf = line.lstrip("# ").strip() or None, []
            title = title or heading
            buf.append(line)  # keep the heading in the text: a bare heading is visible as such
        else:
            buf.append(line)
    if buf:
        sections.append(Section("\n".join(buf).strip(), heading))
    return title, sections


def _read_pdf(path: Path) -> tuple[str | None, list[Section]]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(str(path))
        pages = [Section((p.extract_text() or "").strip(), None, i + 1) for i, p in enumerate(reader.pages)]
        title = (reader.metadata or {}).get("/Title") if reader.metadata else None
    except (PdfReadError, ValueError, KeyError, OSError) as exc:
        raise ValueError(f"unparsable PDF ({exc})") from None
    return title, pages


def read_path(path: Path, root: Path, max_bytes: int) -> Iterator[Document | ReadError]:
    """Yield documents of one file; a bad file yields one ReadError and never raises."""
    rel = path.relative_to(root).as_posix() if path != root else path.name
    try:
        size = path.stat().st_size
        if size == 0:
            raise ValueError("empty file")
        if size > max_bytes:
            raise ValueError(f"too large ({size} bytes > max_file_bytes {max_bytes})")
        suffix = path.suffix.lower()
        if suffix == ".pdf":
            title, sections = _read_pdf(path)
            if not any(s.text for s in sections):
                raise ValueError("PDF has no extractable text")
            yield _make(rel, title or path.stem, "pdf", sections)
            return
        text = _decode(path, path.read_bytes())
        if not text.strip():
            raise ValueError("empty file (whitespace only)")
        if suffix == ".jsonl":
            yield from _read_jsonl(rel, text)
        elif suffix == ".md":
            title, sections = _markdown_sections(text)
            yield _make(rel, title or path.stem, "md", sections)
        else:
            yield _make(rel, path.stem.replace("_", " ").title(), "txt", [Section(text.strip())])
    except (ValueError, OSError) as exc:
        yield ReadError(rel, str(exc))


def _read_jsonl(rel: str, text: str) -> Iterator[Document | ReadError]:
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            body, title = str(row["text"]), str(row.get("title") or row.get("id"))
            row_id = str(row.get("id", lineno))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            yield ReadError(f"{rel}:{lineno}", f"bad JSONL row ({exc.__class__.__name__}: {exc})")
            continue
        if body.strip():
            yield _make(f"{rel}#{row_id}", title, "jsonl", [Section(body.strip())])
        else:
            yield ReadError(f"{rel}:{lineno}", "empty text")


def iter_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if not source.exists():
        raise FileNotFoundError(f"source folder {source} does not exist")
    return sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED
                  and not any(part.startswith(".") for part in p.relative_to(source).parts))


def read_source(source: Path, max_bytes: int) -> tuple[list[Document], list[ReadError]]:
    source = source.resolve()
    root = source.parent if source.is_file() else source
    docs: dict[str, Document] = {}
    errors: list[ReadError] = []
    for path in iter_files(source):
        for item in read_path(path, root, max_bytes):
            if isinstance(item, ReadError):
                errors.append(item)
            else:
                docs[item.doc_id] = item
    return list(docs.values()), errors
