"""Indexing stages as plain functions over the warehouse. Dagster assets and library callers share them.

Per-document stages (documents, chunks, extractions) are separable by document; graph-wide stages
(entities onward) rebuild a namespace from the per-document tables.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Callable

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from .chunking import Chunk, chunk_document
from .config import Settings
from .documents import Document, Section, read_source, sha
from .embedding import embedding_model_name, get_embedder
from .extraction import Extraction, ExtractionCache, LlmExtractor, NlpExtractor, extract_chunks
from .graph import Edges
from .graphstore import GraphStore
from .lifecycle import skip_deleted
from .llm import OpenAIChat, configured_llm
from .objectstore import ObjectStore
from .reports import build_community_reports, summarize_graph_descriptions
from .stage_results import (ChunksResult, CommunitiesResult, DocumentsResult, EmbeddingsResult, ExportsResult,
                            ExtractionsResult, GraphTablesResult, KnnResult, StageResult, SummariesResult)
from .summaries import summarize_extractive
from .warehouse import count, name_keys, read_vectors, replace_rows, run_sql_model, transaction

Progress = Callable[[str, int, int], None]
EXPORT_TABLES = ("documents", "chunks", "entities", "relations", "mentions", "facts", "knn_edges",
                 "entity_scores", "communities", "community_summaries", "community_reports")


def _ns(table: pa.Table, namespace: str) -> pa.Table:
    return table.append_column("namespace", pa.array([namespace] * table.num_rows, pa.string()))


def resolve_llm(settings: Settings, llm="auto") -> OpenAIChat | None:
    """`"auto"`: the LLM the settings choose (one client for the whole run), else None (offline)."""
    return configured_llm(settings) if llm == "auto" else llm


def record_usage(con: duckdb.DuckDBPyConnection, namespace: str, run_id: str | None, llm, before: dict) -> list[dict]:
    """Write what the LLM used since `before` (a meter snapshot) to token_usage, one row per operation
    (nothing when no model was called, e.g. every item was cached)."""
    rows = llm.meter.since(before) if llm is not None else []
    for r in rows:
        con.execute("INSERT INTO token_usage (namespace, run_id, stage, model, prompt_tokens, completion_tokens) "
                    "VALUES (?, ?, ?, ?, ?, ?)", [namespace, run_id, r["operation"], r["model"], r["prompt_tokens"],
                                                  r["completion_tokens"]])
    return rows


def read_namespace_source(settings: Settings) -> tuple[list[Document], list]:
    """The documents the source yields, and its unreadable files; an empty source is an error, so a wrong or
    emptied path cannot wipe the namespace."""
    from .bucket_source import source_path

    docs, errors = read_source(source_path(settings), settings.max_file_bytes)
    if not docs and not errors:
        raise ValueError(f"source {settings.source} holds no readable file: nothing indexed and nothing removed "
                         "(removing every document of a namespace is an explicit delete)")
    return docs, errors


def ingest_documents(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> DocumentsResult:
    """Read the source; unreadable files are reported and skipped, and their earlier version is kept. With
    `only` (a run over some document partitions), the other documents keep their rows as they are."""
    from .incremental import write_inputs

    docs, errors = read_namespace_source(settings)
    ns = settings.namespace
    failed_files = {e.file for e in errors}
    cols = ("doc_id", "source", "title", "kind", "content_hash", "n_chars", "sections")
    rows = [{"doc_id": d.doc_id, "source": d.source, "title": d.title, "kind": d.kind,
             "content_hash": d.content_hash, "n_chars": len(d.text),
             "sections": json.dumps([s.__dict__ for s in d.sections])} for d in docs]
    rows, skipped_deleted = skip_deleted(con, ns, rows)
    if only is not None:
        rows = [r for r in rows if r["doc_id"] in only]
    ids = {r["doc_id"] for r in rows}
    previous = [dict(zip(cols, r)) for r in con.execute(
        f"SELECT {', '.join(cols)} FROM documents WHERE namespace = ?", [ns]).fetchall()]
    before = {r["doc_id"]: r["content_hash"] for r in previous}
    kept = [r for r in previous if r["doc_id"] not in ids
            and ((only is not None and r["doc_id"] not in only) or _from_files(r["source"], failed_files))]
    rows += kept
    replace_rows(con, "documents", ns, _ns(pa.Table.from_pylist(rows), ns) if rows else None)
    write_inputs(con, ns, "documents", {"source": str(settings.source)})  # what `drop_vanished` may compare with
    err_rows = [{"source": e.source, "reason": e.reason} for e in errors]
    replace_rows(con, "document_errors", ns, _ns(pa.Table.from_pylist(err_rows), ns) if err_rows else None)
    changed = sum(1 for r in rows if before.get(r["doc_id"]) != r["content_hash"])
    return DocumentsResult(documents=len(rows), errors=errors, changed=changed,
                           removed=len(set(before) - {r["doc_id"] for r in rows}), kept_after_error=len(kept),
                           skipped_deleted=len(skipped_deleted))


def _from_files(source: str, files: set[str]) -> bool:
    """Whether a document came from one of `files` (a file itself, or a JSONL row `file#id`): no splitting, so a
    ':' or '#' in a file name cannot detach a document from its file."""
    return source in files or any(source[:i] in files for i, ch in enumerate(source) if ch == "#")


def load_documents(con: duckdb.DuckDBPyConnection, namespace: str) -> list[Document]:
    rows = con.execute("SELECT doc_id, source, title, kind, content_hash, sections FROM documents "
                       "WHERE namespace = ? ORDER BY doc_id", [namespace]).fetchall()
    return [Document(doc_id, source, title, kind, tuple(Section(**s) for s in json.loads(sections)), h)
            for doc_id, source, title, kind, h, sections in rows]


def build_chunks(settings: Settings, con: duckdb.DuckDBPyConnection, only: frozenset[str] | None = None) -> ChunksResult:
    """Chunk the documents (of `only`, when given) that are new or changed since their chunks were made (recorded
    in stage_inputs); the other documents keep their rows, and chunks of documents gone are dropped."""
    from .incremental import read_inputs, write_inputs

    ns = settings.namespace
    docs = load_documents(con, ns)
    inputs = {d.doc_id: sha(json.dumps([d.source, d.title, d.kind, d.content_hash, [s.__dict__ for s in d.sections],
                                        settings.chunk_size, settings.chunk_overlap]), 32) for d in docs}
    before = read_inputs(con, ns, "chunks")
    chunked = {r[0] for r in con.execute("SELECT DISTINCT doc_id FROM chunks WHERE namespace = ?", [ns]).fetchall()}
    todo = [d for d in docs if (only is None or d.doc_id in only)
            and (before.get(d.doc_id) != inputs[d.doc_id] or d.doc_id not in chunked)]
    chunks = [c for d in todo for c in chunk_document(d, settings.chunk_size, settings.chunk_overlap)]
    table = pa.Table.from_pylist([c.__dict__ for c in chunks]) if chunks else None
    with transaction(con):
        replace_rows(con, "chunks", ns, _ns(table, ns) if table else None,
                     "AND (doc_id IN (SELECT unnest(?)) OR doc_id NOT IN (SELECT doc_id FROM documents WHERE namespace = ?))",
                     [[d.doc_id for d in todo], ns])
        write_inputs(con, ns, "chunks", inputs)
    n, total, most = con.execute("SELECT count(*), coalesce(sum(n_tokens), 0), coalesce(max(n_tokens), 0) FROM chunks "
                                 "WHERE namespace = ?", [ns]).fetchall()[0]
    return ChunksResult(chunks=n, tokens_total=int(total), tokens_max=int(most), rechunked_documents=len(todo))


def load_chunks(con: duckdb.DuckDBPyConnection, namespace: str) -> list[Chunk]:
    cols = list(Chunk.__dataclass_fields__)
    rows = con.execute(f"SELECT {', '.join(cols)} FROM chunks WHERE namespace = ? ORDER BY doc_id, position",
                       [namespace]).fetchall()
    return [Chunk(*r) for r in rows]


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
                                     ("description", pa.string())]),
    "extracted_relations": pa.schema([("chunk_id", pa.string()), ("source", pa.string()), ("target", pa.string()),
                                      ("description", pa.string()), ("weight", pa.float64())]),
    "extracted_facts": pa.schema([("chunk_id", pa.string()), ("fact_idx", pa.int32()), ("text", pa.string()),
                                  ("names", pa.list_(pa.string()))]),
    "extraction_failures": pa.schema([("chunk_id", pa.string()), ("reason", pa.string())]),
}


def store_extractions(con: duckdb.DuckDBPyConnection, ns: str, results: dict[str, Extraction],
                      failures: dict[str, str], scope: list[str] | None = None) -> dict:
    """Write the extracted_* rows of `results` (chunk_id -> extraction): the namespace's rows, or only those of
    the chunks in `scope`; rows of chunks no longer in `chunks` go either way."""
    rows: dict[str, list[dict]] = {t: [] for t in EXTRACTION_SCHEMAS}
    for cid, ex in results.items():
        rows["extracted_entities"] += [{"chunk_id": cid, **e} for e in ex.entities]
        rows["extracted_relations"] += [{"chunk_id": cid, **r} for r in ex.relations]
        rows["extracted_facts"] += [{"chunk_id": cid, "fact_idx": i, "text": f["text"], "names": f["names"]}
                                    for i, f in enumerate(ex.facts)]
    rows["extraction_failures"] = [{"chunk_id": c, "reason": r} for c, r in failures.items()]
    where, params = ("AND chunk_id IN (SELECT unnest(?))", [scope]) if scope is not None else ("", [])
    for table, schema in EXTRACTION_SCHEMAS.items():
        replace_rows(con, table, ns, _ns(pa.Table.from_pylist(rows[table], schema), ns), where, params)
        con.execute(f"DELETE FROM {table} WHERE namespace = ? AND chunk_id NOT IN "
                    "(SELECT chunk_id FROM chunks WHERE namespace = ?)", [ns, ns])
    return {"raw_entities": len(rows["extracted_entities"]), "raw_relations": len(rows["extracted_relations"]),
            "facts": len(rows["extracted_facts"])}


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
        usage = record_usage(con, ns, run_id, llm, before)
    written = store_extractions(con, ns, run.results, run.failures)
    return ExtractionsResult(chunks=len(chunks), cached=run.cached, computed=run.computed, failed=len(run.failures),
                             failures=run.failures, extractor=f"{extractor.name}:{extractor.model}",
                             **written, prompt_tokens=sum(u["prompt_tokens"] for u in usage),
                             completion_tokens=sum(u["completion_tokens"] for u in usage), llm_usage=usage)


def build_graph_tables(settings: Settings, con: duckdb.DuckDBPyConnection, llm=None,
                       run_id: str | None = None) -> GraphTablesResult:
    """The SQL models, in dependency order: the kept entities filter relations, mentions and facts. With an
    LLM, long entity and relation descriptions are then summarized (map-reduce, cached)."""
    from .merge import apply_merges

    name_keys(con, settings.namespace)
    for m in ("entities", "relations", "mentions", "facts"):
        run_sql_model(con, m, settings.namespace)
    merged = apply_merges(con, settings.namespace)  # recorded entity merges, folded in again
    counts = {t: count(con, t, settings.namespace) for t in ("entities", "relations", "mentions", "facts")}
    counts["merged_entities"] = merged
    if llm is None:
        return GraphTablesResult(**counts)
    before = llm.meter.snapshot()
    try:
        summarized = summarize_graph_descriptions(settings, con, llm)
    finally:
        usage = record_usage(con, settings.namespace, run_id, llm, before)
    return GraphTablesResult(**counts, **summarized, llm_usage=usage)


def _embed_missing(con, settings: Settings, kind: str, items: list[tuple[str, str]], embedder) -> int:
    """Embed items whose stored vector came from another model or another text (keyed by the text's hash, so a
    changed title or summary is embedded again); re-runs reuse the rest. One transaction per kind."""
    ns = settings.namespace
    have = {i: (m, h) for i, m, h in con.execute(
        "SELECT item_id, model, text_hash FROM embeddings WHERE namespace = ? AND kind = ?", [ns, kind]).fetchall()}
    hashes = {i: sha(t, 32) for i, t in items}
    todo = [(i, t) for i, t in items if have.get(i) != (embedder.name, hashes[i])]
    stale = [i for i in have if i not in hashes] + [i for i, _ in todo if i in have]
    vectors = embedder.embed([t for _, t in todo]) if todo else None
    with transaction(con):
        if stale:
            con.execute("DELETE FROM embeddings WHERE namespace = ? AND kind = ? AND item_id IN (SELECT unnest(?))",
                        [ns, kind, stale])
        if todo:
            _append_vectors(con, ns, kind, [i for i, _ in todo], vectors, embedder.name, [hashes[i] for i, _ in todo])
    return len(todo)


def _append_vectors(con, ns, kind, ids, vectors, model, text_hashes):
    import numpy as np

    table = pa.table({"namespace": [ns] * len(ids), "kind": [kind] * len(ids), "item_id": ids,
                      "model": [model] * len(ids), "text_hash": text_hashes,
                      "vector": pa.array([v for v in np.asarray(vectors, dtype=np.float32)], pa.list_(pa.float32()))})
    con.register("_vecs", table)
    try:
        con.execute("INSERT INTO embeddings BY NAME SELECT * FROM _vecs")
    finally:
        con.unregister("_vecs")


def build_embeddings(settings: Settings, con: duckdb.DuckDBPyConnection) -> EmbeddingsResult:
    ns = settings.namespace
    embedder = get_embedder(settings.embedder, settings.embedding_model)
    chunks = con.execute("SELECT chunk_id, title || E'\\n' || text FROM chunks WHERE namespace = ?", [ns]).fetchall()
    entities = con.execute("SELECT entity_id, name FROM entities WHERE namespace = ?", [ns]).fetchall()
    facts = con.execute("SELECT fact_id, text FROM facts WHERE namespace = ?", [ns]).fetchall()
    done = {kind: _embed_missing(con, settings, kind, items, by)
            for kind, items, by in (("chunk", chunks, embedder.passages), ("entity", entities, embedder),
                                    ("fact", facts, embedder))}
    return EmbeddingsResult(model=embedding_model_name(settings.embedder, settings.embedding_model), chunks=len(chunks), entities=len(entities), facts=len(facts),
                            newly_embedded=sum(done.values()))


def build_knn_edges(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore) -> KnnResult:
    """On a store with the exact search, only the entities whose neighbour lists can have changed since the
    recorded search are searched again (incremental.plan_knn); the edges are those of a full search."""
    from .graph import knn_edges, knn_stale_sources
    from .incremental import knn_inputs, plan_knn, write_inputs

    ns, k, cutoff = settings.namespace, settings.knn_top_k, settings.knn_cutoff
    ids, vectors = read_vectors(con, ns, "entity")
    inputs = knn_inputs(con, ns, k, cutoff)
    plan = plan_knn(con, ns, inputs) if store.exact_knn else None
    if plan is None:
        edges, redo = store.knn(ns, ids, vectors, k, cutoff), None
    else:
        rows = knn_stale_sources(ids, vectors, k, cutoff, plan.changed, plan.previous)
        edges, redo = knn_edges(ids, vectors, k, cutoff, rows), [ids[i] for i in rows] + sorted(plan.changed)
    table = pa.Table.from_pylist([{"source_id": e.source, "target_id": e.target, "score": e.score, "rank": e.rank}
                                  for e in edges]) if edges else None
    with transaction(con):
        replace_rows(con, "knn_edges", ns, _ns(table, ns) if table else None,
                     *(() if redo is None else ("AND source_id IN (SELECT unnest(?))", [redo])))
        write_inputs(con, ns, "knn_edges", inputs if store.exact_knn else {})  # a heuristic search: no basis
    n, low, mean = con.execute("SELECT count(*), coalesce(min(score), 0), coalesce(avg(score), 0) FROM knn_edges "
                               "WHERE namespace = ?", [ns]).fetchall()[0]
    return KnnResult(edges=n, entities=len(ids), top_k=k, cutoff=cutoff, score_min=low, score_mean=mean,
                     searched=len(ids) if redo is None else len(rows))


def entity_graph(con: duckdb.DuckDBPyConnection, namespace: str) -> tuple[list[str], Edges]:
    """Entities and the edges communities and PageRank run on (relations and KNN edges), as columns."""
    nodes = con.sql("SELECT entity_id FROM entities WHERE namespace = $ns ORDER BY entity_id",
                    params={"ns": namespace}).to_arrow_table().column(0).to_pylist()
    tbl = con.sql("SELECT source_id, target_id, weight::DOUBLE AS w FROM relations WHERE namespace = $ns "
                  "UNION ALL SELECT source_id, target_id, score::DOUBLE FROM knn_edges WHERE namespace = $ns "
                  "ORDER BY 1, 2", params={"ns": namespace}).to_arrow_table()
    # the ids stay Arrow strings: merged_undirected looks them up in Arrow (no 400k Python strings made)
    return nodes, Edges(tbl.column(0), tbl.column(1), tbl.column(2).to_numpy())


def build_communities(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore) -> CommunitiesResult:
    """Skipped when the graph is the one the recorded run saw; after a small change Leiden starts from the
    previous partition (incremental.seed_membership). PageRank is always that of the whole current graph."""
    from .incremental import PARAMS, graph_fingerprint, read_inputs, seed_membership, write_inputs

    ns, algorithm = settings.namespace, settings.community_algorithm
    fingerprint = graph_fingerprint(con, ns, algorithm)
    recorded = read_inputs(con, ns, "communities")
    if recorded.get(PARAMS) == fingerprint:
        return _communities_result(con, ns, algorithm, int(recorded.get("levels", 1)), reused=True)
    nodes, edges = entity_graph(con, ns)
    previous = dict(con.execute("SELECT entity_id, community_id FROM entity_scores WHERE namespace = ?", [ns]).fetchall())
    initial = seed_membership(nodes, previous) if algorithm == "leiden" else None
    comm = store.communities(ns, nodes, edges, algorithm, initial)
    pr = store.pagerank(ns, nodes, edges)
    cid = {n: f"k_{m}" for n, m in comm.membership.items()}
    sizes = Counter(cid.values())
    with transaction(con):
        replace_rows(con, "entity_scores", ns, _ns(pa.Table.from_pylist(
            [{"entity_id": n, "community_id": cid[n], "pagerank": float(pr.get(n, 0.0))} for n in nodes]), ns) if nodes else None)
        replace_rows(con, "communities", ns, _ns(pa.Table.from_pylist(
            [{"community_id": c, "level": 0, "size": s, "modularity": comm.modularity} for c, s in sizes.items()]), ns) if sizes else None)
        write_inputs(con, ns, "communities", {PARAMS: fingerprint, "levels": str(comm.levels)})
    return _communities_result(con, ns, algorithm, comm.levels, seeded=initial is not None)


def _communities_result(con: duckdb.DuckDBPyConnection, ns: str, algorithm: str, levels: int, reused: bool = False,
                        seeded: bool = False) -> CommunitiesResult:
    sizes = [s for (s,) in con.execute("SELECT size FROM communities WHERE namespace = ?", [ns]).fetchall()]
    modularity = con.execute("SELECT coalesce(max(modularity), 0) FROM communities WHERE namespace = ?", [ns]).fetchall()[0][0]
    dist = Counter(min(s, 50) for s in sizes)
    return CommunitiesResult(communities=len(sizes), modularity=modularity, algorithm=algorithm, levels=levels,
                             largest=max(sizes, default=0), singletons=dist.get(1, 0),
                             size_distribution=dict(sorted(dist.items())), reused=reused, seeded=seeded)


def build_community_summaries(settings: Settings, con: duckdb.DuckDBPyConnection, run_id: str | None = None,
                              llm=None) -> SummariesResult:
    """Extractive summaries for every community; with an LLM, communities with a report take its title
    and summary, and the report with its questions is what gets embedded for the global route."""
    ns = settings.namespace
    rows = con.execute("""
        SELECT s.community_id, e.name, e.description, s.pagerank, e.degree
        FROM entity_scores s JOIN entities e USING (namespace, entity_id)
        WHERE s.namespace = ? ORDER BY s.community_id, e.name""", [ns]).fetchall()
    members: dict[str, list[dict]] = defaultdict(list)
    for c, name, desc, pr, deg in rows:
        members[c].append({"name": name, "description": desc or "", "score": pr * 1000 + deg})
    summaries = [summarize_extractive(c, ms) for c, ms in members.items()]
    texts = {s.community_id: f"{s.title}\n{s.summary}" for s in summaries}
    reports, report_stats, usage = [], {}, []
    if llm is not None:
        before = llm.meter.snapshot()
        try:
            reports, report_stats = build_community_reports(settings, con, llm)
        finally:
            usage = record_usage(con, ns, run_id, llm, before)
        by_id = {r.community_id: r for r in reports}
        summaries = [replace(s, title=by_id[s.community_id].title, summary=by_id[s.community_id].summary)
                     if s.community_id in by_id else s for s in summaries]
        texts.update({r.community_id: r.text() for r in reports})
    else:
        replace_rows(con, "community_reports", ns, None)
    replace_rows(con, "community_summaries", ns, _ns(pa.Table.from_pylist([s.__dict__ for s in summaries]), ns) if summaries else None)
    embedder = get_embedder(settings.embedder, settings.embedding_model)
    embedded = _embed_missing(con, settings, "community", list(texts.items()), embedder)
    biggest = sorted(summaries, key=lambda s: -len(members[s.community_id]))[:5]
    return SummariesResult(summaries=len(summaries), embedded=embedded, llm=llm.model if llm else "extractive",
                           llm_usage=usage, **report_stats,
                           preview=[{"community_id": s.community_id, "size": len(members[s.community_id]),
                                     "title": s.title, "summary": s.summary[:200]} for s in biggest])


def export_parquet(settings: Settings, con: duckdb.DuckDBPyConnection, store: ObjectStore, run_id: str = "manual") -> ExportsResult:
    """One Parquet object per table under `<namespace>/tables/`, plus a manifest per run."""
    import io

    ns = settings.namespace
    manifest = {}
    for table in EXPORT_TABLES:
        data = con.sql(f"SELECT * FROM {table} WHERE namespace = ? ORDER BY ALL", params=[ns]).to_arrow_table()
        buf = io.BytesIO()
        pq.write_table(data, buf, compression="zstd")
        key = f"{ns}/tables/{table}.parquet"
        manifest[table] = {"key": key, "rows": data.num_rows, "bytes": buf.tell(), "md5": store.put(key, buf.getvalue())}
    store.put(f"{ns}/runs/{run_id}/manifest.json", json.dumps(manifest, indent=1, sort_keys=True).encode())
    return ExportsResult(objects=manifest, store=store.uri, run_key=f"{ns}/runs/{run_id}/manifest.json")


def graph_counts(con: duckdb.DuckDBPyConnection, namespace: str) -> dict:
    return {t: count(con, t, namespace) for t in ("documents", "chunks", "entities", "relations", "mentions",
                                                  "knn_edges", "communities", "community_summaries")}


def _stages(settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore, objects: ObjectStore | None,
            progress: Progress | None, run_id: str, llm=None, extractor=None,
            only: frozenset[str] | None = None) -> dict[str, Callable[[], StageResult]]:
    """Every indexing stage by the name of the asset it materializes, in dependency order; `only` scopes the
    per-document stages to some documents."""
    return {
        "documents": lambda: ingest_documents(settings, con, only),
        "chunks": lambda: build_chunks(settings, con, only),
        "extractions": lambda: run_extractions(settings, con, extractor, progress=progress, run_id=run_id, llm=llm),
        "entities": lambda: build_graph_tables(settings, con, llm, run_id),   # with relations, mentions, facts
        "embeddings": lambda: build_embeddings(settings, con),
        "knn_edges": lambda: build_knn_edges(settings, con, store),
        "communities": lambda: build_communities(settings, con, store),
        "community_summaries": lambda: build_community_summaries(settings, con, run_id, llm),
        "exports": lambda: export_parquet(settings, con, objects, run_id),
    }


STAGE_NAMES = ("documents", "chunks", "extractions", "entities", "embeddings", "knn_edges", "communities",
               "community_summaries", "exports")
GRAPH_STAGES = STAGE_NAMES[STAGE_NAMES.index("entities"):]  # rebuilt from the per-document tables (index, delete)


def run_stage(asset: str, settings: Settings, con: duckdb.DuckDBPyConnection, store: GraphStore,
              objects: ObjectStore | None = None, progress: Progress | None = None,
              run_id: str = "library", llm=None, extractor=None, only: frozenset[str] | None = None) -> StageResult:
    """One stage, then the graph store's sync of what it produced: the one place syncing happens, so a stage
    cannot leave the served graph stale. The sync's figures come back as `synced`."""
    result = _stages(settings, con, store, objects, progress, run_id, llm, extractor, only)[asset]()
    return replace(result, synced=store.sync(con, settings.namespace, asset))


