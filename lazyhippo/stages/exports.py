"""The `exports` asset (Parquet files and a manifest on the object store) and `lazyhippo export`: tables of
one namespace as CSV, XLSX, Markdown or Parquet files.

Rows stream from DuckDB in Arrow record batches and each batch is written before the next is read, so memory
stays bounded by the batch size, not the graph size (a 50,000-entity graph exports in a few MB).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa

from lazyhippo.settings import Settings
from lazyhippo.sources.files import sha
from lazyhippo.stages.results import ExportsResult
from lazyhippo.stores.objects import ObjectStore
from lazyhippo.stores.warehouse import fact_texts, float_vector_sql

FORMATS = ("csv", "xlsx", "md", "parquet")
# zstd level 3 instead of Arrow's 1: most of level 9's saving (relations at 10,000 documents 137 / 105 / 97 MB at
# levels 1 / 3 / 9) for a third of its CPU (0.8 / 1.1 / 3.9 s). Pages of 8 MB instead of 1 MB: zstd compresses
# a page at a time, so a long text column found its repeats within 1 MB only (the exports at 10,000 documents
# 41.2 -> 40.4 MB, the same CPU)
PARQUET_ZSTD = {"compression": "zstd", "compression_level": 3, "data_page_size": 8 << 20}
EXPORTABLE = ("documents", "chunks", "entities", "relations", "mentions", "facts", "knn_edges", "entity_scores",
              "communities", "community_summaries")
DEFAULT_TABLES = ("entities", "relations", "chunks")
EXPORT_BATCH_ROWS = 50_000  # rows of a table read at once while the exports asset writes it
# rows of a Parquet row group: up to this many bytes of batches are gathered first (a row group per batch kept
# each column chunk's dictionary and zstd window to 50,000 rows: relations at 100,000 documents 303 -> 290 MB;
# 64 MB groups, 285 MB for twice the memory)
ROW_GROUP_BYTES = 32 << 20
# bytes of a table's rows (as Arrow holds them) DuckDB sorts at once while the exports asset writes it; a sample
# of SLICE_SAMPLE_ROWS rows gives the row width and the slices' bounds
EXPORT_SLICE_BYTES = 16 << 20
SLICE_SAMPLE_ROWS = 4096
# rows DuckDB hands over at once to the exports asset (it holds a few batches ahead: a scan of the relations at
# 10,000 documents 125 MB in batches of 50,000 rows, 43 MB in batches of 10,000)
READ_ROWS = 8192
XLSX_MAX_ROWS = 1_048_575  # Excel's sheet limit, minus the header


@dataclass(frozen=True)
class Exported:
    table: str
    path: Path
    rows: int


def check_request(fmt: str, tables: list[str]) -> None:
    """Bad options fail before anything is read or written, naming the option and the allowed values."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    unknown = [t for t in tables if t not in EXPORTABLE]
    if unknown or not tables:
        raise ValueError(f"--tables {','.join(unknown) or '(empty)'}: choose from {', '.join(EXPORTABLE)}")


# tables whose rows are embedded: the kind of their vectors and their id column
VECTORS = {"chunks": ("chunk", "chunk_id"), "entities": ("entity", "entity_id"), "facts": ("fact", "fact_id"),
           "community_summaries": ("community", "community_id")}


