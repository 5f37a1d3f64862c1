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
    """An extractor whose submissions, and the cache writes between them, are recorded in order."""

    name, model, prompt_version, batch = "rec", "m", "v1", 256

    def __init__(self, events: list):
        self.events = events

    def submit_json(self, chunks):
        from lazyhippo.models.extractors import Later, encode

        self.events.append(("submit", len(chunks)))
        return Later(lambda: [encode(Extraction(entities=[{"name": c.chunk_id, "type": "X", "description": ""}]))
                              for c in chunks])


def _recording_cache(path, events):
    from lazyhippo.models.extractors import ExtractionCache

    class Cache(ExtractionCache):
        def put_texts(self, items, sources):
            events.append(("cache", len(items)))
            super().put_texts(items, sources)

    return Cache(path)


def test_the_next_batches_are_under_way_while_one_is_cached_and_batches_are_even(tmp_path):
    from lazyhippo.models.extractors import AHEAD, extract_chunks

    events: list = []
    cache = _recording_cache(tmp_path / "c.sqlite", events)
    chunks = _chunks(600)
    run = extract_chunks(chunks, _Recording(events), cache)
    assert AHEAD == 2
    # 3 even batches, not 256, 256 and 88; the third submitted before the first is cached
    assert events == [("submit", 200), ("submit", 200), ("submit", 200), ("cache", 200), ("cache", 200),
                      ("cache", 200)]
    assert sorted(run.results) == sorted(c.chunk_id for c in chunks) and run.computed == 600
    assert extract_chunks(chunks, _Recording(events), cache).cached == 600  # every batch was cached


def test_over_processes_a_batch_is_queued_in_pieces_a_free_worker_takes(monkeypatch):
    """Not one half per worker: a worker that finishes its piece takes the next, so neither waits on the other."""
    from lazyhippo.models.extractors import PIPE_BATCH, Pieces, release_workers

    monkeypatch.setenv("LAZYHIPPO_THREADS", "2")
    chunks = _chunks(NlpExtractor.min_parallel + 10)
    try:
        submitted = NlpExtractor().submit_json(chunks)
        assert isinstance(submitted, Pieces) and len(submitted.futures) == -(-len(chunks) // PIPE_BATCH)
        assert len(submitted.result()) == len(chunks)
    finally:
        release_workers()


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


def test_a_worker_keeps_no_word_of_the_texts_it_extracted():
    """A worker extracts for the whole run: the words its texts add to spaCy's vocabulary are dropped after each
    batch, so its memory stays flat however many new words the corpus brings, and the same text extracts alike
    before and after other texts were extracted."""
    from lazyhippo.models import extractors

    extractor = NlpExtractor()
    nlp = extractors._spacy(extractor.spacy_model, extractor.noun_phrases == "parser")
    items = [("Zorblax Quenterby", f"Zorblax Quenterby met Vindralia Oskwith{i} at Plumtrel Harbour in 1931.", None)
             for i in range(40)]
    strings, first = len(nlp.vocab.strings), extractors._nlp_extract(extractor.spacy_model, extractor.noun_phrases, items)
    assert len(nlp.vocab.strings) == strings
    assert extractors._nlp_extract(extractor.spacy_model, extractor.noun_phrases, items[::-1]) == first[::-1]
    assert any("Zorblax" in x for x in first)
