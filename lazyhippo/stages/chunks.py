"""The `chunks` asset: token-aware chunking, sentences packed into windows of `size` tokens with `overlap`
tokens carried over."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from lazyhippo.models.tokens import encoding, sentences
from lazyhippo.settings import Settings
from lazyhippo.sources.files import Document, sha
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.documents import load_documents
from lazyhippo.stages.results import ChunksResult
from lazyhippo.stores.warehouse import replace_rows, transaction


log = logging.getLogger(__name__)
# a book of about 1,000 pages at the default size; a few kilobytes of PDF can expand to far more ("a a a ...")
MAX_CHUNKS_PER_DOCUMENT = 2000


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


def _windows(sents: list[str], size: int, overlap: int) -> list[str]:
    enc = encoding()
    pieces: list[tuple[str, int]] = []
    for s in sents:
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


def chunk_document(doc: Document, size: int = 256, overlap: int = 32,
                   max_chunks: int = MAX_CHUNKS_PER_DOCUMENT) -> list[Chunk]:
    """Chunk ids derive from (document, position, content), so unchanged input gets the same ids. At most
    `max_chunks`: the rest of a longer document is left out."""
    chunks: list[Chunk] = []
    for section in doc.sections:
        for text in _windows(sentences(section.text), size, overlap):
            if len(chunks) == max_chunks:
                return chunks
            h = sha(text, 32)
            pos = len(chunks)
            chunks.append(Chunk(chunk_id="c_" + sha(f"{doc.doc_id}#{pos}#{h}"), doc_id=doc.doc_id,
                                title=doc.title, position=pos, section=section.heading, page=section.page,
                                text=text, content_hash=h, n_tokens=len(encoding().encode_ordinary(text))))
    return chunks


def build_chunks(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> ChunksResult:
    """Chunk the documents (of `only`, when given) that are new or changed since their chunks were made (recorded
    in stage_inputs); the other documents keep their rows, and chunks of documents gone are dropped."""
    from lazyhippo.stages.incremental import read_inputs, write_inputs

    ns = settings.namespace
    docs = load_documents(con, ns)
    inputs = {d.doc_id: sha(json.dumps([d.source, d.title, d.kind, d.content_hash, [s.__dict__ for s in d.sections],
                                        settings.chunk_size, settings.chunk_overlap]), 32) for d in docs}
    before = read_inputs(con, ns, "chunks")
    chunked = {r[0] for r in con.execute("SELECT DISTINCT doc_id FROM chunks WHERE namespace = ?", [ns]).fetchall()}
    todo = [d for d in docs if (only is None or d.doc_id in only)
            and (before.get(d.doc_id) != inputs[d.doc_id] or d.doc_id not in chunked)]
    per_document = [chunk_document(d, settings.chunk_size, settings.chunk_overlap) for d in todo]
    capped = [d.source for d, cs in zip(todo, per_document) if len(cs) >= MAX_CHUNKS_PER_DOCUMENT]
    if capped:
        log.warning("%d document(s) cut at %d chunks each: %s", len(capped), MAX_CHUNKS_PER_DOCUMENT, ", ".join(capped[:5]))
    chunks = [c for cs in per_document for c in cs]
    table = pa.Table.from_pylist([c.__dict__ for c in chunks]) if chunks else None
    with transaction(con):
        replace_rows(con, "chunks", ns, with_namespace(table, ns) if table else None,
                     "AND (doc_id IN (SELECT unnest(?)) OR doc_id NOT IN (SELECT doc_id FROM documents WHERE namespace = ?))",
                     [[d.doc_id for d in todo], ns])
        write_inputs(con, ns, "chunks", inputs)
    n, total, most = con.execute("SELECT count(*), coalesce(sum(n_tokens), 0), coalesce(max(n_tokens), 0) FROM chunks "
                                 "WHERE namespace = ?", [ns]).fetchall()[0]
    return ChunksResult(chunks=n, tokens_total=int(total), tokens_max=int(most), rechunked_documents=len(todo),
                        capped_documents=len(capped))


def load_chunks(con: duckdb.DuckDBPyConnection, namespace: str) -> list[Chunk]:
    cols = list(Chunk.__dataclass_fields__)
    rows = con.execute(f"SELECT {', '.join(cols)} FROM chunks WHERE namespace = ? ORDER BY doc_id, position",
                       [namespace]).fetchall()
    return [Chunk(*r) for r in rows]