def _rows(table: str, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """What a reader reads of `table`: the facts with their texts read back from their spans (schema.sql)."""
    return fact_texts(table, con) if table == "facts" else table


def batches(con: duckdb.DuckDBPyConnection, table: str, namespace: str, batch_rows: int,
            include_vectors: bool = False) -> Iterator[pa.RecordBatch]:
    """The namespace's rows of `table` (without the namespace column), batch by batch, in stored order (a sort
    would hold the whole table); with `include_vectors`, an embedded table gains each row's `vector` (null when
    the row has none)."""
    # a relation streams; a DB-API result (con.execute) would first copy every row into DuckDB's memory
    if include_vectors and table in VECTORS:
        kind, key = VECTORS[table]
        sql = (f"SELECT t.* EXCLUDE (namespace), {float_vector_sql(con, 'e.')} AS vector "
               f"FROM {_rows(table, con)} t LEFT JOIN embeddings e ON "
               f"e.namespace = t.namespace AND e.kind = ? AND e.item_id = t.{key} WHERE t.namespace = ?")
        params = [kind, namespace]
    else:
        sql, params = f"SELECT * EXCLUDE (namespace) FROM {_rows(table, con)} WHERE namespace = ?", [namespace]
    yield from con.sql(sql, params=params).to_arrow_reader(batch_rows)


def _cell(v) -> object:
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return v


def _md(v) -> str:
    return "" if v is None else str(_cell(v)).replace("|", "\\|").replace("\n", " ")


class _Writer:
    """One output per table (one workbook sheet per table for xlsx); written atomically through a temp file."""

    def __init__(self, fmt: str, out: Path):
        self.fmt, self.out = fmt, out
        self.book = None
        if fmt == "xlsx":
            import xlsxwriter

            self.book_path = out / "lazyhippo.xlsx"
            self.book = xlsxwriter.Workbook(str(self.book_path) + ".tmp", {"constant_memory": True, "strings_to_urls": False})

    def write(self, table: str, stream: Iterator[pa.RecordBatch]) -> Exported:
        if self.fmt == "xlsx":
            return self._xlsx(table, stream)
        path = self.out / f"{table}.{self.fmt}"
        tmp = path.with_name(path.name + ".tmp")
        rows = {"parquet": self._parquet, "csv": self._csv, "md": self._markdown}[self.fmt](tmp, table, stream)
        os.replace(tmp, path)
        return Exported(table, path, rows)

    @staticmethod
    def _parquet(tmp: Path, table: str, stream) -> int:
        import pyarrow.parquet as pq

        rows, writer = 0, None
        try:
            for batch in stream:
                writer = writer or pq.ParquetWriter(tmp, batch.schema, **PARQUET_ZSTD)
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer:
                writer.close()
        if writer is None:
            tmp.write_bytes(b"")
        return rows

    @staticmethod
    def _csv(tmp: Path, table: str, stream) -> int:
        import pyarrow.csv as pcsv

        rows, writer = 0, None
        with open(tmp, "wb") as f:
            for batch in stream:
                flat = pa.RecordBatch.from_arrays(
                    [pa.array([_cell(v) for v in col.to_pylist()], pa.string()) if pa.types.is_list(col.type) else col
                     for col in batch.columns], names=batch.schema.names)
                writer = writer or pcsv.CSVWriter(f, flat.schema)
                writer.write_batch(flat)
                rows += batch.num_rows
            if writer:
                writer.close()
        return rows

    @staticmethod
    def _markdown(tmp: Path, table: str, stream) -> int:
        rows = 0
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"# {table}\n\n")
            for batch in stream:
                if rows == 0:
                    f.write("| " + " | ".join(batch.schema.names) + " |\n|" + "---|" * batch.num_columns + "\n")
                for row in batch.to_pylist():
                    f.write("| " + " | ".join(_md(v) for v in row.values()) + " |\n")
                rows += batch.num_rows
        return rows

    def _xlsx(self, table: str, stream) -> Exported:
        sheet = self.book.add_worksheet(table[:31])
        rows = 0
        for batch in stream:
            if rows == 0:
                sheet.write_row(0, 0, batch.schema.names)
            if rows + batch.num_rows > XLSX_MAX_ROWS:
                raise ValueError(f"table {table} has more than {XLSX_MAX_ROWS} rows, Excel's sheet limit: "
                                 "export it as csv or parquet")
            for row in batch.to_pylist():
                rows += 1
                sheet.write_row(rows, 0, [_cell(v) for v in row.values()])
        return Exported(table, self.book_path, rows)

    def close(self) -> None:
        if self.book is not None:
            self.book.close()
            os.replace(str(self.book_path) + ".tmp", self.book_path)


def export_tables(con: duckdb.DuckDBPyConnection, namespace: str, fmt: str, tables: list[str], out: Path,
                  batch_rows: int = 5000, include_vectors: bool = False) -> list[Exported]:
    check_request(fmt, tables)
    out.mkdir(parents=True, exist_ok=True)
    writer = _Writer(fmt, out)
    try:
        return [writer.write(t, batches(con, t, namespace, batch_rows, include_vectors)) for t in tables]
    finally:
        writer.close()


EXPORT_TABLES = ("documents", "chunks", "entities", "relations", "mentions", "facts", "knn_edges",
                 "entity_scores", "communities", "community_summaries", "community_reports")


# the order an exported table's rows are written in, ahead of all its columns: texts that repeat side by side
# (a relation's description is the sentence its pair came from, an entity's the sentences that named it), so
# zstd and the dictionaries find them (at 10,000 documents: relations 6x smaller, entities 10.7 -> 7.4 MB,
# facts 7.7 -> 6.9, documents 4.7 -> 4.2, chunks 5.1 -> 4.9)
EXPORT_ORDER = {"documents": "source", "chunks": "doc_id, position", "entities": "description",
                "relations": "description", "facts": "text"}
# columns a reader derives, left out of the objects: relation_id is 'r_' || the first 16 hex digits of
# sha256(source_id || '|' || target_id) (7.2 of the relations object's 16.4 MB at 10,000 documents)
DERIVED = {"relations": "relation_id"}


