"""DuckDB warehouse: the embedded store every stage reads and writes, namespaced per row.

Concurrency (DuckDB locks the file per process, so a reader would break a writer): an index run owns the work
file `warehouse.duckdb`, serialized between processes by a lock that waits (`WriterSession`). At the end of a
successful run the namespace is published to `published/<namespace>.duckdb` (atomically renamed onto it), the
read-only snapshot every query and `status` opens: the work file itself, hard-linked, when it holds that
namespace alone (the next write gives the work file a copy of its own first), else a new file with the
namespace's rows of the tables readers read. Readers therefore never touch a file being written and always see
the last complete index; `index_notice` tells them when the latest run is still going, failed, or was killed.
Writers outside an index run use a `WriterSession` too (it publishes).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import duckdb
import numpy as np
from filelock import FileLock, Timeout

from lazyhippo.graph.names import norm_keys
from lazyhippo.settings import Settings, environment
from lazyhippo.sql import SQL_DIR

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

TABLES = (
    "documents", "deleted_documents", "document_errors", "chunks", "extracted_entities", "extracted_relations",
    "extracted_facts", "extraction_failures", "entities", "relations", "mentions", "facts",
    "embeddings", "knn_edges", "entity_scores", "communities", "community_summaries", "community_reports", "token_usage",
    "stage_inputs",
)
# what the graph stages consume and no reader needs: kept in the work file (an update recomputes from it), left
# out of the published snapshot, which records only their row counts (`status`) in SNAPSHOT_COUNTS
STAGING = ("extracted_entities", "extracted_relations", "extracted_facts", "stage_inputs")
SNAPSHOT_COUNTS = "lh_staging_counts"
# 64 KiB blocks for a new file (DuckDB's default is 256 KiB): a column's segments fill whole blocks, so the larger
# ones left 13-16% of the file empty (2WikiMultiHopQA 59.5 -> 54.5 MB, gitdocs 34.9 -> 30.2); a file keeps the
# size it was created with
BLOCK_SIZE = 65536
_LOCK = "warehouse.lock"
_STATE = "index_state.json"
# homes whose writer lock this process holds -> the thread running that index run (it reads its own work;
# every other thread, e.g. a server answering queries meanwhile, reads the published snapshot)
_HELD: dict[Path, int] = {}


class IndexIncomplete(RuntimeError):
    """No complete index to read: the only run so far failed or was killed."""


def snapshot_dir(settings: Settings) -> Path:
    """Where the published snapshots live; its modification time changes whenever one is replaced."""
    return settings.home / "published"


def snapshot_path(settings: Settings) -> Path:
    """Per namespace, so publishing one knowledge base never publishes another's half-built rows."""
    return snapshot_dir(settings) / f"{settings.namespace}.duckdb"


def published_namespaces(settings: Settings) -> list[str]:
    _published(settings)
    return sorted(p.stem for p in snapshot_dir(settings).glob("*.duckdb"))


def _bounded(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """DuckDB's own memory capped (its default, 80% of the machine, lets one query take what every other process
    needs; past the cap joins, sorts and aggregates spill to `<warehouse>.tmp` beside the file) and its threads
    those of the process (LAZYHIPPO_THREADS)."""
    env = environment()
    try:
        con.execute(f"SET memory_limit = '{env.duckdb_memory}'")
    except duckdb.Error as exc:
        con.close()
        raise ValueError(f"LAZYHIPPO_DUCKDB_MEMORY {env.duckdb_memory!r}: not a DuckDB memory size like 512MB ({exc})") from None
    con.execute(f"SET threads = {env.compute_threads()}")
    return con


def _with_functions(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    # a whole vector of names per call (a per-row Python call costs more than the work)
    con.create_function("lh_norm", norm_keys, [duckdb.sqltype("VARCHAR")], duckdb.sqltype("VARCHAR"),
                        type="arrow", side_effects=False)
    con.execute("CREATE OR REPLACE TEMP MACRO lh_entity_id(s) AS 'e_' || substr(sha256(lh_norm(s)), 1, 16)")
    con.create_function("lh_vector", float_vectors, [duckdb.sqltype("BLOB"), duckdb.sqltype("FLOAT")],
                        duckdb.sqltype("FLOAT[]"), type="arrow", null_handling="special", side_effects=False)
    return con


def _open_writer(settings: Settings) -> duckdb.DuckDBPyConnection:
    settings.home.mkdir(parents=True, exist_ok=True)
    _unshare(settings.db_path)
    con = _bounded(duckdb.connect(str(settings.db_path), config={"default_block_size": str(BLOCK_SIZE)}))
    con.execute((SQL_DIR / "schema.sql").read_text())
    _migrate_fingerprints(con)
    _migrate_vectors(con)
    _migrate_spans(con, settings.db_path)  # first: the facts' tables of this version's storage, as the others read
    _migrate_storage(con, settings.db_path)
    _migrate_places(con, settings.db_path, _migrate_descriptions(con, settings.db_path))
    return _with_functions(con)


def _migrate_fingerprints(con: duckdb.DuckDBPyConnection) -> None:
    """Text hashes and stage fingerprints stored as hex text: made the 64-bit integers this version computes for
    the same inputs (`incremental.fingerprint`), once, so nothing is embedded or recomputed again: a text hash
    is its first 16 hex digits; a fingerprint's text is hashed, with the text hashes in the KNN stage's written
    as integers, and the entity ids in the entities stage's kept as its detail."""
    from lazyhippo.stages.incremental import FINGERPRINT_SQL, PARAMS

    types = dict(con.execute("SELECT table_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
                             "AND (table_name, column_name) IN (('embeddings', 'text_hash'), ('stage_inputs', 'fingerprint'))"
                             ).fetchall())
    if "VARCHAR" not in types.values():
        return
    log.warning("%s: converting the text hashes and stage fingerprints to 64-bit integers: once", con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0])
    con.execute("SET enable_progress_bar = false")
    with transaction(con):
        if types.get("embeddings") == "VARCHAR":
            con.execute("ALTER TABLE embeddings ALTER text_hash TYPE UBIGINT "
                        "USING try_cast('0x' || substr(text_hash, 1, 16) AS UBIGINT)")
        if types.get("stage_inputs") == "VARCHAR":
            con.execute("ALTER TABLE stage_inputs RENAME TO lh_old_stage_inputs")
            con.execute(_schema_tables()["stage_inputs"])
            con.execute(f"""INSERT INTO stage_inputs (namespace, stage, item_id, fingerprint, detail)
                SELECT namespace, stage, item_id, {FINGERPRINT_SQL.format('text')}, detail FROM (
                    SELECT namespace, stage, item_id, CASE
                        WHEN item_id = $params THEN fingerprint
                        WHEN stage = 'entities' THEN split_part(fingerprint, ' ', 1)
                        WHEN stage = 'knn_edges' THEN m.model || ':' || coalesce(try_cast(
                            '0x' || substr(m.hash, 1, 16) AS UBIGINT)::VARCHAR, '')
                        ELSE fingerprint END AS text,
                        CASE WHEN stage = 'entities' AND item_id <> $params
                             THEN substr(fingerprint, strpos(fingerprint, ' ') + 1) END AS detail
                    FROM (SELECT *, regexp_extract(fingerprint, '^(.*):([0-9a-f]*)$', ['model', 'hash']) AS m
                          FROM lh_old_stage_inputs))""", {"params": PARAMS})
            con.execute("DROP TABLE lh_old_stage_inputs")


def _migrate_vectors(con: duckdb.DuckDBPyConnection) -> None:
    """A warehouse written with vectors as lists (int8 codes, or floats before them): rewritten once to a BLOB of
    its int8 codes per row, the same codes (floats quantized as `quantize` does), so an old home keeps its vectors
    and no embedding is computed again; VECTOR_MIGRATION_ROWS rows a statement (a read and its write). Codes of
    any number of levels are read alike: a home's int8 codes of 255 levels stay as written beside the 31-level
    codes its updates add (coding them again would grow the file, which DuckDB never shrinks, and redo its KNN)."""
    import pyarrow as pa

    if vector_type(con) not in ("TINYINT[]", "FLOAT[]"):
        return
    log.warning("%s: rewriting the embeddings' vectors to compressed codes: once", con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0])
    con.execute("SET enable_progress_bar = false")
    with transaction(con):
        con.execute("ALTER TABLE embeddings RENAME TO lh_old_embeddings")
        con.execute(_schema_tables()["embeddings"])
        cols = [c for c in stored_columns(con, "lh_old_embeddings") if c not in ("vector", "scale")]
        last = con.execute("SELECT coalesce(max(rowid), -1) FROM lh_old_embeddings").fetchall()[0][0]
        for start in range(0, last + 1, VECTOR_MIGRATION_ROWS):
            part = con.sql(f"SELECT {', '.join(cols)}, {VECTOR_COLUMNS} FROM lh_old_embeddings "
                           "WHERE rowid >= $a AND rowid < $b ORDER BY rowid",
                           params={"a": start, "b": start + VECTOR_MIGRATION_ROWS}).to_arrow_table()
            codes, scale = stored_rows(part)
            insert_rows(con, "embeddings", pa.table({**{c: part.column(c) for c in cols},
                                                     "vector": code_blobs(codes), "scale": scale}))
        con.execute("DROP TABLE lh_old_embeddings")
    con.execute("CHECKPOINT")


