"""The `embeddings` asset: vectors for entities, chunks and facts, computed only for texts not embedded yet
with the same model."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from lazyhippo.models.embedders import embedding_model_name, get_embedder
from lazyhippo.settings import Settings
from lazyhippo.sources.files import sha
from lazyhippo.stages.results import EmbeddingsResult
from lazyhippo.stores.warehouse import quantize, transaction


EMBED_BATCH = 4096  # texts per embed call: the tokenizer's output and the vectors of one batch at a time


def _embed_missing(con, settings: Settings, kind: str, items: list[tuple[str, str]], embedder) -> int:
    """Embed items whose stored vector came from another model or another text (keyed by the text's hash, so a
    changed title or summary is embedded again); re-runs reuse the rest. One transaction per kind, the vectors
    embedded and written EMBED_BATCH texts at a time (a text's vector does not depend on its batch)."""
    ns = settings.namespace
    have = {i: (m, h) for i, m, h in con.execute(
        "SELECT item_id, model, text_hash FROM embeddings WHERE namespace = ? AND kind = ?", [ns, kind]).fetchall()}
    hashes = {i: sha(t, 32) for i, t in items}
    todo = [(i, t) for i, t in items if have.get(i) != (embedder.name, hashes[i])]
    stale = [i for i in have if i not in hashes] + [i for i, _ in todo if i in have]
    with transaction(con):
        if stale:
            con.execute("DELETE FROM embeddings WHERE namespace = ? AND kind = ? AND item_id IN (SELECT unnest(?))",
                        [ns, kind, stale])
        for start in range(0, len(todo), EMBED_BATCH):
            batch = todo[start:start + EMBED_BATCH]
            _append_vectors(con, ns, kind, [i for i, _ in batch], embedder.embed([t for _, t in batch]), embedder.name,
                            [hashes[i] for i, _ in batch])
    return len(todo)


def _append_vectors(con, ns, kind, ids, vectors, model, text_hashes):
    quantized, scale = quantize(vectors)
    table = pa.table({"namespace": [ns] * len(ids), "kind": [kind] * len(ids), "item_id": ids,
                      "model": [model] * len(ids), "text_hash": text_hashes, "vector": quantized, "scale": scale})
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