def _fingerprint(con: duckdb.DuckDBPyConnection, table: str, namespace: str) -> str:
    """Of the namespace's rows of `table`, its columns and the form of its object (query and Parquet options):
    equal fingerprints, the same Parquet object (its rows are written sorted), found with one scan instead of a
    sort and a compression. An object written in another form is written again, once."""
    columns = con.execute(f"SELECT string_agg(column_name || ' ' || column_type, ',') "
                          f"FROM (DESCRIBE {table})").fetchall()[0][0]
    n, h = con.execute(f"SELECT count(*), coalesce(sum(hash(t)::HUGEINT), 0) FROM {table} t WHERE namespace = ?",
                       [namespace]).fetchall()[0]
    form = sha(f"{export_query(table)}:{sorted(PARQUET_ZSTD.items())}", 16)
    return f"{n}:{h}:{columns}:{form}"


def export_query(table: str) -> str:
    """The namespace's rows of `table` as its Parquet object holds them: without the derived columns, in a total
    order (equal rows give an equal object) led by EXPORT_ORDER."""
    return f"{_export_select(table)} FROM {_rows(table)} WHERE namespace = ? ORDER BY {_export_order(table)}"


def _export_select(table: str) -> str:
    return f"SELECT * EXCLUDE ({DERIVED[table]})" if table in DERIVED else "SELECT *"


def _export_order(table: str) -> str:
    # COLUMNS(*) are the columns of the FROM (a derived column too)
    return f"{EXPORT_ORDER[table]}, COLUMNS(*)" if table in EXPORT_ORDER else "ALL"


def _cuts(con: duckdb.DuckDBPyConnection, table: str, namespace: str) -> tuple[str, list]:
    """The leading column of the export order of `table` and the values that cut it into slices of about
    EXPORT_SLICE_BYTES (quantiles of a sample; none when the table is one slice)."""
    rows = con.execute(f"SELECT count(*) FROM {table} WHERE namespace = ?", [namespace]).fetchall()[0][0]
    sample = con.sql(f"SELECT * FROM {_rows(table, con)} WHERE namespace = ? "
                     f"USING SAMPLE reservoir({SLICE_SAMPLE_ROWS} ROWS) "
                     "REPEATABLE (1)", params=[namespace]).to_arrow_table()
    # the namespace is one value here: ORDER BY ALL is led by the first other column
    lead = (EXPORT_ORDER[table].split(",")[0] if table in EXPORT_ORDER
            else next(c for c in con.sql(f"{_export_select(table)} FROM {_rows(table, con)}").columns
                      if c != "namespace"))
    parts = -(-rows * sample.nbytes // max(sample.num_rows, 1) // EXPORT_SLICE_BYTES)
    if parts <= 1:
        return lead, []
    quantiles = [i / parts for i in range(1, parts)]
    sql = f"SELECT quantile_disc({lead}, {quantiles}) FROM sample"
    cuts = con.from_arrow(sample).query("sample", sql).fetchall()[0][0]
    return lead, [c for i, c in enumerate(cuts or []) if c is not None and (i == 0 or c != cuts[i - 1])]


def _slice_of(lead: str, cuts: list, lo: int, hi: int) -> tuple[str, list]:
    """SQL for the slice (lo..hi) a row's `lead` falls in, by binary search over the ascending `cuts` (slice i:
    from cuts[i - 1] up to cuts[i]), and its parameters in order: DuckDB compares as its sort does."""
    if lo == hi:
        return str(lo), []
    mid = (lo + hi + 1) // 2
    low, low_params = _slice_of(lead, cuts, lo, mid - 1)
    high, high_params = _slice_of(lead, cuts, mid, hi)
    return f"CASE WHEN {lead} < ? THEN {low} ELSE {high} END", [cuts[mid - 1], *low_params, *high_params]


def _slices(con: duckdb.DuckDBPyConnection, table: str, namespace: str, spill: Path) -> Iterator[pa.Table]:
    """The rows of `table` cut into consecutive slices of its export order (unsorted within one), in that order,
    with one scan: each row goes to its slice's Arrow file under `spill`, then the slices are read back one at a
    time (memory-mapped). One sort of the whole table filled DuckDB's cap (relations at 10,000 documents:
    500 MB to write a 9 MB object); a scan per slice cost a whole scan each."""
    import numpy as np

    lead, cuts = _cuts(con, table, namespace)
    if not cuts:
        yield con.sql(f"SELECT * FROM {_rows(table, con)} WHERE namespace = ?", params=[namespace]).to_arrow_table()
        return
    tree, params = _slice_of(lead, cuts, 0, len(cuts))
    nulls = len(cuts) + 1  # the order sorts nulls last
    reader = con.sql(f"SELECT *, CASE WHEN {lead} IS NULL THEN {nulls} ELSE {tree} END AS slice_ "
                     f"FROM {_rows(table, con)} WHERE namespace = ?", params=[*params, namespace]
                     ).to_arrow_reader(READ_ROWS)
    schema = reader.schema.remove(reader.schema.get_field_index("slice_"))
    spill.mkdir(parents=True, exist_ok=True)
    writers = {}
    try:
        for batch in reader:
            ids = batch.column("slice_").to_numpy()
            order = np.argsort(ids, kind="stable")
            rows = batch.drop_columns(["slice_"]).take(pa.array(order))
            starts = np.searchsorted(ids[order], np.arange(nulls + 2))
            for k in np.unique(ids):
                if k not in writers:
                    writers[k] = pa.ipc.new_file(spill / f"{k}.arrow", schema)
                writers[k].write_batch(rows.slice(starts[k], starts[k + 1] - starts[k]))
    finally:
        for writer in writers.values():
            writer.close()
    for k in sorted(writers):
        with pa.memory_map(str(spill / f"{k}.arrow")) as source:
            yield pa.ipc.open_file(source).read_all()
        (spill / f"{k}.arrow").unlink()
    spill.rmdir()


def _sorted_batches(con: duckdb.DuckDBPyConnection, table: str, namespace: str,
                    spill: Path) -> Iterator[pa.RecordBatch]:
    """The rows of export_query(table), DuckDB sorting one slice at a time, in batches of exactly
    EXPORT_BATCH_ROWS (the last one short): the object's row groups depend on the rows alone, not on the slices
    nor on DuckDB's chunks."""
    pending, held = [], 0
    for part in _slices(con, table, namespace, spill):
        sql = f"{_export_select(table)} FROM part ORDER BY {_export_order(table)}"
        reader = con.from_arrow(part).query("part", sql).to_arrow_reader(READ_ROWS)
        for batch in reader:
            pending.append(batch)
            held += batch.num_rows
            while held >= EXPORT_BATCH_ROWS:
                rows = pa.Table.from_batches(pending, reader.schema)
                yield rows.slice(0, EXPORT_BATCH_ROWS).combine_chunks().to_batches()[0]
                pending, held = rows.slice(EXPORT_BATCH_ROWS).to_batches(), held - EXPORT_BATCH_ROWS
    if held:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]


