"""Offline extraction split over worker processes gives exactly what one process gives."""

import json
from pathlib import Path

from lazyhippo.models.extractors import NlpExtractor
from lazyhippo.stages.chunks import Chunk

CORPUS = Path(__file__).resolve().parents[1] / "sample_corpus"


def _chunks(n: int) -> list[Chunk]:
    texts = [p.read_text() for p in sorted(CORPUS.rglob("*.md"))] or ["Ada Lovelace worked with Charles Babbage."]
    return [Chunk(chunk_id=f"c{i}", doc_id=f"d{i}", title=f"Doc {i % 7}", position=0, section=None, page=None,
                  text=texts[i % len(texts)][:1500], content_hash=str(i), n_tokens=0) for i in range(n)]


def test_extraction_over_processes_equals_one_process(monkeypatch):
    chunks = _chunks(NlpExtractor.min_parallel + 10)
    monkeypatch.setenv("LAZYHIPPO_THREADS", "1")
    one = NlpExtractor().extract(chunks)
    monkeypatch.setenv("LAZYHIPPO_THREADS", "2")
    two = NlpExtractor().extract(chunks)
    assert len(two) == len(chunks)
    assert [json.dumps(x.__dict__, sort_keys=True) for x in two] == [json.dumps(x.__dict__, sort_keys=True) for x in one]
    assert sum(len(x.entities) for x in one) > 0


def _processes_in_child(out):
    from lazyhippo.models.extractors import extract_processes

    out.put(extract_processes())


def test_a_child_process_extracts_on_its_own_process(monkeypatch):
    """Steps of the multiprocess executor are child processes: they must not start pools of their own."""
    import multiprocessing

    from lazyhippo.models.extractors import extract_processes

    monkeypatch.delenv("LAZYHIPPO_THREADS", raising=False)
    ctx = multiprocessing.get_context("forkserver")
    out = ctx.Queue()
    p = ctx.Process(target=_processes_in_child, args=(out,))
    p.start()
    p.join(60)
    assert out.get(timeout=5) == 1
    assert extract_processes() >= 1
