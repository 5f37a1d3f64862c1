"""The `embeddings` asset: vectors for entities, chunks and facts, computed only for texts not embedded yet
with the same model."""

from __future__ import annotations

from itertools import chain, islice
from typing import Iterable, Iterator

import duckdb
import pyarrow as pa

from lazyhippo.models.embedders import embedding_model_name, get_embedder
from lazyhippo.settings import Settings
from lazyhippo.stages.incremental import fingerprint
from lazyhippo.stages.results import EmbeddingsResult
from lazyhippo.stores.warehouse import count, fact_texts, insert_rows, quantize, transaction


EMBED_BATCH = 4096  # texts per embed call: the tokenizer's output and the vectors of one batch at a time


def _embed_missing(con, settings: Settings, kind: str, items: Iterable[tuple[str, str]], embedder) -> int:
    """Embed items whose stored vector came from another model or another text (keyed by the text's 64-bit
    `fingerprint`, so a changed title or summary is embedded again); re-runs reuse the rest. One transaction per kind; `items` are
    taken EMBED_BATCH at a time, each batch's missing texts embedded and written before the next is read (a
    text's vector does not depend on its batch), so no more than one batch of texts is held."""
    ns = settings.namespace
    seen: set[str] = set()
    embedded = 0
    with transaction(con):
        con.execute("DELETE FROM embeddings WHERE namespace = ? AND kind = ? AND model <> ?", [ns, kind, embedder.name])
        have = dict(con.execute("SELECT item_id, text_hash FROM embeddings WHERE namespace = ? AND kind = ?",
                                [ns, kind]).fetchall())  # of this model: the others were just dropped
        for batch in _batches(items, EMBED_BATCH):
            seen.update(i for i, _ in batch)
            todo = [(i, t, h) for i, t in batch if have.get(i) != (h := fingerprint(t))]
            if not todo:
                continue
            _delete(con, ns, kind, [i for i, _, _ in todo if i in have])
            _append_vectors(con, ns, kind, [i for i, _, _ in todo], embedder.embed([t for _, t, _ in todo]),
                            embedder.name, [h for _, _, h in todo])
            embedded += len(todo)
        _delete(con, ns, kind, [i for i in have if i not in seen])
    return embedded


def _batches(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch


def _delete(con, ns: str, kind: str, ids: list[str]) -> None:
    if ids:
        con.execute("DELETE FROM embeddings WHERE namespace = ? AND kind = ? AND item_id IN (SELECT unnest(?))",
                    [ns, kind, ids])


def _append_vectors(con, ns, kind, ids, vectors, model, text_hashes):
    quantized, scale = quantize(vectors)
    insert_rows(con, "embeddings", pa.table({"namespace": [ns] * len(ids), "kind": [kind] * len(ids), "item_id": ids,
                                             "model": [model] * len(ids), "text_hash": pa.array(text_hashes, pa.uint64()),
                                             "vector": quantized, "scale": scale}))


def _rows(con: duckdb.DuckDBPyConnection, sql: str, ns: str) -> Iterator[tuple[str, str]]:
    """The query's rows EMBED_BATCH at a time, through a cursor of their own (the writes between two batches
    go through `con`)."""
    cur = con.cursor()
    try:
        cur.execute(sql, [ns])
        yield from chain.from_iterable(iter(lambda: cur.fetchmany(EMBED_BATCH), []))
    finally:
        cur.close()


def build_embeddings(settings: Settings, con: duckdb.DuckDBPyConnection) -> EmbeddingsResult:
    ns = settings.namespace
    embedder = get_embedder(settings.embedder, settings.embedding_model)
    kinds = (("chunk", "SELECT chunk_id, title || E'\\n' || text FROM chunks WHERE namespace = ?", embedder.passages),
             ("entity", "SELECT entity_id, name FROM entities WHERE namespace = ?", embedder),
             ("fact", f"SELECT fact_id, text FROM {fact_texts('facts')} WHERE namespace = ?", embedder))
    done = sum(_embed_missing(con, settings, kind, _rows(con, sql, ns), by) for kind, sql, by in kinds)
    return EmbeddingsResult(model=embedding_model_name(settings.embedder, settings.embedding_model),
                            chunks=count(con, "chunks", ns), entities=count(con, "entities", ns),
                            facts=count(con, "facts", ns), newly_embedded=done)