VECTOR_MIGRATION_ROWS = 65_536  # 16 MB of codes at 256 dimensions
_ZSTD_COLUMN = re.compile(r'"?(\w+)"? [A-Z]+(?:\[\])? USING COMPRESSION ZSTD', re.IGNORECASE)
_GENERATED_COLUMN = re.compile(r'"?(\w+)"? [A-Z]+(?:\[\])? GENERATED ALWAYS AS', re.IGNORECASE)
_SCHEMA_TABLES: dict[str, str] = {}


def _schema_tables() -> dict[str, str]:
    """Table -> its CREATE TABLE statement as `schema.sql` declares it today (the migrations' target)."""
    if not _SCHEMA_TABLES:
        with duckdb.connect() as con:
            con.execute((SQL_DIR / "schema.sql").read_text())
            _SCHEMA_TABLES.update(con.execute("SELECT table_name, sql FROM duckdb_tables()").fetchall())
    return _SCHEMA_TABLES


def stored_columns(con: duckdb.DuckDBPyConnection, table: str, database: str | None = None) -> list[str]:
    """The columns of `table` that hold data (a generated column, e.g. relations.relation_id, is computed when
    read and takes no insert), in table order."""
    return [r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = coalesce(?, current_database()) "
        "AND schema_name = 'main' AND table_name = ? AND NOT is_generated ORDER BY column_index",
        [database, table]).fetchall()]


