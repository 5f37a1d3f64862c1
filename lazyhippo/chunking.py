"""Token-aware chunking: sentences packed into windows of `size` tokens with `overlap` tokens carried over."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .documents import Document, sha
from .tokens import encoding

_SENT = re.compile(r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\b[A-Z]\.)(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    title: str
    position: int
    section: str | None
    page: int | None
    text: str
    content_hash: str
    n_tokens: int


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text) if s and s.strip()]


def _windows(sentences: list[str], size: int, overlap: int) -> list[str]:
    enc = encoding()
    pieces: list[tuple[str, int]] = []
    for s in sentences:
        toks = enc.encode_ordinary(s)
        if len(toks) <= size:
            pieces.append((s, len(toks)))
        else:  # a sentence longer than a window is cut by tokens
            step = max(size - overlap, 1)
            pieces += [(enc.decode(toks[i:i + size]), len(toks[i:i + size])) for i in range(0, len(toks), step)]
    out: list[str] = []
    cur: list[tuple[str, int]] = []
    for piece in pieces:
        if cur and sum(n for _, n in cur) + piece[1] > size:
            out.append(_join(cur))
            keep: list[tuple[str, int]] = []
            for s, n in reversed(cur):  # carry whole trailing sentences up to `overlap` tokens
                if sum(k for _, k in keep) + n > overlap:
                    break
                keep.insert(0, (s, n))
            cur = keep
        cur.append(piece)
    if cur:
        out.append(_join(cur))
    return out


def _join(pieces: list[tuple[str, int]]) -> str:
    """Sentences join with a space; headings and label lines keep their own line."""
    text = ""
    for s, _ in pieces:
        if text:
            own_line = s.lstrip().startswith("#") or text.rstrip().split("\n")[-1].lstrip().startswith("#") or s.endswith(("____", ":"))
            text += "\n" if own_line else " "
        text += s
    return text


def chunk_document(doc: Document, size: int = 256, overlap: int = 32) -> list[Chunk]:
    """Chunk ids derive from (document, position, content), so unchanged input gets the same ids."""
    chunks: list[Chunk] = []
    for section in doc.sections:
        for text in _windows(split_sentences(section.text), size, overlap):
            h = sha(text, 32)
            pos = len(chunks)
            chunks.append(Chunk(chunk_id="c_" + sha(f"{doc.doc_id}#{pos}#{h}"), doc_id=doc.doc_id,
                                title=doc.title, position=pos, section=section.heading, page=section.page,
                                text=text, content_hash=h, n_tokens=len(encoding().encode_ordinary(text))))
    return chunks