def sync_all(store: GraphStore, con: duckdb.DuckDBPyConnection, namespace: str) -> None:
    """Push an index built earlier (e.g. on the embedded store) to `store`, asset by asset."""
    for asset in STAGE_NAMES:
        store.sync(con, namespace, asset)


def run_index(settings: Settings, store: GraphStore | None = None, objects: ObjectStore | None = None,
              progress: Progress | None = None, run_id: str = "library", llm="auto", extractor=None) -> dict:
    """Every stage in order, without Dagster: the library entry point (the bench uses it too). `llm`:
    "auto" (the LLM the settings choose, else offline), None (offline) or a client."""
    from .graphstore import EmbeddedGraphStore
    from .objectstore import LocalObjectStore
    from .warehouse import WriterSession

    store = store or EmbeddedGraphStore()
    objects = objects or LocalObjectStore(settings.export_dir)
    llm = resolve_llm(settings, llm)
    out: dict = {}
    timings = out["seconds"] = {}
    with WriterSession(settings, run_id) as writer, writer.connect() as con:
        for i, name in enumerate(STAGE_NAMES):
            if progress:
                progress("index", i, len(STAGE_NAMES))
            t0 = time.perf_counter()
            out[name] = run_stage(name, settings, con, store, objects, progress, run_id, llm, extractor)
            timings[name] = round(time.perf_counter() - t0, 2)
        if progress:
            progress("index", len(STAGE_NAMES), len(STAGE_NAMES))
    return out