def _migrate_storage(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Tables written before their declared storage (long text columns zstd, derived columns generated when
    read instead of stored): rewritten once to it (the same rows; 5.5 s at 10,000 documents), with a notice
    saying why that first write takes longer. The blocks they leave are reused by later writes."""
    have = dict(con.execute("SELECT table_name, sql FROM duckdb_tables() "
                            "WHERE database_name = current_database()").fetchall())
    stale = [t for t, ddl in _schema_tables().items() if any(
        set(p.findall(ddl)) - set(p.findall(have.get(t, ""))) for p in (_ZSTD_COLUMN, _GENERATED_COLUMN))]
    if not stale:
        return
    log.warning("%s: rewriting %s to the storage format of this version (long text compressed with zstd, "
                "derived ids computed when read): once", path, ", ".join(stale))
    con.execute("SET enable_progress_bar = false")
    with transaction(con):
        for table in stale:
            con.execute(f"ALTER TABLE {table} RENAME TO lh_old_{table}")
            con.execute(_schema_tables()[table])
            cols = ", ".join(stored_columns(con, table))
            con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM lh_old_{table}")
            con.execute(f"DROP TABLE lh_old_{table}")
    con.execute("CHECKPOINT")


# a description taken from a sentence is its start, at most this many characters (lazyhippo/models/extractors.py)
DESCRIPTION_HEAD = 300
DESCRIBED = ("extracted_entities", "extracted_relations")  # staging tables whose descriptions refer to facts
MIGRATION_CHUNKS = 25_000  # chunks whose rows one statement of _migrate_descriptions rewrites


# per staging table, its names stored as places in their fact's names (schema.sql): name column -> place column
PLACED = {"extracted_entities": {"name": "name_pos"},
          "extracted_relations": {"source": "source_pos", "target": "target_pos"}}


def _named(table: str) -> list[str]:
    """The stored columns of `table` but its descriptions and places, each name read back from its place."""
    placed = PLACED[table]
    return [f"coalesce(x.{c}, f.names[x.{placed[c]}]) AS {c}" if c in placed else f"x.{c}"
            for c in _schema_columns(table) if c not in ("description", "fact_idx", *placed.values())]


def described(table: str) -> str:
    """A query of the rows of `table` (extracted_entities or extracted_relations) of the namespace `$ns` with every
    description and name as text: a reference to one of the chunk's facts read back from it."""
    cols = ", ".join(_named(table))
    return f"""SELECT {cols}, CASE WHEN x.fact_idx IS NULL THEN x.description
                                 ELSE left(f.text, {DESCRIPTION_HEAD}) END AS description
               FROM {table} x LEFT JOIN {fact_texts("extracted_facts")} f
               ON f.namespace = x.namespace AND f.chunk_id = x.chunk_id AND f.fact_idx = x.fact_idx
               WHERE x.namespace = $ns"""


def named(table: str, namespace: str = "$ns") -> str:
    """A query of the rows of `table` (extracted_entities or extracted_relations) of the namespace `namespace` (an
    SQL expression) with every name as text, descriptions as stored (a fact's index, else text)."""
    return f"""SELECT {", ".join(_named(table))}, x.description, x.fact_idx
               FROM {table} x LEFT JOIN extracted_facts f
               ON f.namespace = x.namespace AND f.chunk_id = x.chunk_id AND f.fact_idx = x.fact_idx
               WHERE x.namespace = {namespace}"""


SPANS = ("span_start", "span_length")


def fact_texts(table: str, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """A subquery of the rows of `table` (extracted_facts or facts) with each fact's `text` in its place among the
    columns, a span read back from its chunk's text (schema.sql), the spans left out. Given `con`, on the form
    `table` has there: a published snapshot written before spans holds every text (it is never rewritten)."""
    if con is not None and not set(SPANS) <= set(stored_columns(con, table)):
        return f"(SELECT * FROM {table})"
    cols = ", ".join("coalesce(f.text, substr(c.text, f.span_start + 1, f.span_length)) AS text" if c == "text"
                     else f"f.{c}" for c in _schema_columns(table) if c not in SPANS)
    return (f"(SELECT {cols} FROM {table} f "
            "LEFT JOIN chunks c ON c.namespace = f.namespace AND c.chunk_id = f.chunk_id AND f.text IS NULL)")


def _migrate_spans(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Fact tables written before spans (every text stored): rewritten once, each text found in its chunk's text
    stored as its place there, the way the staging load stores it, a bucket of MIGRATION_CHUNKS chunks per
    statement. The file keeps its size until DuckDB reuses the freed blocks."""
    stale = [t for t in ("extracted_facts", "facts") if not set(SPANS) <= set(stored_columns(con, t))]
    if not stale:
        return
    n = con.execute("SELECT count(*) FROM chunks").fetchall()[0][0]

    def statement(table: str) -> str:
        cols = [c for c in stored_columns(con, table) if c not in (*SPANS, "text")]
        return f"""
            INSERT INTO {table} ({", ".join(cols)}, span_start, span_length, text)
            SELECT {", ".join(cols)}, CASE WHEN found > 0 THEN found - 1 END,
                   CASE WHEN found > 0 THEN length(text) END, CASE WHEN found > 0 THEN NULL ELSE text END
            FROM (SELECT x.*, strpos(c.text, x.text) AS found
                  FROM (SELECT *, rowid AS lh_row FROM lh_old_{table} WHERE hash(chunk_id) % $n = $b) x
                  LEFT JOIN (SELECT namespace, chunk_id, text FROM chunks WHERE hash(chunk_id) % $n = $b) c
                  ON c.namespace = x.namespace AND c.chunk_id = x.chunk_id)
            ORDER BY lh_row"""

    _rewrite(con, path, stale, "store facts' texts as places in their chunks' texts", n, statement)


def _rewrite(con: duckdb.DuckDBPyConnection, path: Path, stale: list[str], what: str, n_chunks: int, statement) -> None:
    """The migrations' common course: each table of `stale` renamed aside (`lh_old_<table>`), created again as the
    schema declares it and filled by `statement(table)`, a bucket of MIGRATION_CHUNKS of `n_chunks` chunks at a time
    (its `$n` and `$b`), all in one transaction; then the old tables dropped."""
    log.warning("%s: rewriting %s to %s: once", path, ", ".join(stale), what)
    con.execute("SET enable_progress_bar = false")
    buckets = max(1, -(-n_chunks // MIGRATION_CHUNKS))
    with transaction(con):
        for table in stale:
            con.execute(f"ALTER TABLE {table} RENAME TO lh_old_{table}")
            con.execute(_schema_tables()[table])
            sql = statement(table)
            for bucket in range(buckets):
                con.execute(sql, {"n": buckets, "b": bucket})
            con.execute(f"DROP TABLE lh_old_{table}")
    con.execute("CHECKPOINT")


@lru_cache(maxsize=None)
def _schema_columns(table: str) -> tuple[str, ...]:
    """The stored columns of `table` as schema.sql declares it."""
    with duckdb.connect() as con:
        con.execute(_schema_tables()[table])
        return tuple(stored_columns(con, table))


def _migrate_descriptions(con: duckdb.DuckDBPyConnection, path: Path) -> list[str]:
    """Staging tables written before descriptions referred to facts (every description as text): rewritten once,
    each description that is the start of one of its chunk's facts replaced by that fact's index, the way the
    staging load stores it (lazyhippo.stages.extractions), a bucket of MIGRATION_CHUNKS chunks per statement (the
    facts' starts of the bucket are what a statement holds). The tables rewritten."""
    have = {t for (t,) in con.execute(
        "SELECT table_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND column_name = 'fact_idx' AND table_name IN (SELECT unnest(?))", [list(DESCRIBED)]).fetchall()}
    stale = [t for t in DESCRIBED if t not in have]
    if not stale:
        return stale
    n = con.execute("SELECT count(DISTINCT chunk_id) FROM extracted_facts").fetchall()[0][0]

    def statement(table: str) -> str:
        old = set(stored_columns(con, f"lh_old_{table}"))
        cols = [c for c in stored_columns(con, table) if c in old and c != "description"]
        return f"""
            INSERT INTO {table} ({", ".join(cols)}, description, fact_idx)
            SELECT {", ".join(f"x.{c}" for c in cols)}, CASE WHEN f.fact_idx IS NULL THEN x.description END,
                   f.fact_idx
            FROM (SELECT *, rowid AS lh_row FROM lh_old_{table} WHERE hash(chunk_id) % $n = $b) x
            LEFT JOIN (SELECT namespace, chunk_id, left(text, {DESCRIPTION_HEAD}) AS head,
                              min(fact_idx) AS fact_idx
                       FROM {fact_texts("extracted_facts", con)} WHERE hash(chunk_id) % $n = $b
                       GROUP BY namespace, chunk_id, head) f
            ON f.namespace = x.namespace AND f.chunk_id = x.chunk_id AND f.head = x.description
            ORDER BY x.lh_row"""

    _rewrite(con, path, stale, "store descriptions as references to their sentences", n, statement)
    return stale


def _migrate_places(con: duckdb.DuckDBPyConnection, path: Path, again: list[str]) -> None:
    """Staging tables written before names were places in their fact's names (every name as text): rewritten
    once, each name found in the names of the fact its description refers to replaced by its place there, the way
    the staging load stores it, a bucket of MIGRATION_CHUNKS chunks per statement. `again`: tables just rewritten
    by _migrate_descriptions, with every name as text."""
    have = {t for (t,) in con.execute(
        "SELECT table_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND table_name || '.' || column_name IN (SELECT unnest(?))",
        [[f"{t}.{next(iter(p.values()))}" for t, p in PLACED.items()]]).fetchall()}
    stale = [t for t in PLACED if t not in have or t in again]
    if not stale:
        return
    n = con.execute("SELECT count(DISTINCT chunk_id) FROM extracted_facts").fetchall()[0][0]

    def statement(table: str) -> str:
        placed = PLACED[table]
        cols = [c for c in stored_columns(con, table) if c not in (*placed, *placed.values())]
        held = [c for c in stored_columns(con, f"lh_old_{table}") if c in placed.values()]  # all NULL
        old = f"* EXCLUDE ({', '.join(held)})" if held else "*"
        return f"""
            INSERT INTO {table} ({", ".join([*cols, *placed, *placed.values()])})
            SELECT {", ".join(cols)},
                   {", ".join(f"CASE WHEN {p} IS NULL THEN {c} END" for c, p in placed.items())},
                   {", ".join(placed.values())}
            FROM (SELECT x.*, {", ".join(f"list_position(f.names, x.{c}) AS {p}" for c, p in placed.items())}
                  FROM (SELECT {old}, rowid AS lh_row FROM lh_old_{table}
                        WHERE hash(chunk_id) % $n = $b) x
                  LEFT JOIN (SELECT * FROM extracted_facts WHERE hash(chunk_id) % $n = $b) f
                  ON f.namespace = x.namespace AND f.chunk_id = x.chunk_id AND f.fact_idx = x.fact_idx)
            ORDER BY lh_row"""

    _rewrite(con, path, stale, "store names as places in their sentences", n, statement)


def _owns(settings: Settings) -> bool:
    return _HELD.get(settings.home.resolve()) == threading.get_ident()


def read_path(settings: Settings) -> Path | None:
    """The file a reader of `settings` opens: its run's work file inside a run, else the published snapshot."""
    return settings.db_path if _owns(settings) else _published(settings)


@contextmanager
def connect(settings: Settings, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """Writers get the work file (inside a run, or a caller that owns the home); readers get the published
    snapshot, except inside this process's own run, which reads what it has written so far."""
    writer = None
    if read_only and not _owns(settings):
        path = _published(settings)
        if path is not None:
            con = _with_functions(_bounded(duckdb.connect(str(path), read_only=True)))
        else:  # nothing complete yet: an empty in-memory warehouse with the schema
            con = duckdb.connect()
            con.execute((SQL_DIR / "schema.sql").read_text())
            _with_functions(con)
    else:
        writer = settings.db_path.resolve()
        with _SHARING:
            con = _open_writer(settings)
            _WRITERS[writer] += 1
    try:
        yield con
    finally:
        con.close()
        if writer is not None:
            _WRITERS[writer] -= 1


_IN_TRANSACTION: set[int] = set()  # ids of connections inside transaction()
_WRITERS: Counter[Path] = Counter()  # work file -> writer connections open in this process
_SHARING = threading.RLock()  # no writer connection opens between publish's count of them and its hard link


def _unshare(db_path: Path) -> None:
    """Give the work file its own copy before writing when it is still the published snapshot (`publish` links
    them): readers keep the snapshot as it was. Only when no connection of this process has it open: one would
    keep writing to the old file."""
    try:
        if db_path.stat().st_nlink < 2 or _WRITERS[db_path.resolve()]:
            return
    except FileNotFoundError:
        return
    tmp = db_path.with_name(f".{db_path.name}.{os.getpid()}.tmp")
    shutil.copyfile(db_path, tmp)
    os.replace(tmp, db_path)


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """All or nothing; inside an open transaction() it simply joins it (tracked here: in DuckDB a second BEGIN
    fails and aborts the open transaction)."""
    if id(con) in _IN_TRANSACTION:
        yield con
        return
    con.begin()
    _IN_TRANSACTION.add(id(con))
    try:
        yield con
    except BaseException:
        con.rollback()
        raise
    else:
        con.commit()
    finally:
        _IN_TRANSACTION.discard(id(con))


def replace_rows(con: duckdb.DuckDBPyConnection, table: str, namespace: str, rows: pa.Table | None,
                 where: str = "", params: Sequence = ()) -> int:
    """Delete this namespace's rows (optionally narrowed by `where`) and insert `rows`, in one transaction."""
    with transaction(con):
        con.execute(f"DELETE FROM {table} WHERE namespace = ? {where}", [namespace, *params])
        return insert_rows(con, table, rows)


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table | None) -> int:
    """Append `rows` (columns by name) to `table`. They go in through a reader of their batches: DuckDB keeps a
    registered Arrow table alive until the transaction commits, so a loop of inserts in one transaction held
    every batch it inserted (840 MB when collecting the extractions of 10,000 documents)."""
    import pyarrow as pa

    if rows is None or rows.num_rows == 0:
        return 0
    con.register("_incoming", pa.RecordBatchReader.from_batches(rows.schema, iter(rows.to_batches())))
    try:
        cols = ", ".join(rows.column_names)
        con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _incoming")
    finally:
        con.unregister("_incoming")
    return rows.num_rows


def community_members(con: duckdb.DuckDBPyConnection, namespace: str, columns: str = "m.community_id, m.entity_id",
                      order: str = "m.community_id, e.name", qualify: str = "", where: str = "") -> list[tuple]:
    """Every (community, entity) pair at every level: an entity belongs to its finest community
    (entity_scores) and to each ancestor of it (communities.parent_id). `columns` select from m (community_id,
    entity_id, level) joined to e (entities) and s (entity_scores, the finest level); `where`, a condition on
    them, and `qualify`, a window condition, keep some rows only (DuckDB filters them: the whole graph's rows
    never reach Python)."""
    return con.execute(community_members_sql(columns, order, qualify, where), {"ns": namespace}).fetchall()


def community_members_sql(columns: str = "m.community_id, m.entity_id", order: str = "m.community_id, e.name",
                          qualify: str = "", where: str = "") -> str:
    """The query of `community_members` (its namespace the parameter $ns), for a caller that reads its rows
    otherwise than as Python tuples."""
    return f"""
        WITH RECURSIVE m(community_id, entity_id, level) AS (
            SELECT s.community_id, s.entity_id, c.level FROM entity_scores s
            JOIN communities c ON c.namespace = s.namespace AND c.community_id = s.community_id WHERE s.namespace = $ns
            UNION ALL
            SELECT c.parent_id, m.entity_id, c.level - 1 FROM m
            JOIN communities c ON c.namespace = $ns AND c.community_id = m.community_id WHERE c.parent_id IS NOT NULL)
        SELECT {columns} FROM m
        JOIN entities e ON e.namespace = $ns AND e.entity_id = m.entity_id
        JOIN entity_scores s ON s.namespace = $ns AND s.entity_id = m.entity_id
        {f"WHERE {where}" if where else ""}
        {f"QUALIFY {qualify}" if qualify else ""}
        ORDER BY {order}"""


# a model's key among its stored columns (a relation's id derives from its pair)
MODEL_KEYS = {"entities": ("entity_id",), "relations": ("source_id", "target_id"), "mentions": ("chunk_id", "entity_id"),
              "facts": ("fact_id",)}
# the order a rebuilt model's rows are stored in where its SQL gives none: a chunk's mentions side by side, so each
# chunk id is stored once per run of rows (mentions at 100,000 documents 89 -> 60 MB)
STORAGE_ORDER = {"mentions": "chunk_id, entity_id"}


def name_keys(con: duckdb.DuckDBPyConnection, namespace: str) -> int:
    """The temporary table `lh_names` the SQL models join: every name the namespace's extractions use, with its
    normalized key and entity id, so `lh_norm` (Python) runs once per distinct name, not once per row."""
    con.execute("""CREATE OR REPLACE TEMP TABLE lh_names AS
        SELECT name, norm_name, 'e_' || substr(sha256(norm_name), 1, 16) AS entity_id
        FROM (SELECT name, lh_norm(name) AS norm_name FROM (
            SELECT name FROM extracted_entities WHERE namespace = $ns AND name IS NOT NULL
            UNION SELECT source FROM extracted_relations WHERE namespace = $ns AND source IS NOT NULL
            UNION SELECT target FROM extracted_relations WHERE namespace = $ns AND target IS NOT NULL
            UNION SELECT unnest(names) FROM extracted_facts WHERE namespace = $ns))""", {"ns": namespace})
    return con.execute("SELECT count(*) FROM lh_names").fetchall()[0][0]


def chunk_relations(con: duckdb.DuckDBPyConnection, namespace: str, per_chunk: int, names: str | None = None) -> int:
    """The temporary table `lh_relations` the SQL models read instead of extracted_relations: each chunk's
    co-occurrence pairs between two distinct named entities, at most `per_chunk` of them (0: all), strongest
    first. A pair's strength is its association: its co-occurrence weight summed over the corpus against the
    geometric mean of the two entities' chunk counts (two rare names seen together say more than two names found
    everywhere); ties go by the weight in the chunk, then the names (a fixed order). The default keeps every
    pair: each cap measured cost retrieval (docs/decisions.md). `names` (a table of names, without a cap: a cap
    ranks by corpus-wide strengths) keeps only the pairs with an end among them. Descriptions stay as stored (a
    fact's index, else text): the models read the facts' text once per fact, not once per pair."""
    if names and per_chunk:
        raise ValueError("chunk_relations: a cap on relations per chunk needs every pair, not those of some names")
    some = f"AND (r.source IN (SELECT name FROM {names}) OR r.target IN (SELECT name FROM {names}))" if names else ""
    raw = f"""SELECT r.chunk_id, r.source, r.target, r.fact_idx, r.description, r.weight, r.type,
                     a.entity_id AS source_id, b.entity_id AS target_id,
                     least(a.entity_id, b.entity_id) AS lo, greatest(a.entity_id, b.entity_id) AS hi
              FROM ({named("extracted_relations")}) r
              JOIN lh_names a ON a.name = r.source JOIN lh_names b ON b.name = r.target
              WHERE a.norm_name <> '' AND b.norm_name <> '' AND a.entity_id <> b.entity_id {some}"""
    kept = f"SELECT * FROM ({raw})" if not per_chunk else f"""
        WITH raw AS ({raw}),
        chunks_of AS (
            SELECT k.entity_id, count(DISTINCT x.chunk_id) AS n
            FROM ({named("extracted_entities")}) x JOIN lh_names k ON k.name = x.name GROUP BY k.entity_id
        ),
        scored AS (
            SELECT raw.*, sum(weight) OVER (PARTITION BY lo, hi)
                          / sqrt(coalesce(a.n, 1) * coalesce(b.n, 1)) AS strength
            FROM raw LEFT JOIN chunks_of a ON a.entity_id = raw.lo LEFT JOIN chunks_of b ON b.entity_id = raw.hi
        )
        SELECT * FROM scored
        QUALIFY row_number() OVER (PARTITION BY chunk_id
                                   ORDER BY strength DESC, weight DESC, lo, hi, source, target) <= $cap"""
    con.execute(f"CREATE OR REPLACE TEMP TABLE lh_relations AS "
                "SELECT chunk_id, source, target, source_id, target_id, fact_idx, description, weight, type "
                f"FROM ({kept})",
                {"ns": namespace, **({"cap": per_chunk} if per_chunk else {})})
    return con.execute("SELECT count(*) FROM lh_relations").fetchall()[0][0]


def extraction_inputs(con: duckdb.DuckDBPyConnection, namespace: str) -> None:
    """The temporary view `lh_facts` the SQL models read: every fact of the namespace (a scoped update replaces it
    by a table of the facts in its scope), their texts as stored (spans); and `lh_sentences`, every fact of the
    namespace with its text, which the descriptions of extracted entities and relations refer to (in any scope)."""
    literal = "'" + namespace.replace("'", "''") + "'"  # a view takes no parameters
    for name, rows in (("lh_facts", "extracted_facts"), ("lh_sentences", fact_texts("extracted_facts"))):
        drop_temp(con, name)
        con.execute(f"CREATE TEMP VIEW {name} AS SELECT * FROM {rows} WHERE namespace = {literal}")


def entity_inputs(con: duckdb.DuckDBPyConnection, namespace: str) -> None:
    """The temporary table `lh_entities` the SQL models read: every extracted entity row of the namespace, names
    read back from their places once (a view joined the facts again at each of the models' reads, which together
    outgrew DuckDB's memory cap); a scoped update makes its own of the rows in its scope."""
    drop_temp(con, "lh_entities")
    con.execute(f"CREATE TEMP TABLE lh_entities AS {named('extracted_entities')}", {"ns": namespace})


def drop_temp(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Drop the temporary table or view `name`, whichever it is."""
    kind = con.execute("SELECT table_type FROM information_schema.tables WHERE table_catalog = 'temp' "
                       "AND table_name = ?", [name]).fetchall()
    if kind:
        con.execute(f"DROP {'VIEW' if kind[0][0] == 'VIEW' else 'TABLE'} temp.{name}")


def _temp_names(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = 'temp'")
            .fetchall()}


def run_sql_model(con: duckdb.DuckDBPyConnection, model: str, namespace: str, scope: str | None = None) -> int:
    """Materialize `dbt_like_sql/<model>.sql` (package data) into the table of that name: the statements that build
    its temporary tables, then its SELECT over $namespace, whose rows go to the temporary table `lh_model`.
    `scope` (a condition on the table's rows) narrows the rows the model replaces to those the update's inputs
    can change (the model, given only those inputs, computes exactly them), and of those only the rows that
    differ are deleted and inserted: an update that touches a few entities writes a few rows. Without a scope
    the namespace's rows are replaced. Temporary tables spill to disk, and are filled before the transaction
    (DuckDB 2.0 loses a large temporary table's rows filled inside one)."""
    *setup, select = [s.query for s in con.extract_statements((SQL_DIR / f"{model}.sql").read_text())]
    cols = ", ".join(stored_columns(con, model))
    key = MODEL_KEYS[model]
    old = f"SELECT {cols} FROM {model} WHERE namespace = $namespace" + (f" AND ({scope})" if scope else "")
    p = {"namespace": namespace}
    before = _temp_names(con)
    try:
        for statement in setup:
            con.execute(statement, p if "$namespace" in statement else None)
        con.execute(f"CREATE OR REPLACE TEMP TABLE lh_model AS SELECT {cols} FROM ({select})", p)
        with transaction(con):
            if scope is None:  # every row replaced: a diff of millions of rows would not fit DuckDB's memory cap
                con.execute(f"DELETE FROM {model} WHERE namespace = $namespace", p)
                order = f" ORDER BY {STORAGE_ORDER[model]}" if model in STORAGE_ORDER else ""
                con.execute(f"INSERT INTO {model} ({cols}) SELECT {cols} FROM lh_model{order}")
            else:  # rows compared by key and a hash of the row: an anti join on narrow columns
                keys = ", ".join(key)
                hashed = f"SELECT {keys}, hash({cols}) AS lh_row FROM"
                con.execute(f"DELETE FROM {model} t USING (SELECT {keys} FROM ({hashed} ({old})) ANTI JOIN "
                            f"({hashed} lh_model) USING ({keys}, lh_row)) d WHERE t.namespace = $namespace AND "
                            f"{' AND '.join(f't.{k} = d.{k}' for k in key)}", p)
                con.execute(f"INSERT INTO {model} ({cols}) SELECT {cols} FROM (SELECT *, hash({cols}) AS lh_row "
                            f"FROM lh_model) ANTI JOIN ({hashed} ({old})) USING ({keys}, lh_row)", p)
        return con.execute("SELECT count(*) FROM lh_model").fetchall()[0][0]
    finally:
        for name in _temp_names(con) - before:
            drop_temp(con, name)


def refresh_degree(con: duckdb.DuckDBPyConnection, namespace: str, entity_ids: list[str] | None = None) -> None:
    """An entity's degree is its number of relations: counted again for `entity_ids` (None: every entity)."""
    only = "" if entity_ids is None else "AND entity_id IN (SELECT unnest($ids::VARCHAR[]))"
    con.execute(f"""UPDATE entities SET degree = coalesce(d.n, 0) FROM (
            SELECT e.entity_id, r.n FROM entities e LEFT JOIN (
                SELECT id, count(*) AS n FROM (
                    SELECT source_id AS id FROM relations WHERE namespace = $ns
                    UNION ALL SELECT target_id FROM relations WHERE namespace = $ns) GROUP BY id) r ON r.id = e.entity_id
            WHERE e.namespace = $ns {only}) d
        WHERE entities.namespace = $ns AND entities.entity_id = d.entity_id""",
                {"ns": namespace, **({} if entity_ids is None else {"ids": entity_ids})})


def count(con: duckdb.DuckDBPyConnection, table: str, namespace: str) -> int:
    # fetchall finishes the result: a relation (con.sql) on this connection would refuse an unfinished one
    return con.execute(f"SELECT count(*) FROM {table} WHERE namespace = ?", [namespace]).fetchall()[0][0]


def has_chunks(settings: Settings) -> bool:
    """Whether the namespace's last complete index holds a chunk: one count where `counts` makes one per table
    (a CLI query checks it before its run)."""
    with connect(settings, read_only=True) as con:
        return count(con, "chunks", settings.namespace) > 0


def counts(settings: Settings) -> dict[str, int]:
    """Rows per table; a snapshot's staging tables by the counts it recorded when published."""
    with connect(settings, read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() "
                                            "WHERE database_name = current_database()").fetchall()}
        recorded = dict(con.execute(f"SELECT table_name, n FROM {SNAPSHOT_COUNTS}").fetchall()) \
            if SNAPSHOT_COUNTS in tables else {}
        return {t: count(con, t, settings.namespace) if t in tables else recorded.get(t, 0) for t in TABLES}


# the stored vector columns: `vector`, each row's int8 codes as one BLOB, and its `scale`; a warehouse written before
# holds the codes as TINYINT[] (or, before the int8 form, a float `vector` alone), which every reader here takes too
VECTOR_COLUMNS = "COLUMNS('^(vector|scale)$')"
# the stored codes: -15..15 steps of each vector's largest magnitude (5 bits), written as int8 (x 8) so every reader
# keeps its int8 arithmetic; zstd stores the fewer distinct bytes in fewer bits (41.3 -> 26.3 MB at 10,000
# documents). 4 bits lowered close pairs' cosines enough to drop up to half the KNN edges PPR walks (>= 0.90); 6 bits
# saved 4 MB less (docs/decisions.md, "Vector codes").
CODE_LEVELS = 15


def int8_rows(vectors: np.ndarray, levels: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Rows of int8 and a float32 scale per row: each value rounded to one of -levels..levels steps of its row's
    largest magnitude / levels, written as that step x (127 // levels), so every reader keeps int8 arithmetic
    whatever the levels (fewer levels: fewer distinct bytes, which zstd stores in fewer bits)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        vectors = vectors.reshape(len(vectors), -1)
    step = 127 // levels
    scale = np.maximum(np.abs(vectors).max(axis=1, initial=0.0), 1e-30) / levels
    codes = np.clip(np.rint(vectors / scale[:, None]), -levels, levels).astype(np.int8)
    return (codes * np.int8(step) if step > 1 else codes), (scale / step).astype(np.float32)


def code_blobs(codes: np.ndarray) -> pa.Array:
    """int8 rows as the BLOBs `embeddings.vector` takes: the row's bytes, no copy."""
    import pyarrow as pa  # here, not with the module: a CLI query reads no Arrow

    codes = np.ascontiguousarray(codes, dtype=np.int8)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(codes.shape[1] if codes.ndim == 2 else 0), len(codes),
                                                [None, pa.py_buffer(codes)])


def quantize(vectors: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """`int8_rows` of `vectors` at CODE_LEVELS as the column `embeddings.vector` takes, and their scales."""
    q, scale = int8_rows(vectors, CODE_LEVELS)
    return code_blobs(q), scale


def numbers(col: "pa.Array | pa.ChunkedArray", dtype, null=0) -> np.ndarray:
    """A fixed-width Arrow column as numpy, `null` where it has none: `to_numpy` and `fill_null` import pandas
    (pyarrow's check for its types), which a query reading the index cache never needs."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_boolean(col.type):  # one bit a value
        out = np.unpackbits(np.frombuffer(col.buffers()[1], dtype=np.uint8), bitorder="little")
        out = out[col.offset:col.offset + len(col)].astype(dtype)
    else:
        out = np.frombuffer(col.buffers()[1], dtype=dtype)[col.offset:col.offset + len(col)]
    if col.null_count:
        bits = np.unpackbits(np.frombuffer(col.buffers()[0], dtype=np.uint8), bitorder="little")
        out = np.where(bits[col.offset:col.offset + len(col)].astype(bool), out, np.asarray(null, dtype=dtype))
    return out


def _codes(col: pa.Array) -> np.ndarray:
    """The rows of a `vector` column (BLOBs of int8 codes, or lists) as a 2-d array, of int8 for codes."""
    import pyarrow as pa

    if pa.types.is_binary(col.type) or pa.types.is_fixed_size_binary(col.type):
        if pa.types.is_fixed_size_binary(col.type):
            width = col.type.byte_width
            start, end = col.offset * width, (col.offset + len(col)) * width
        else:
            offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset:col.offset + len(col) + 1]
            start, end = int(offsets[0]), int(offsets[-1])
            width = (end - start) // len(col) if len(col) else 0
            if not np.all(np.diff(offsets) == width):
                raise ValueError("stored vectors of different lengths in one kind")
        data = col.buffers()[2 if pa.types.is_binary(col.type) else 1]
        return np.frombuffer(data, dtype=np.int8)[start:end].reshape(len(col), width)
    flat = col.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(len(col), -1) if len(col) else flat.reshape(0, 0)


def stored_rows(tbl: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and their scales of a table selected with VECTOR_COLUMNS (a float `vector` of a snapshot
    published before the int8 form is quantized to int8 codes of 255 levels)."""
    rows = _codes(tbl.column("vector").combine_chunks())
    if "scale" not in tbl.column_names:
        return int8_rows(rows)
    return rows.astype(np.int8, copy=False), numbers(tbl.column("scale"), np.float32)


def vector_matrix(tbl: pa.Table) -> np.ndarray:
    """float32 rows of a table selected with VECTOR_COLUMNS (in any stored form)."""
    mat = _codes(tbl.column("vector").combine_chunks()).astype(np.float32)
    if "scale" in tbl.column_names:
        mat *= numbers(tbl.column("scale"), np.float32)[:, None]
    return mat


def float_vectors(codes, scale):  # no annotations: DuckDB evaluates them, and Arrow is imported late
    """The SQL function lh_vector(vector, scale): the float vectors of stored codes (NULL where a row has none),
    a whole batch per call."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codes, scale = codes.combine_chunks(), scale.combine_chunks()
    valid = codes.is_valid()
    have = codes.filter(valid)
    values = _codes(have).astype(np.float32) * numbers(scale.filter(valid), np.float32)[:, None]
    lengths = np.where(numbers(valid, np.bool_), values.shape[1], 0)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.ravel(), pa.float32()), mask=pc.invert(valid))


def vector_type(con: duckdb.DuckDBPyConnection) -> str | None:
    """The stored form of `embeddings.vector` (BLOB; TINYINT[] or FLOAT[] in a file written before), None without it."""
    found = con.execute("SELECT data_type FROM duckdb_columns() WHERE database_name = current_database() "
                        "AND table_name = 'embeddings' AND column_name = 'vector'").fetchall()
    return found[0][0] if found else None


def float_vector_sql(con: duckdb.DuckDBPyConnection, alias: str = "") -> str:
    """A SQL expression of the float vector (for exports and Neo4j), on any stored form."""
    kind = vector_type(con)
    if kind == "BLOB":
        return f"lh_vector({alias}vector, {alias}scale)"
    return f"list_transform({alias}vector, lambda x: x * {alias}scale)" if kind == "TINYINT[]" else f"{alias}vector"


def vector_length_sql(con: duckdb.DuckDBPyConnection) -> str:
    """A SQL expression of a stored vector's dimensions, on any stored form."""
    return "octet_length(vector)" if vector_type(con) == "BLOB" else "len(vector)"


def read_vectors(con: duckdb.DuckDBPyConnection, namespace: str, kind: str) -> tuple[list[str], np.ndarray]:
    tbl = con.sql(f"SELECT item_id, {VECTOR_COLUMNS} FROM embeddings WHERE namespace = ? AND kind = ? ORDER BY item_id",
                  params=[namespace, kind]).to_arrow_table()
    ids = tbl.column("item_id").to_pylist()
    if not ids:
        return [], np.zeros((0, 0), dtype=np.float32)
    return ids, vector_matrix(tbl)


def read_stored_vectors(con: duckdb.DuckDBPyConnection, namespace: str, kind: str,
                        batch: int = 65_536) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Ids (in id order), int8 rows and scales of one kind of vector. DuckDB sorts nothing (an ORDER BY over
    900,000 rows with their vectors fills its memory cap): the ids are read and sorted first, then the rows, in
    the same stored order, go a batch at a time straight to their place in arrays sized up front; never the
    whole table as Arrow lists, nor as float32, nor twice."""
    import pyarrow as pa
    import pyarrow.compute as pc

    where, params = "FROM embeddings WHERE namespace = ? AND kind = ?", [namespace, kind]
    names = con.sql(f"SELECT item_id {where}", params=params).to_arrow_table().column(0)
    order = pc.sort_indices(names).to_numpy()  # byte order, as DuckDB's ORDER BY on VARCHAR
    place = np.empty(len(order), dtype=np.int64)
    place[order] = np.arange(len(order))
    codes, scales = np.empty((len(order), 0), dtype=np.int8), np.empty(len(order), dtype=np.float32)
    at = 0
    for part in con.sql(f"SELECT item_id, {VECTOR_COLUMNS} {where}", params=params).to_arrow_reader(batch):
        if not part.column(0).equals(names.slice(at, part.num_rows).combine_chunks()):
            raise RuntimeError(f"embeddings of {kind}: the rows changed between two reads of one transaction")
        rows, scale = stored_rows(pa.Table.from_batches([part]))
        if not at:  # sized by the first batch's rows
            codes = np.empty((len(order), rows.shape[1]), dtype=np.int8)
        codes[place[at:at + len(rows)]], scales[place[at:at + len(rows)]] = rows, scale
        at += len(rows)
    return names.take(order).to_pylist(), codes, scales


def release_cache(con: duckdb.DuckDBPyConnection) -> None:
    """Give back the table blocks DuckDB keeps cached after a scan (up to its memory cap) before a stage holds
    large arrays of its own (at 900,000 entity vectors read, 170 to 300 MB): its cap lowered for a moment evicts
    them, then LAZYHIPPO_DUCKDB_MEMORY again (the cap of every warehouse connection; DuckDB shows its cap
    rounded, so that is what restores it exactly)."""
    try:
        con.execute("SET memory_limit = '1MB'")
    except duckdb.OutOfMemoryException:
        pass  # more than that is pinned (temporary tables): DuckDB evicted what it could
    con.execute(f"SET memory_limit = '{environment().duckdb_memory}'")


# ---- index runs: one writer at a time, readers on the published snapshot ----

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_state(settings: Settings) -> dict:
    """Per namespace: the latest index run (id, pid, host, status, times) and when it was last published."""
    path = settings.home / _STATE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_state(settings: Settings, **entry) -> None:
    state = read_state(settings)
    state[settings.namespace] = {**state.get(settings.namespace, {}), **entry}
    path = settings.home / _STATE
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def process_alive(pid: int, host: str) -> bool:
    """Whether the process that started a run still runs (only decidable on its own host: assume yes elsewhere)."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def publish(settings: Settings) -> Path:
    """Atomically replace the namespace's snapshot (readers that have the old one open keep it).

    When the work file holds this namespace alone and nothing else of this process has it open, the snapshot
    is the checkpointed work file itself, hard-linked: the index takes its room on disk once, and the next write
    copies the work file first (`_unshare`). Otherwise (other namespaces, whose unfinished runs must stay
    unpublished; a snapshot uploaded for replicas) only what readers read is copied to a new file: the staging
    tables stay in the work file."""
    target = snapshot_path(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    uri = environment().snapshots
    with _SHARING:
        with connect(settings) as con:
            con.execute("SET enable_progress_bar = false")
            alone = not uri and _WRITERS[settings.db_path.resolve()] == 1 and not any(
                con.execute(f"SELECT 1 FROM {t} WHERE namespace <> ? LIMIT 1", [settings.namespace]).fetchall()
                for t in TABLES)
            if alone:
                con.execute("CHECKPOINT")
            else:
                _copy_namespace(con, settings.namespace, tmp)
        if alone:
            try:
                os.link(settings.db_path, tmp)
            except OSError:  # a file system without hard links
                shutil.copyfile(settings.db_path, tmp)
        os.replace(tmp, target)
    if uri:  # servers on other hosts pull it from there (lazyhippo.stores.snapshots)
        from lazyhippo.stores.snapshots import open_store, upload

        store, prefix = open_store(uri)
        upload(store, prefix, settings.namespace, target)
    return target


def _copy_namespace(con: duckdb.DuckDBPyConnection, namespace: str, path: Path) -> None:
    work = con.execute("SELECT current_database()").fetchone()[0]
    # a table takes at least a block: the default 256 KiB made a small index's snapshot 2.5x larger
    con.execute(f"ATTACH '{_sql_quote(path)}' AS lh_snapshot (BLOCK_SIZE {BLOCK_SIZE})")
    try:
        ddl = dict(con.execute("SELECT table_name, sql FROM duckdb_tables() WHERE database_name = ?", [work]).fetchall())
        for table in TABLES:  # readers need the rows (stored as the work file declares them), not the keys
            if table not in STAGING:
                con.execute(re.sub(r",\s*PRIMARY KEY\s*\([^)]*\)", "", ddl[table]).replace(
                    f"CREATE TABLE {table}(", f"CREATE TABLE lh_snapshot.{table}(", 1))
                cols = ", ".join(stored_columns(con, table, work))
                con.execute(f"INSERT INTO lh_snapshot.{table} ({cols}) SELECT {cols} FROM {work}.{table} "
                            "WHERE namespace = ?", [namespace])
        con.execute(f"CREATE TABLE lh_snapshot.{SNAPSHOT_COUNTS} AS SELECT * FROM (VALUES "
                    + ", ".join(f"('{t}', (SELECT count(*) FROM {work}.{t} WHERE namespace = $ns))" for t in STAGING)
                    + ") v(table_name, n)", {"ns": namespace})
    finally:
        con.execute("DETACH lh_snapshot")


def _sql_quote(path: Path) -> str:
    return str(path).replace("'", "''")


def _published(settings: Settings) -> Path | None:
    """The namespace's snapshot, if any complete run published one."""
    path = snapshot_path(settings)
    if not path.exists() and not snapshot_dir(settings).exists() and settings.db_path.exists():
        _publish_legacy(settings)
    return path if path.exists() else None


def _publish_legacy(settings: Settings) -> None:
    """A home indexed before snapshots existed: publish its namespaces once, if no run is busy with it."""
    lock = FileLock(settings.home / _LOCK, thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return
    try:
        with connect(settings) as con:
            names = [r[0] for r in con.execute("SELECT DISTINCT namespace FROM chunks").fetchall()]
        state = read_state(settings)
        for ns in names:
            if state.get(ns, {}).get("status", "complete") == "complete":
                publish(settings.with_(namespace=ns))
        snapshot_dir(settings).mkdir(exist_ok=True)
    finally:
        lock.release()


def republish(settings: Settings) -> bool:
    """Publish the namespace again when its snapshot was deleted but the warehouse holds its complete index;
    False when a run holds the home (it publishes when done) or there is nothing complete to publish."""
    lock = FileLock(settings.home / _LOCK, thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    try:
        if read_state(settings).get(settings.namespace, {}).get("status", "complete") != "complete":
            return False
        with connect(settings) as con:  # the work file: the lock is held
            if not con.execute("SELECT 1 FROM chunks WHERE namespace = ? LIMIT 1", [settings.namespace]).fetchone():
                return False
        publish(settings)
        return True
    finally:
        lock.release()


def index_notice(settings: Settings) -> str | None:
    """What a reader should know about the namespace's latest index run, or None when it is complete.

    Raises IndexIncomplete when there is nothing complete to answer from."""
    entry = read_state(settings).get(settings.namespace)
    if not entry or entry.get("status") == "complete":
        return None
    run = f"index run {entry.get('run_id')} (started {entry.get('started_at')})"
    if entry["status"] == "running" and process_alive(entry.get("pid", 0), entry.get("host", "")):
        what = f"{run} is still in progress"
    elif entry["status"] == "running":
        what = f"{run} did not finish: its process {entry.get('pid')} is gone (killed?)"
    elif entry["status"] == "pending":
        what = f"{run} read new documents; the graph run that publishes them has not finished"
    else:
        what = f"{run} failed"
    published = entry.get("published_at")
    if not published:
        raise IndexIncomplete(f"namespace {settings.namespace!r} has no complete index: the {what}; "
                              "run `lazyhippo index` again")
    return f"the {what}; answering from the last complete index, published {published}"


class WriterSession:
    """One index run's hold on a home: the first write waits for the lock, `finish` publishes on success.

    Used by the library's `run_index` and by the Dagster resource for a whole run (CLI and UI alike), so two
    runs in one home queue behind each other instead of failing on DuckDB's file lock."""

    def __init__(self, settings: Settings, run_id: str, on_wait: Callable[[str], None] | None = None,
                 poll_seconds: float = 1.0):
        self.settings, self.run_id, self.on_wait, self.poll = settings, run_id, on_wait, poll_seconds
        self._lock = FileLock(settings.home / _LOCK, thread_local=False)
        self.waited = 0.0
        self.published = False

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> None:
        if self.held:
            return
        self.settings.home.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            if self.on_wait:
                busy = {ns: e.get("run_id") for ns, e in read_state(self.settings).items() if e.get("status") == "running"}
                self.on_wait(f"waiting for the index run holding {self.settings.home} ({busy or 'unknown run'})")
            self._lock.acquire(poll_interval=self.poll)
        self.waited = time.monotonic() - t0
        _HELD[self.settings.home.resolve()] = threading.get_ident()
        _write_state(self.settings, run_id=self.run_id, pid=os.getpid(), host=socket.gethostname(),
                     status="running", started_at=_now(), finished_at=None)

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self.acquire()
        with connect(self.settings) as con:
            yield con

    def publish(self) -> Path:
        """Publish the namespace now (a Dagster run's last step); `finish` then only lets the next run in."""
        self.acquire()
        target = publish(self.settings)
        _write_state(self.settings, status="complete", finished_at=_now(), published_at=_now())
        self.published = True
        return target

    def finish(self, success: bool, publish_now: bool = True) -> None:
        """Publish (success) or record the failure, then let the next run in. A run that wrote nothing is a no-op.
        Without `publish_now` (a step of a Dagster run, whose own last step publishes) readers keep the last
        complete index: never new chunks beside an old graph."""
        if not self.held:
            return
        try:
            if self.published:
                pass
            elif success and not publish_now:
                _write_state(self.settings, status="pending", finished_at=_now())
            elif success:
                publish(self.settings)
                _write_state(self.settings, status="complete", finished_at=_now(), published_at=_now())
            else:
                _write_state(self.settings, status="failed", finished_at=_now())
        finally:
            _HELD.pop(self.settings.home.resolve(), None)
            self._lock.release(force=True)

    def __enter__(self) -> "WriterSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc_type is None)