def _sorted_parquet(con: duckdb.DuckDBPyConnection, table: str, namespace: str, path: Path) -> int:
    """The namespace's rows of `table`, sorted (equal rows, the same object), written to `path` as zstd Parquet
    a row group at a time: memory holds one slice's sort and one group (ROW_GROUP_BYTES of batches), never the
    whole table nor its compressed object; the slices wait beside `path`. Arrow's allocator keeps what a group
    freed unless asked (mimalloc: about 100 MB after the relations at 10,000 documents)."""
    import pyarrow.parquet as pq

    schema = con.sql(f"{_export_select(table)} FROM {_rows(table, con)} LIMIT 0").to_arrow_table().schema
    rows, group = 0, []
    with pq.ParquetWriter(path, schema, **PARQUET_ZSTD) as writer:
        def flush() -> None:
            part = pa.Table.from_batches(group, schema)
            writer.write_table(part, row_group_size=max(part.num_rows, 1))
            group.clear()
            pa.default_memory_pool().release_unused()

        for batch in _sorted_batches(con, table, namespace, path.with_name(path.name + ".slices")):
            group.append(batch)
            rows += batch.num_rows
            if sum(b.nbytes for b in group) >= ROW_GROUP_BYTES:
                flush()
        if group:
            flush()
    return rows


def export_parquet(settings: Settings, con: duckdb.DuckDBPyConnection, store: ObjectStore, run_id: str = "manual") -> ExportsResult:
    """One Parquet object per table under `<namespace>/tables/`, plus a manifest per run and the latest one as
    `<namespace>/tables/manifest.json` (written last, in one put). A table whose rows are those the latest manifest recorded (same fingerprint) is not written again."""
    ns = settings.namespace
    latest_key = f"{ns}/tables/manifest.json"
    try:
        latest = json.loads(store.get(latest_key))
    except FileNotFoundError:
        latest = {}
    manifest, written = {}, []
    for table in EXPORT_TABLES:
        fingerprint = _fingerprint(con, table, ns)
        if latest.get(table, {}).get("fingerprint") == fingerprint:
            manifest[table] = latest[table]
            continue
        key = f"{ns}/tables/{table}.parquet"
        with tempfile.TemporaryDirectory(prefix="lazyhippo-export-") as tmp:
            path = Path(tmp) / f"{table}.parquet"
            rows = _sorted_parquet(con, table, ns, path)
            manifest[table] = {"key": key, "rows": rows, "bytes": path.stat().st_size, "md5": store.put_file(key, path),
                               "fingerprint": fingerprint}
        written.append(table)
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    store.put(f"{ns}/runs/{run_id}/manifest.json", body)
    store.put(latest_key, body)
    return ExportsResult(objects=manifest, store=store.uri, run_key=f"{ns}/runs/{run_id}/manifest.json", written=written)
