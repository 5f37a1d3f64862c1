"""DuckDB warehouse: the embedded store every stage reads and writes, namespaced per row."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from dbt_like_sql import SQL_DIR

from .config import Settings

TABLES = (
    "documents", "deleted_documents", "document_errors", "chunks", "extracted_entities", "extracted_relations",
    "extracted_facts", "extraction_failures", "entities", "relations", "mentions", "facts",
    "embeddings", "knn_edges", "entity_scores", "communities", "community_summaries", "token_usage",
)


@contextmanager
def connect(settings: Settings, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """Short-lived connections: DuckDB allows one writing process, so nobody holds the file long."""
    settings.home.mkdir(parents=True, exist_ok=True)
    exists = settings.db_path.exists()
    con = duckdb.connect(str(settings.db_path), read_only=read_only and exists)
    try:
        if not (read_only and exists):
            con.execute((SQL_DIR / "schema.sql").read_text())
        yield con
    finally:
        con.close()


def replace_rows(con: duckdb.DuckDBPyConnection, table: str, namespace: str, rows: pa.Table | None,
                 where: str = "", params: Sequence = ()) -> int:
    """Delete this namespace's rows (optionally narrowed by `where`) and insert `rows`: idempotent writes."""
    con.execute(f"DELETE FROM {table} WHERE namespace = ? {where}", [namespace, *params])
    if rows is None or rows.num_rows == 0:
        return 0
    con.register("_incoming", rows)
    cols = ", ".join(rows.column_names)
    con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _incoming")
    con.unregister("_incoming")
    return rows.num_rows


def run_sql_model(con: duckdb.DuckDBPyConnection, model: str, namespace: str) -> int:
    """Materialize `dbt_like_sql/<model>.sql` (package data) (a SELECT over $namespace) into the table of that name."""
    sql = (SQL_DIR / f"{model}.sql").read_text()
    con.execute(f"DELETE FROM {model} WHERE namespace = $namespace", {"namespace": namespace})
    con.execute(f"INSERT INTO {model} BY NAME ({sql})", {"namespace": namespace})
    return count(con, model, namespace)


def count(con: duckdb.DuckDBPyConnection, table: str, namespace: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE namespace = ?", [namespace]).fetchone()[0]


def counts(settings: Settings) -> dict[str, int]:
    if not Path(settings.db_path).exists():
        return {t: 0 for t in TABLES}
    with connect(settings, read_only=True) as con:
        return {t: count(con, t, settings.namespace) for t in TABLES}


def read_vectors(con: duckdb.DuckDBPyConnection, namespace: str, kind: str) -> tuple[list[str], np.ndarray]:
    tbl = con.sql("SELECT item_id, vector FROM embeddings WHERE namespace = ? AND kind = ? ORDER BY item_id",
                  params=[namespace, kind]).to_arrow_table()
    ids = tbl.column("item_id").to_pylist()
    if not ids:
        return [], np.zeros((0, 0), dtype=np.float32)
    col = tbl.column("vector").combine_chunks()
    flat = col.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return ids, flat.reshape(len(ids), -1)
