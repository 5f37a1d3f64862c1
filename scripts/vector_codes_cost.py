"""What coarser vector codes cost: int8 and 6-, 5- and 4-bit codes against the float vectors.

    python scripts/vector_codes_cost.py WAREHOUSE [--namespace bench] [--embedder static-minilm]

The entities' names and up to 20,000 facts of WAREHOUSE embedded again as floats; for each code, the cosine error
over 20,000 random pairs, and the share of the KNN stage's edges (top `knn_top_k` at `knn_cutoff`, Settings'
defaults) of 4,000 entities against all that the codes find. n-bit: -(2^(n-1) - 1)..2^(n-1) - 1 steps of each
vector's largest magnitude, written as int8 (`int8_rows` with those levels); 4-bit also as Lloyd-Max levels of a
Gaussian by the vector's RMS. Then the bytes of the embeddings table copied alone with its codes made n-bit (from
the stored codes), as BLOBs with zstd.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from lazyhippo.models.embedders import get_embedder
from lazyhippo.settings import Settings
from lazyhippo.stores.warehouse import BLOCK_SIZE, code_blobs, fact_texts, int8_rows, stored_rows

LLOYD = np.array([0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326])  # levels, unit Gaussian
LLOYD_EDGES = np.array([0.0, 0.2582, 0.5224, 0.7996, 1.0993, 1.4371, 1.8435, 2.4008])


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


BITS = {"int8": 127, "6-bit": 31, "5-bit": 15, "4-bit": 7}


def coded(levels: int):
    def code(x: np.ndarray) -> np.ndarray:
        q, s = int8_rows(x, levels)
        return q.astype(np.float32) * s[:, None]
    return code


def as_lloyd(x: np.ndarray) -> np.ndarray:
    rms = np.maximum(np.sqrt((x ** 2).mean(axis=1)), 1e-30)
    level = np.searchsorted(LLOYD_EDGES, np.abs(x) / rms[:, None], side="right") - 1
    return (np.sign(x) * np.rint(LLOYD / LLOYD[-1] * 127)[level]).astype(np.float32) * (rms * LLOYD[-1] / 127)[:, None]


CODES = {**{name: coded(levels) for name, levels in BITS.items()}, "4-bit Lloyd-Max": as_lloyd}


def errors(label: str, f: np.ndarray, rng: np.random.Generator) -> None:
    a, b = rng.integers(0, len(f), 20_000), rng.integers(0, len(f), 20_000)
    true = np.einsum("ij,ij->i", f[a], f[b])
    for name, code in CODES.items():
        g = unit(code(f))
        err = np.abs(np.einsum("ij,ij->i", g[a], g[b]) - true)
        print(f"{label}, {name}: pair cosine error mean {err.mean():.4f}, p99 {np.quantile(err, 0.99):.4f}, "
              f"max {err.max():.4f}", flush=True)


def knn_edges(f: np.ndarray, queries: np.ndarray, k: int, cutoff: float) -> set[tuple[int, int]]:
    f = unit(f)
    sims = f[queries] @ f.T
    sims[np.arange(len(queries)), queries] = -1
    top = np.argsort(-sims, axis=1)[:, :k]
    kept = np.take_along_axis(sims, top, axis=1) >= cutoff
    return {(int(q), int(t)) for q, row, keep in zip(queries, top, kept) for t in row[keep]}


def table_bytes(path: Path) -> None:
    con = duckdb.connect()
    con.execute("SET threads = 1")  # rows copied in their stored order
    con.execute(f"ATTACH '{path}' AS s (READ_ONLY)")
    tbl = con.sql("SELECT namespace, kind, item_id, model, vector, scale, text_hash FROM s.embeddings "
                  "ORDER BY rowid").to_arrow_table()
    codes, scale = stored_rows(tbl)
    floats = codes.astype(np.float32) * scale[:, None]
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        for name, levels in BITS.items():
            q, s = int8_rows(floats, levels)
            one = Path(tmp) / f"{levels}.duckdb"
            con.execute(f"ATTACH '{one}' AS o (BLOCK_SIZE {BLOCK_SIZE})")
            con.execute("CREATE TABLE o.embeddings (namespace VARCHAR NOT NULL, kind VARCHAR NOT NULL, item_id "
                        "VARCHAR NOT NULL, model VARCHAR NOT NULL, vector BLOB USING COMPRESSION zstd NOT NULL, "
                        "scale FLOAT NOT NULL, text_hash UBIGINT)")
            con.register("t", tbl.set_column(4, "vector", code_blobs(q)).set_column(5, "scale", pa.array(s)))
            con.execute("INSERT INTO o.embeddings SELECT * FROM t")
            con.execute("DETACH o")
            con.unregister("t")
            print(f"embeddings with {name} codes, copied alone: {one.stat().st_size / 1e6:.1f} MB", flush=True)
            one.unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("warehouse", type=Path)
    ap.add_argument("--namespace", default="bench")
    ap.add_argument("--embedder", default="static-minilm")
    args = ap.parse_args()
    con = duckdb.connect(str(args.warehouse), read_only=True)
    names = [r[0] for r in con.execute("SELECT name FROM entities WHERE namespace = ? ORDER BY entity_id",
                                       [args.namespace]).fetchall()]
    facts = [r[0] for r in con.execute(f"SELECT text FROM {fact_texts('facts', con)} WHERE namespace = ? "
                                       "ORDER BY fact_id LIMIT 20000",
                                       [args.namespace]).fetchall()]
    con.close()
    embedder, rng, settings = get_embedder(args.embedder), np.random.default_rng(0), Settings()
    entities = unit(np.asarray(embedder.embed(names), dtype=np.float32))
    errors("entities", entities, rng)
    errors("facts", unit(np.asarray(embedder.embed(facts), dtype=np.float32)), rng)
    queries = rng.choice(len(entities), min(4000, len(entities)), replace=False)
    exact = knn_edges(entities, queries, settings.knn_top_k, settings.knn_cutoff)
    for name, code in CODES.items():
        found = knn_edges(code(entities), queries, settings.knn_top_k, settings.knn_cutoff)
        print(f"KNN edges of {len(queries)} entities: {len(exact)} from floats, {name} finds "
              f"{len(found & exact) / max(len(exact), 1):.1%} of them ({len(found)} edges)", flush=True)
    table_bytes(args.warehouse)


if __name__ == "__main__":
    main()
