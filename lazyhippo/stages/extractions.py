"""The `extractions` asset: entities, relations and facts per chunk, cached. On many workers, per-document
parts live in shared storage (the object store), not in one warehouse.

`plan_batches` (where the warehouse lives) splits the documents whose extraction is out of date into at most
a fixed number of batches, even in chunks, each written as objects of about BATCH_CHUNKS chunks; `extract_batch`
(on any worker) works through its batch one object at a time, writing one Parquet part per document and, per
object, one bundle of those parts; `collect_parts` (where the warehouse lives) loads the bundles into the
extracted_* tables and deletes them. A run costs Dagster the same few steps (and events) for any corpus, and no
step holds more than one object's chunks and parts at a time. Workers share nothing but the object store. A part
carries the signature of its chunks and extractor, so a run killed mid-way and started again re-extracts only the
documents without a part.
"""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import chain, groupby
from typing import NamedTuple, Sequence

import duckdb
import polars as pl
import pyarrow as pa

from lazyhippo.models.extractors import (
    ExtractionCache,
    Extractor,
    LlmExtractor,
    NlpExtractor,
    PendingRun,
    extract_chunks,
    release_workers,
)
from lazyhippo.settings import Settings
from lazyhippo.sources.files import sha
from lazyhippo.stages.chunks import Chunk, load_chunks
from lazyhippo.stages.common import Progress, give_back_memory, record_usage, resolve_llm
from lazyhippo.stages.results import ExtractionsResult
from lazyhippo.stores.objects import ObjectStore
from lazyhippo.stores.warehouse import DESCRIPTION_HEAD, replace_rows, transaction

RETRY = "retry:"
STORED_PARTS = "stored_parts"  # batch object metadata: its documents that held a part when it was planned
# a chunk's extraction (or failure) with the chunk's text: the load places each fact's text in it (schema.sql)
PART_SCHEMA = {"chunk_id": pl.String, "extraction": pl.String, "failure": pl.String, "source": pl.String}
# a bundle: the parts of one object's documents as one table, so collecting decodes and inserts them in bulk
BUNDLE_SCHEMA = {"doc_id": pl.String, "signature": pl.String, **PART_SCHEMA}
IO_THREADS = 8  # object-store calls at a time: each waits on the disk or the network, not on a core


BATCHES = 12  # most batch steps a run fans out to: even work for 1, 2, 3, 4 or 6 workers
# chunks of one object of a batch: a step extracts and holds one object at a time, and a batch holds at least
# one (a run with fewer chunks makes fewer batches: a step's start-up, the model's load among it, is worth it)
BATCH_CHUNKS = 400


@dataclass(frozen=True)
class Batch:
    keys: tuple[str, ...]     # object keys of the batch's chunks, whole documents of about BATCH_CHUNKS each
    name: str                 # short name, usable as a Dagster mapping key
    doc_ids: tuple[str, ...]


def _extractor(settings: Settings) -> Extractor:
    return make_extractor(settings, resolve_llm(settings) if settings.extractor == "llm" else None)


def part_key(namespace: str, doc_id: str) -> str:
    return f"{namespace}/parts/extractions/{doc_id}.parquet"


def signature(chunks: Sequence[Chunk | ChunkKey], extractor: Extractor) -> str:
    return sha("|".join(sorted(ExtractionCache.key(c, extractor) for c in chunks)), 24)


class ChunkKey(NamedTuple):
    """What a chunk's extraction depends on (ExtractionCache.key reads these), without its text."""
    chunk_id: str
    title: str
    section: str | None
    content_hash: str


@dataclass(frozen=True)
class DocChunks:
    signature: str                # of the document's chunks and the extractor
    chunk_ids: tuple[str, ...]    # by position


KEY_ROWS = 10_000  # chunk rows read at a time for the signatures


