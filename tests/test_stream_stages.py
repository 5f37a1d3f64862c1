"""The documents and chunks stages hold a bounded batch of documents in memory, whatever the size of the source,
and give what chunking every document at once gives."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pytest

from lazyhippo.settings import Settings
from lazyhippo.sources.files import doc_id_for, read_source
from lazyhippo.stages import documents as documents_stage
from lazyhippo.stages.chunks import build_chunks, chunk_document
from lazyhippo.stages.documents import ingest_documents
from lazyhippo.stores.warehouse import connect

WORDS = [hashlib.sha256(str(i).encode()).hexdigest()[:7] for i in range(4000)]


def _text(seed: int, chars: int) -> str:
    """Distinct prose-like text: sentences of pseudo-random words."""
    words, i = [], seed
    while sum(len(w) + 1 for w in words) < chars:
        i = (i * 1103515245 + 12345) % 2**31
        words.append(WORDS[i % len(WORDS)] + ("." if i % 11 == 0 else ""))
    return " ".join(words) + "."


def _corpus(folder: Path, files: int, chars: int) -> int:
    folder.mkdir()
    for n in range(files):
        (folder / f"doc{n:03d}.txt").write_text(_text(n, chars))
    return files * chars


def _peak(run) -> int:
    """Peak bytes held in Python objects and Arrow buffers while `run` runs (DuckDB's own memory is capped by
    its memory_limit and is not counted)."""
    arrow_peak = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak + max(0, pa.total_allocated_bytes() - arrow_peak)


@pytest.fixture
def small_batches(monkeypatch, tmp_path):
    """Batches of two 40,000-character documents; the stages run once before, so what a first run loads once
    (modules, the tokenizer) is not counted."""
    monkeypatch.setattr(documents_stage, "BATCH_DOCUMENTS", 4)
    monkeypatch.setattr(documents_stage, "BATCH_CHARS", 80_000)
    _corpus(tmp_path / "warm", 1, 1000)
    settings = Settings(home=tmp_path / "warm_home", source=str(tmp_path / "warm"))
    with connect(settings) as con:
        ingest_documents(settings, con)
        build_chunks(settings, con)


def test_documents_stage_holds_one_batch_of_the_source_at_a_time(tmp_path, small_batches):
    total = _corpus(tmp_path / "src", 48, 40_000)
    settings = Settings(home=tmp_path / "home", source=str(tmp_path / "src"))
    with connect(settings) as con:
        con.execute("SELECT 1").fetchall()  # the warehouse opened before measuring
        result = None

        def run():
            nonlocal result
            result = ingest_documents(settings, con)

        peak = _peak(run)
        assert result.documents == 48 and result.changed == 48
        stored = con.execute("SELECT sum(n_chars) FROM documents").fetchall()[0][0]
    assert stored >= total
    # holding the whole source (its documents, then their rows) takes more than the text; a batch held 0.2 MB
    assert peak < total / 2, f"{peak:,} bytes held while ingesting {total:,} characters"


def test_chunks_stage_chunks_a_batch_at_a_time_and_as_one_pass_would(tmp_path, small_batches):
    _corpus(tmp_path / "src", 48, 40_000)
    settings = Settings(home=tmp_path / "home", source=str(tmp_path / "src"))
    docs = sorted(read_source(tmp_path / "src", settings.max_file_bytes)[0], key=lambda d: d.doc_id)
    expected = [(c.chunk_id, c.doc_id, c.position, c.text, c.n_tokens) for d in docs for c in chunk_document(d)]
    with connect(settings) as con:
        ingest_documents(settings, con)
        batches = list(documents_stage.iter_documents(con, settings.namespace))
        assert [len(b) for b in batches] == [2] * 24  # 80,000 characters per batch
        assert [d.doc_id for b in batches for d in b] == [d.doc_id for d in docs]
        del batches
        result = None

        def run():
            nonlocal result
            result = build_chunks(settings, con)

        peak = _peak(run)
        got = con.execute("SELECT chunk_id, doc_id, position, text, n_tokens FROM chunks ORDER BY doc_id, position").fetchall()
    assert got == expected and result.rechunked_documents == 48
    chunk_chars = sum(len(c[3]) for c in expected)
    # chunking every document at once held about 4.5 times the text of the chunks; a batch held 0.7 MB
    assert peak < chunk_chars / 2, f"{peak:,} bytes held while chunking {chunk_chars:,} characters"


def test_a_document_id_read_twice_keeps_the_last_one_across_batches(tmp_path, monkeypatch):
    """A file named like a JSONL row (`a.jsonl#x.txt`) has that row's id: the file read last wins, as in one pass."""
    monkeypatch.setattr(documents_stage, "BATCH_DOCUMENTS", 1)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"id": "x.txt", "text": "from the row"}\n{"id": "y", "text": "another row"}\n')
    (src / "a.jsonl#x.txt").write_text("from the file")
    settings = Settings(home=tmp_path / "home", source=str(src))
    with connect(settings) as con:
        result = ingest_documents(settings, con)
        rows = dict(con.execute("SELECT doc_id, sections FROM documents").fetchall())
    assert result.documents == 2 and len(rows) == 2
    assert "from the file" in rows[doc_id_for("a.jsonl#x.txt")]
