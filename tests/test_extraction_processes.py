"""Offline extraction split over worker processes gives exactly what one process gives."""

import json
from pathlib import Path

from lazyhippo.models.extractors import Extraction, NlpExtractor
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


class _Recording:
    """An extractor whose calls and the cache writes between them are recorded in order."""

    name, model, prompt_version, batch, prefetch = "rec", "m", "v1", 256, True

    def __init__(self, events: list):
        self.events = events

    def extract(self, chunks):
        import time

        self.events.append(("extract", len(chunks)))
        time.sleep(0.2)
        return [Extraction(entities=[{"name": c.chunk_id, "type": "X", "description": ""}]) for c in chunks]


def test_the_next_batch_is_extracted_while_one_is_cached_and_batches_are_even(tmp_path):
    from lazyhippo.models.extractors import ExtractionCache, extract_chunks

    events: list = []

    class Cache(ExtractionCache):
        def put_texts(self, items, sources):
            import time

            time.sleep(0.1)  # a slow write: the next batch has started meanwhile
            events.append(("cache", len(items)))
            super().put_texts(items, sources)

    cache = Cache(tmp_path / "c.sqlite")
    chunks = _chunks(300)
    run = extract_chunks(chunks, _Recording(events), cache)
    assert [e for e in events if e[0] == "extract"] == [("extract", 150), ("extract", 150)]  # not 256 and 44
    assert events[:3] == [("extract", 150), ("extract", 150), ("cache", 150)], "the second batch waited for the first's cache write"
    assert sorted(run.results) == sorted(c.chunk_id for c in chunks) and run.computed == 300
    assert extract_chunks(chunks, _Recording(events), cache).cached == 300  # every batch was cached


def _pid() -> int:
    import os

    return os.getpid()


def test_release_workers_stops_the_extraction_processes():
    """The stages after extraction get the workers' memory back: release_workers ends the pool's processes, and
    the next extraction starts a new pool."""
    import os

    from lazyhippo.models import extractors

    pool = extractors._pool(2)
    pids = {pool.submit(_pid).result(timeout=60) for _ in range(4)}
    assert pids and os.getpid() not in pids
    extractors.release_workers()
    assert not extractors._POOL

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    assert not any(alive(p) for p in pids)
    assert extractors._pool(2) is not pool
    extractors.release_workers()