def documents_chunks(con: duckdb.DuckDBPyConnection, ns: str, extractor: Extractor) -> dict[str, DocChunks]:
    """Per document (in doc_id order): its chunks' signature and ids, read KEY_ROWS rows at a time without the
    texts, so planning and collecting hold ids and hashes for the corpus, never its text."""
    cur = con.execute("SELECT doc_id, chunk_id, title, section, content_hash FROM chunks WHERE namespace = ? "
                      "ORDER BY doc_id, position", [ns])
    rows = chain.from_iterable(iter(lambda: cur.fetchmany(KEY_ROWS), []))
    out = {}
    for doc_id, group in groupby(rows, key=lambda r: r[0]):
        keys = [ChunkKey(*r[1:]) for r in group]
        out[doc_id] = DocChunks(signature(keys, extractor), tuple(k.chunk_id for k in keys))
    return out


def _parquet(frame: pl.DataFrame, metadata: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    frame.write_parquet(buf, compression="zstd", metadata=metadata)
    return buf.getvalue()


def plan_batches(settings: Settings, con: duckdb.DuckDBPyConnection, objects: ObjectStore, run_id: str,
                 batches: int = BATCHES, batch_chunks: int = BATCH_CHUNKS, extractor: Extractor | None = None,
                 only: frozenset[str] | None = None) -> tuple[list[Batch], dict]:
    """At most `batches` batches, even in chunks, of the documents (of `only`, when given) whose held extraction
    is missing or stale; each batch is written as objects of about `batch_chunks` chunks, at least one."""
    ns = settings.namespace
    extractor = extractor or _extractor(settings)
    docs = documents_chunks(con, ns, extractor)
    held = dict(con.execute("SELECT doc_id, signature FROM extraction_parts WHERE namespace = ?", [ns]).fetchall())
    todo = [d for d in sorted(docs) if (only is None or d in only) and held.get(d) != docs[d].signature]
    prefix = part_key(ns, "")[:-len(".parquet")]
    stored = {k[len(prefix):-len(".parquet")] for k in objects.list(prefix)} if todo else set()
    total = sum(len(docs[d].chunk_ids) for d in todo)
    n = max(1, min(batches, total // batch_chunks))
    groups: list[list[str]] = [[] for _ in range(n)]
    seen = 0
    for doc_id in todo:  # where a document starts in the run's chunks decides its batch: even to one document
        groups[seen * n // total].append(doc_id)
        seen += len(docs[doc_id].chunk_ids)
    planned = []
    for group in filter(None, groups):
        name = f"b{len(planned):05d}"
        keys, current, size = [], [], 0
        for doc_id in group:
            current.append(doc_id)
            size += len(docs[doc_id].chunk_ids)
            if size >= batch_chunks or doc_id == group[-1]:
                key = f"{ns}/work/{run_id}/{name}-{len(keys):05d}.parquet"
                # the types from every row: a section or page may first appear after the first hundred chunks
                # with the documents that hold a part (a run that died after extracting them): only those are read
                frame = pl.DataFrame(load_chunks(con, ns, current), infer_schema_length=None)
                objects.put(key, _parquet(frame, {STORED_PARTS: json.dumps([d for d in current if d in stored])}))
                keys.append(key)
                current, size = [], 0
        planned.append(Batch(tuple(keys), name, tuple(group)))
    return planned, {"documents": len(docs), "documents_to_extract": len(todo), "batches": len(planned),
                     "documents_unchanged": len(docs) - len(todo)}


def _decode_part(data: bytes, doc_id: str) -> pl.DataFrame | None:
    """A document's part as bundle rows (BUNDLE_SCHEMA), or None when it cannot be read."""
    try:
        frame = pl.read_parquet(data, columns=list(PART_SCHEMA))
        sig = pl.read_parquet_metadata(data).get("signature", "")
    except Exception:  # noqa: BLE001 - a torn part is simply extracted again
        return None
    return frame.select(pl.lit(doc_id).alias("doc_id"), pl.lit(sig).alias("signature"), *PART_SCHEMA)


def _get(objects: ObjectStore, key: str) -> bytes | None:
    try:
        return objects.get(key)
    except Exception:  # noqa: BLE001 - a missing part is simply extracted again
        return None


def _bundle_key(key: str) -> str:
    return key.removesuffix(".parquet") + ".parts.parquet"


def _read_bundle(objects: ObjectStore, key: str) -> dict[str, pl.DataFrame]:
    """A bundle's rows by document; a bundle of another layout (a step output of another version) holds none,
    so its documents' parts are read one by one."""
    data = _get(objects, key)
    frame = pl.read_parquet(data) if data else None
    if frame is None or list(frame.schema) != list(BUNDLE_SCHEMA):
        return {}
    return {doc_id: rows for (doc_id,), rows in frame.partition_by("doc_id", as_dict=True, maintain_order=True).items()}


def _each(call, items) -> None:
    """`call` on every item, IO_THREADS at a time: one by one, 10,000 deletes of small files took 35 s here."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(IO_THREADS) as pool:
        for _ in pool.map(call, items):
            pass


def extract_batch(settings: Settings, objects: ObjectStore, keys: Sequence[str],
                  extractor: Extractor | None = None) -> dict:
    """Extract one batch, one object of chunks (`keys`) at a time, and write one part per document; a part
    already holding this signature is kept. Each object's parts also go out together as one bundle
    (`bundles`: [bundle key, its doc_ids]), so the collecting step reads a few objects instead of one per
    document (reading 6k parts one by one was 19 s of a 2Wiki run) and holds one at a time. The next object is
    begun (read, and its extraction submitted) before this one's parts are written: the workers go on meanwhile."""
    extractor = extractor or _extractor(settings)
    llm = getattr(extractor, "llm", None)
    before = llm.meter.snapshot() if llm is not None else {}
    totals: Counter = Counter()
    bundles = []
    cache = ExtractionCache(settings.cache_dir / "extractions.sqlite")  # a local accelerator; parts are shared
    try:
        begun = None
        for key in [*keys, None]:
            following = _begin_object(settings, objects, key, extractor, cache) if key is not None else None
            if begun is not None:
                try:
                    figures, bundle = _finish_object(settings, objects, begun)
                except BaseException:
                    if following is not None:  # its work, queued at the workers, is dropped
                        following.run.cancel()
                    raise
                totals.update(figures)
                objects.put(_bundle_key(begun.key), _parquet(bundle))
                bundles.append([_bundle_key(begun.key), bundle["doc_id"].unique(maintain_order=True).to_list()])
            begun = following
    finally:
        cache.close()
    usage = llm.meter.since(before) if llm is not None else []  # recorded by collect_parts, with the warehouse
    return {**{k: totals[k] for k in ("documents", "parts_kept", "chunks", "cached", "computed", "failed")},
            "llm_usage": usage, "bundles": bundles}


@dataclass
class _Begun:
    """One object of a batch whose extraction is under way."""
    key: str
    extractor: Extractor
    by_doc: dict[str, list[Chunk]]  # its chunks by document, in order
    todo: list[Chunk]               # those of the documents without a part of this signature
    kept: list[pl.DataFrame]        # those documents' bundle rows
    run: PendingRun


def _begin_object(settings: Settings, objects: ObjectStore, key: str, extractor: Extractor,
                  cache: ExtractionCache) -> _Begun:
    """One object of a batch read, its documents' parts of this signature kept and the rest submitted."""
    data = objects.get(key)
    chunks = [Chunk(**r) for r in pl.read_parquet(data).iter_rows(named=True)]
    listed = pl.read_parquet_metadata(data).get(STORED_PARTS)
    stored = set(json.loads(listed)) if listed is not None else None
    by_doc: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        by_doc[c.doc_id].append(c)
    todo, kept = [], []
    for doc_id, doc_chunks in by_doc.items():
        part = _get(objects, part_key(settings.namespace, doc_id)) if stored is None or doc_id in stored else None
        held = _decode_part(part, doc_id) if part else None
        if held is not None and held["signature"][0] == signature(doc_chunks, extractor):
            kept.append(held)
        else:
            todo += doc_chunks
    return _Begun(key, extractor, by_doc, todo, kept, PendingRun(todo, extractor, cache))


def _finish_object(settings: Settings, objects: ObjectStore, begun: _Begun) -> tuple[dict, pl.DataFrame]:
    """A begun object's figures and its documents' bundle rows (BUNDLE_SCHEMA); each document's part is written
    to the object store as well."""
    ns, by_doc, todo, extractor = settings.namespace, begun.by_doc, begun.todo, begun.extractor
    run = begun.run.finish()
    frames = list(begun.kept)
    written = []
    for doc_id in {c.doc_id: None for c in todo}:
        rows = {"chunk_id": [c.chunk_id for c in by_doc[doc_id]],
                "extraction": [run.results.get(c.chunk_id) for c in by_doc[doc_id]],
                "failure": [run.failures.get(c.chunk_id) for c in by_doc[doc_id]],
                "source": [c.text for c in by_doc[doc_id]]}
        sig = signature(by_doc[doc_id], extractor)
        failed = any(rows["failure"])  # held as such, but planned again next run: failures are retried
        sig = RETRY + sig if failed else sig
        frame = pl.DataFrame(rows, PART_SCHEMA)
        written.append((part_key(ns, doc_id), _parquet(frame, {"signature": sig})))
        frames.append(frame.select(pl.lit(doc_id).alias("doc_id"), pl.lit(sig).alias("signature"), *PART_SCHEMA))
    _each(lambda item: objects.put(*item), written)
    bundle = pl.concat(frames) if frames else pl.DataFrame(schema=BUNDLE_SCHEMA)
    return {"documents": len(by_doc), "parts_kept": len(begun.kept), "chunks": sum(map(len, by_doc.values())),
            "cached": run.cached, "computed": run.computed, "failed": len(run.failures)}, bundle


def collect_parts(settings: Settings, con: duckdb.DuckDBPyConnection, objects: ObjectStore, batches: list[Batch],
                  stats: list[dict], run_id: str | None = None) -> dict:
    """Load the parts of the batches' documents into the warehouse (those the batch results carry, else from the
    object store), then drop them and the parts of documents that are gone: once loaded, the warehouse's rows and
    `extraction_parts` signatures stand for them (a part only spares a killed run the extraction it finished)."""
    ns = settings.namespace
    release_workers()  # every batch has run: the graph stages after this need the workers' memory
    extractor = _extractor(settings)
    by_doc = documents_chunks(con, ns, extractor)
    located = {d: key for s in stats if s for key, doc_ids in s.get("bundles", ()) for d in doc_ids}
    # a bundle's documents side by side, so each bundle is read once; a document in none is read alone
    docs = sorted({d for b in batches for d in b.doc_ids if d in by_doc}, key=lambda d: (located.get(d, ""), d))
    held = []
    written: Counter = Counter()
    pending: list[pl.DataFrame] = []  # documents' rows of about STORE_BATCH chunks: inserted together
    size = 0
    bundle_key, bundle = None, {}
    with transaction(con):
        _clear_extractions(con, ns, [c for d in docs for c in by_doc[d].chunk_ids])
        for doc_id in docs:
            if located.get(doc_id, bundle_key) != bundle_key:
                bundle_key, bundle = located[doc_id], _read_bundle(objects, located[doc_id])
            rows = bundle.pop(doc_id, None)
            if rows is None:
                data = _get(objects, part_key(ns, doc_id))
                rows = _decode_part(data, doc_id) if data else None
            sig = rows["signature"][0] if rows is not None and len(rows) else None
            if sig is None or sig.removeprefix(RETRY) != by_doc[doc_id].signature:
                raise RuntimeError(f"extraction part of document {doc_id} is missing or stale in {objects.uri}: "
                                   "a batch step failed; run the index again (finished parts are kept)")
            held.append((ns, doc_id, sig))
            pending.append(rows)
            size += len(rows)
            if size >= STORE_BATCH or doc_id == docs[-1]:
                written.update(_insert_parts(con, ns, pl.concat(pending)))
                pending, size = [], 0
        _drop_orphan_extractions(con, ns)
        gone = [r[0] for r in con.execute("SELECT doc_id FROM extraction_parts WHERE namespace = ? AND doc_id NOT IN "
                                          "(SELECT doc_id FROM chunks WHERE namespace = ?)", [ns, ns]).fetchall()]
        con.execute("DELETE FROM extraction_parts WHERE namespace = ? AND doc_id IN (SELECT unnest(?))",
                    [ns, gone + [d for _, d, _ in held]])
        if held:
            con.executemany("INSERT INTO extraction_parts VALUES (?, ?, ?)", held)
    # a loaded part is never read again (the warehouse holds its rows): this run's, and those homes written before
    # kept; a part of a document never loaded (a killed run's) stays for the next run
    prefix = part_key(ns, "")[:-len(".parquet")]
    loaded = {r[0] for r in con.execute("SELECT doc_id FROM extraction_parts WHERE namespace = ?", [ns]).fetchall()}
    stored = {k[len(prefix):-len(".parquet")] for k in objects.list(prefix)}
    _each(objects.delete, [part_key(ns, doc_id) for doc_id in sorted(stored & (loaded | set(gone)))]
          + [k for b in batches for k in b.keys] + [k for s in stats if s for k, _ in s.get("bundles", ())])
    totals = Counter()
    for s in stats:
        totals.update({k: v for k, v in s.items() if isinstance(v, int)})
    for s in stats:  # the batches' token usage, one token_usage row per operation
        for u in s.get("llm_usage", []):
            con.execute("INSERT INTO token_usage (namespace, run_id, stage, model, prompt_tokens, completion_tokens) "
                        "VALUES (?, ?, ?, ?, ?, ?)", [ns, run_id, u["operation"], u["model"], u["prompt_tokens"],
                                                      u["completion_tokens"]])
    give_back_memory()
    n_chunks = sum(len(v.chunk_ids) for v in by_doc.values())
    # cached: chunks whose held extraction was reused, from a part, the local cache, or the warehouse itself
    return {"documents_extracted": len(held), "documents_removed": len(gone), "chunks": n_chunks,
            "cached": n_chunks - totals["computed"] - totals["failed"], "computed": totals["computed"], "failed": totals["failed"],
            "parts_kept": totals["parts_kept"], "extractor": f"{extractor.name}:{extractor.model}", **_figures(written)}


def make_extractor(settings: Settings, llm=None):
    if settings.extractor == "nlp":
        return NlpExtractor(noun_phrases=settings.nlp_noun_phrases)
    if settings.extractor == "llm":
        if llm is None:
            raise ValueError("extractor 'llm' needs an LLM endpoint: set OPENAI_BASE_URL (and OPENAI_API_KEY) or "
                             "LAZYHIPPO_LLM=openai, or use --extractor nlp")
        return LlmExtractor(llm)
    raise ValueError(f"unknown extractor {settings.extractor!r} (expected 'nlp' or 'llm')")


EXTRACTION_SCHEMAS = {
    "extracted_entities": pa.schema([("chunk_id", pa.string()), ("name", pa.string()), ("type", pa.string()),
                                     ("description", pa.string()), ("fact_idx", pa.int32()), ("name_pos", pa.int32())]),
    "extracted_relations": pa.schema([("chunk_id", pa.string()), ("source", pa.string()), ("target", pa.string()),
                                      ("description", pa.string()), ("weight", pa.float64()),
                                      ("type", pa.string()), ("fact_idx", pa.int32()), ("source_pos", pa.int32()),
                                      ("target_pos", pa.int32())]),
    "extracted_facts": pa.schema([("chunk_id", pa.string()), ("fact_idx", pa.int32()), ("span_start", pa.int32()),
                                  ("span_length", pa.int32()), ("text", pa.string()),
                                  ("names", pa.list_(pa.string()))]),
    "extraction_failures": pa.schema([("chunk_id", pa.string()), ("reason", pa.string())]),
}


STORE_BATCH = 500  # chunks whose rows are inserted at a time: the rows never all sit in memory at once

# per table: the list of an extraction's JSON its rows come from, that list's structure (DuckDB's JSON structure
# notation) and the table's columns from it (`e` is one element, `i` its position, `j` the index of the first of
# the chunk's facts whose start is e's description, if any: the description is stored as that reference; `names`
# that fact's names: a name among them is stored as its place there)
_NAME, _SOURCE, _TARGET = (f"list_position(names, e.{c})" for c in ("name", "source", "target"))
_FROM_JSON = {
    "extracted_entities": ("entities", '[{"name": "VARCHAR", "type": "VARCHAR", "description": "VARCHAR"}]',
                           f"CASE WHEN {_NAME} IS NULL THEN e.name END, e.type, "
                           f"CASE WHEN j IS NULL THEN e.description END, j, {_NAME}"),
    "extracted_relations": ("relations", '[{"source": "VARCHAR", "target": "VARCHAR", "description": "VARCHAR", '
                                         '"weight": "DOUBLE", "type": "VARCHAR"}]',
                            f"CASE WHEN {_SOURCE} IS NULL THEN e.source END, "
                            f"CASE WHEN {_TARGET} IS NULL THEN e.target END, "
                            f"CASE WHEN j IS NULL THEN e.description END, e.weight, e.type, j, {_SOURCE}, {_TARGET}"),
    "extracted_facts": ("facts", '[{"text": "VARCHAR", "names": ["VARCHAR"]}]',
                        "i, CASE WHEN found > 0 THEN found - 1 END, CASE WHEN found > 0 THEN length(e.text) END, "
                        "CASE WHEN found > 0 THEN NULL ELSE e.text END, e.names"),
}
# the starts of a chunk's facts, as warehouse.described reads a reference back
_HEADS = f"list_transform(p.facts, lambda f: left(f.text, {DESCRIPTION_HEAD}))"


def _insert_parts(con: duckdb.DuckDBPyConnection, ns: str, rows: pl.DataFrame) -> Counter:
    """Append the extracted_* and extraction_failures rows of bundle rows (chunk_id, extraction JSON, failure,
    the chunk's text): DuckDB parses the JSON and unnests its lists, in the order of the rows and of each list; no
    Python object per entity or relation (building them took most of the collecting step). A description that
    starts one of the chunk's facts is stored as that fact's index, a name in that fact's names as its place, a
    fact's text as its place in the chunk's text (schema.sql): the rows carry that text, so nothing is looked up."""
    table = rows.select(*PART_SCHEMA).with_row_index("row").to_arrow()
    written: Counter = Counter()

    def insert(name: str, sql: str) -> None:
        # a fresh reader per statement: DuckDB holds a registered Arrow table until the transaction commits
        con.register("_incoming", pa.RecordBatchReader.from_batches(table.schema, iter(table.to_batches())))
        try:
            written[name] += con.execute(sql, [ns]).fetchall()[0][0]
        finally:
            con.unregister("_incoming")

    for name, (key, structure, columns) in _FROM_JSON.items():
        target = ", ".join(EXTRACTION_SCHEMAS[name].names)
        refers = key != "facts"  # its descriptions may be references to the chunk's facts, its names places
        shape = f'{{"{key}": {structure}' + (', "facts": [{"text": "VARCHAR", "names": ["VARCHAR"]}]'
                                              if refers else "") + "}"
        match = ("CASE WHEN e.description IS NOT NULL THEN list_position(heads, e.description) - 1 END"
                 if refers else "NULL")
        place = "NULL" if refers else "strpos(source, e.text)"  # 1-based, in characters; 0: not in the chunk
        insert(name, f"INSERT INTO {name} (namespace, {target}) SELECT ?, chunk_id, {columns} FROM ("
                     f"SELECT row, chunk_id, i, e, j, {'names_of[j + 1]' if refers else 'NULL'} AS names, "
                     f"{place} AS found FROM ("
                     f"SELECT row, chunk_id, source, i, e, ({match})::INTEGER AS j, names_of FROM ("
                     "SELECT row, chunk_id, source, unnest(range(len(x)))::INTEGER AS i, unnest(x) AS e, heads, "
                     "names_of FROM ("
                     f"SELECT row, chunk_id, source, p.{key} AS x, {_HEADS if refers else 'NULL'} AS heads, "
                     f"{'list_transform(p.facts, lambda f: f.names)' if refers else 'NULL'} AS names_of FROM ("
                     f"SELECT row, chunk_id, source, from_json(extraction, '{shape}') AS p "
                     "FROM _incoming WHERE extraction IS NOT NULL))))) ORDER BY row, i")
    insert("extraction_failures", "INSERT INTO extraction_failures (namespace, chunk_id, reason) "
                                  "SELECT ?, chunk_id, failure FROM _incoming WHERE extraction IS NULL ORDER BY row")
    return written


def _clear_extractions(con: duckdb.DuckDBPyConnection, ns: str, scope: list[str] | None) -> None:
    """Delete the extracted_* rows of the chunks in `scope` (of the namespace, when None)."""
    where, params = ("AND chunk_id IN (SELECT unnest(?))", [scope]) if scope is not None else ("", [])
    for table in EXTRACTION_SCHEMAS:
        replace_rows(con, table, ns, None, where, params)


def _insert_extractions(con: duckdb.DuckDBPyConnection, ns: str, results: dict[str, str],
                        failures: dict[str, str], sources: dict[str, str]) -> Counter:
    """Append the extracted_* rows of `results` (chunk_id -> the extraction's JSON) and `failures`, STORE_BATCH
    chunks at a time; `sources`: chunk_id -> the chunk's text."""
    written: Counter = Counter()
    items = [(cid, text, None, sources.get(cid)) for cid, text in results.items()]
    items += [(cid, None, reason, None) for cid, reason in failures.items()]
    for i in range(0, len(items), STORE_BATCH):
        written.update(_insert_parts(con, ns, pl.DataFrame(items[i:i + STORE_BATCH], PART_SCHEMA, orient="row")))
    return written


def _drop_orphan_extractions(con: duckdb.DuckDBPyConnection, ns: str) -> None:
    """Rows of chunks no longer in `chunks` go."""
    for table in EXTRACTION_SCHEMAS:
        con.execute(f"DELETE FROM {table} WHERE namespace = ? AND chunk_id NOT IN "
                    "(SELECT chunk_id FROM chunks WHERE namespace = ?)", [ns, ns])


def _figures(written: Counter) -> dict:
    return {"raw_entities": written["extracted_entities"], "raw_relations": written["extracted_relations"],
            "facts": written["extracted_facts"]}


def store_extractions(con: duckdb.DuckDBPyConnection, ns: str, results: dict[str, str],
                      failures: dict[str, str], sources: dict[str, str]) -> dict:
    """Write the namespace's extracted_* rows from `results` (chunk_id -> the extraction's JSON; `sources`, chunk_id
    -> the chunk's text), in one transaction."""
    with transaction(con):
        _clear_extractions(con, ns, None)
        written = _insert_extractions(con, ns, results, failures, sources)
        _drop_orphan_extractions(con, ns)
    return _figures(written)


def run_extractions(settings: Settings, con: duckdb.DuckDBPyConnection, extractor=None,
                    progress: Progress | None = None, run_id: str | None = None, llm="auto") -> ExtractionsResult:
    """Cached extraction of every chunk. An endpoint error stops the stage after caching what finished
    (and recording the tokens spent): a re-run calls the model only for what is missing."""
    ns = settings.namespace
    llm = resolve_llm(settings, llm) if settings.extractor == "llm" else None
    extractor = extractor or make_extractor(settings, llm)
    llm = getattr(extractor, "llm", None)
    before = llm.meter.snapshot() if llm is not None else {}
    chunks = load_chunks(con, ns)
    cache = ExtractionCache(settings.cache_dir / "extractions.sqlite")
    try:
        run = extract_chunks(chunks, extractor, cache,
                             progress=(lambda i, n: progress("extractions", i, n)) if progress else None)
    finally:
        cache.close()
        release_workers()
        usage = record_usage(con, ns, run_id, llm, before)
    written = store_extractions(con, ns, run.results, run.failures, {c.chunk_id: c.text for c in chunks})
    return ExtractionsResult(chunks=len(chunks), cached=run.cached, computed=run.computed, failed=len(run.failures),
                             failures=run.failures, extractor=f"{extractor.name}:{extractor.model}",
                             **written, prompt_tokens=sum(u["prompt_tokens"] for u in usage),
                             completion_tokens=sum(u["completion_tokens"] for u in usage), llm_usage=usage)
