"""The `chunks` asset: token-aware chunking, sentences packed into windows of `size` tokens with `overlap`
tokens carried over."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from itertools import groupby
from typing import Sequence

import duckdb
import pyarrow as pa

from lazyhippo.models.tokens import encoding, sentences
from lazyhippo.settings import Settings
from lazyhippo.sources.files import MARKUP_KINDS, Document, Section, sha
from lazyhippo.sources.markup import PATH_SEP
from lazyhippo.stages.common import with_namespace
from lazyhippo.stages.documents import iter_documents
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


@dataclass(frozen=True)
class _Piece:
    text: str
    n_tokens: int
    heading: str | None
    new_line: bool  # began a line of a marked-up document: joined with a line break


def _pieces(section: Section, size: int, overlap: int, by_line: bool) -> list[_Piece]:
    """The section's sentences (each line's, for a marked-up document); one longer than a window is cut by tokens."""
    enc = encoding()
    units = ([(s, i == 0) for line in section.text.split("\n") for i, s in enumerate(sentences(line))] if by_line
             else [(s, False) for s in sentences(section.text)])
    out: list[_Piece] = []
    for s, new_line in units:
        toks = enc.encode_ordinary(s)
        if len(toks) + new_line <= size:  # a line break before it is one more token
            out.append(_Piece(s, len(toks) + new_line, section.heading, new_line))
        else:
            step = max(size - overlap, 1)
            out += [_Piece(enc.decode(toks[i:i + size]), len(toks[i:i + size]), section.heading, new_line and i == 0)
                    for i in range(0, len(toks), step)]
    return out


def _windows(parts: list[list[_Piece]], size: int, overlap: int) -> list[list[_Piece]]:
    """Pieces packed into windows of `size` tokens, `overlap` tokens of whole sentences carried over. A part (a
    subsection) that does not fit in what is left of a window starts a new one, carrying nothing over."""
    out: list[list[_Piece]] = []
    cur: list[_Piece] = []
    for part in parts:
        if cur and sum(p.n_tokens for p in cur) + sum(p.n_tokens for p in part) > size:
            out.append(cur)
            cur = []
        for piece in part:
            if cur and sum(p.n_tokens for p in cur) + piece.n_tokens > size:
                out.append(cur)
                keep: list[_Piece] = []
                for p in reversed(cur):  # carry whole trailing sentences up to `overlap` tokens
                    if sum(k.n_tokens for k in keep) + p.n_tokens > overlap:
                        break
                    keep.insert(0, p)
                cur = keep
            cur.append(piece)
    if cur:
        out.append(cur)
    return out


def _join(pieces: list[_Piece], by_line: bool) -> str:
    """Sentences join with a space; headings and label lines keep their own line (every line of a marked-up
    document does)."""
    text = ""
    for p in pieces:
        s = p.text
        if text:
            own_line = p.new_line if by_line else (s.lstrip().startswith("#") or s.endswith(("____", ":"))
                                                   or text.rstrip().split("\n")[-1].lstrip().startswith("#"))
            text += "\n" if own_line else " "
        text += s
    return text


def _common_heading(pieces: list[_Piece]) -> str | None:
    """The heading path shared by the pieces of a window: a window over several subsections is in their section."""
    paths = [p.heading.split(PATH_SEP) for p in pieces if p.heading]
    if not paths:
        return None
    common = paths[0]
    for path in paths[1:]:
        n = 0
        while n < min(len(common), len(path)) and common[n] == path[n]:
            n += 1
        common = common[:n]
    return PATH_SEP.join(common) or pieces[0].heading


def _top_level(section: Section) -> tuple[int | None, str | None]:
    return section.page, section.heading.split(PATH_SEP)[0] if section.heading else None


def chunk_document(doc: Document, size: int = 256, overlap: int = 32,
                   max_chunks: int = MAX_CHUNKS_PER_DOCUMENT) -> list[Chunk]:
    """Chunks never cross a top-level section (nor a page): one that fits is one chunk, a longer one is cut
    between its subsections where they fit and in them by sentences. A chunk's section is the heading path its
    text is under. Chunk ids derive from (document, position, content), so unchanged input gets the same ids.
    At most `max_chunks`: the rest of a longer document is left out."""
    by_line = doc.kind in MARKUP_KINDS
    chunks: list[Chunk] = []
    for (page, _), group in groupby(doc.sections, key=_top_level):
        for window in _windows([_pieces(s, size, overlap, by_line) for s in group], size, overlap):
            if len(chunks) == max_chunks:
                return chunks
            text = _join(window, by_line)
            h = sha(text, 32)
            pos = len(chunks)
            chunks.append(Chunk(chunk_id="c_" + sha(f"{doc.doc_id}#{pos}#{h}"), doc_id=doc.doc_id,
                                title=doc.title, position=pos, section=_common_heading(window), page=page,
                                text=text, content_hash=h, n_tokens=len(encoding().encode_ordinary(text))))
    return chunks


def build_chunks(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> ChunksResult:
    """Chunk the documents (of `only`, when given) that are new or changed since their chunks were made (recorded
    in stage_inputs); the other documents keep their rows, and chunks of documents gone are dropped. Documents
    are read and their chunks written a batch at a time, in one transaction."""
    from lazyhippo.stages.incremental import write_inputs

    ns = settings.namespace
    inputs: list[pa.Table] = []
    rechunked, capped = 0, []
    with transaction(con):
        for docs in iter_documents(con, ns):
            fingerprints, todo = _chunk_batch(settings, con, docs, only)
            inputs.append(fingerprints)
            rechunked += len(todo)
            capped += [source for source, n in todo if n >= MAX_CHUNKS_PER_DOCUMENT]
        con.execute("DELETE FROM chunks WHERE namespace = ? AND doc_id NOT IN (SELECT doc_id FROM documents WHERE namespace = ?)",
                    [ns, ns])
        write_inputs(con, ns, "chunks", pa.concat_tables(inputs) if inputs else {})
    if capped:
        log.warning("%d document(s) cut at %d chunks each: %s", len(capped), MAX_CHUNKS_PER_DOCUMENT, ", ".join(capped[:5]))
    n, total, most = con.execute("SELECT count(*), coalesce(sum(n_tokens), 0), coalesce(max(n_tokens), 0) FROM chunks "
                                 "WHERE namespace = ?", [ns]).fetchall()[0]
    return ChunksResult(chunks=n, tokens_total=int(total), tokens_max=int(most), rechunked_documents=rechunked,
                        capped_documents=len(capped))


def _chunk_batch(settings: Settings, con: duckdb.DuckDBPyConnection, docs: list[Document],
                 only: frozenset[str] | None) -> tuple[pa.Table, list[tuple[str, int]]]:
    """Rechunk the documents of a batch (consecutive ids) whose inputs changed since their chunks were made; the
    batch's input fingerprints, and (source, number of chunks) of each document chunked."""
    from lazyhippo.stages.incremental import fingerprint

    ns = settings.namespace
    inputs = {d.doc_id: sha(json.dumps([d.source, d.title, d.kind, d.content_hash, [s.__dict__ for s in d.sections],
                                        settings.chunk_size, settings.chunk_overlap]), 32) for d in docs}
    span = [ns, docs[0].doc_id, docs[-1].doc_id]
    before = dict(con.execute("SELECT item_id, fingerprint FROM stage_inputs WHERE namespace = ? AND stage = 'chunks' "
                              "AND item_id BETWEEN ? AND ?", span).fetchall())
    chunked = {r[0] for r in con.execute("SELECT DISTINCT doc_id FROM chunks WHERE namespace = ? AND doc_id BETWEEN ? AND ?",
                                         span).fetchall()}
    todo = [d for d in docs if (only is None or d.doc_id in only)
            and (before.get(d.doc_id) != fingerprint(inputs[d.doc_id]) or d.doc_id not in chunked)]
    per_document = [chunk_document(d, settings.chunk_size, settings.chunk_overlap) for d in todo]
    if todo:
        rows = [c.__dict__ for cs in per_document for c in cs]
        replace_rows(con, "chunks", ns, with_namespace(pa.Table.from_pylist(rows), ns) if rows else None,
                     "AND doc_id IN (SELECT unnest(?))", [[d.doc_id for d in todo]])
    fingerprints = pa.table({"item_id": pa.array(list(inputs), pa.string()),
                             "fingerprint": pa.array(list(inputs.values()), pa.string())})
    return fingerprints, [(d.source, len(cs)) for d, cs in zip(todo, per_document)]


def load_chunks(con: duckdb.DuckDBPyConnection, namespace: str, doc_ids: Sequence[str] | None = None) -> list[Chunk]:
    """The namespace's chunks (of `doc_ids` only, when given) by document and position."""
    cols = list(Chunk.__dataclass_fields__)
    where, params = ("AND doc_id IN (SELECT unnest(?))", [list(doc_ids)]) if doc_ids is not None else ("", [])
    rows = con.execute(f"SELECT {', '.join(cols)} FROM chunks WHERE namespace = ? {where} ORDER BY doc_id, position",
                       [namespace, *params]).fetchall()
    return [Chunk(*r) for r in rows]
