"""`lazyhippo export` writes csv/xlsx/md/parquet files, streamed in batches with bounded memory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from lazyhippo.settings import Settings
from lazyhippo.stages.exports import FORMATS
from lazyhippo.stores.warehouse import WriterSession, connect
from lazyhippo_dagster.cli import app

ROOT = Path(__file__).resolve().parent.parent


def test_every_format_holds_the_rows_of_the_index(sample_settings, tmp_path):
    runner = CliRunner()
    with connect(sample_settings) as con:
        n_entities = con.execute("SELECT count(*) FROM entities WHERE namespace = 'default'").fetchone()[0]
        names = {r[0] for r in con.execute("SELECT name FROM entities WHERE namespace = 'default'").fetchall()}
    for fmt in FORMATS:
        out = runner.invoke(app, ["export", "--format", fmt, "--tables", "entities,relations,chunks,facts",
                                  "--out", str(tmp_path / fmt), "--home", str(sample_settings.home), "--batch-rows", "7"])
        assert out.exit_code == 0, out.output
    assert set(pq.read_table(tmp_path / "parquet" / "entities.parquet")["name"].to_pylist()) == names
    assert pcsv.read_csv(tmp_path / "csv" / "entities.csv").num_rows == n_entities
    assert "entity_ids" in pcsv.read_csv(tmp_path / "csv" / "facts.csv").column_names  # list columns flattened
    md = (tmp_path / "md" / "entities.md").read_text().splitlines()
    assert md[0] == "# entities" and len([line for line in md if line.startswith("| ")]) == n_entities + 1
    with zipfile.ZipFile(tmp_path / "xlsx" / "lazyhippo.xlsx") as book:  # xlsx: one XML part per sheet
        sheet_names = re.findall(r'<sheet name="([^"]+)"', book.read("xl/workbook.xml").decode())
        sheet = book.read(f"xl/worksheets/sheet{sheet_names.index('entities') + 1}.xml")
    assert sheet.decode().count("<row ") == n_entities + 1  # header + one row per entity


def test_bad_options_fail_before_work_naming_the_option(sample_settings, tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["export", "--format", "json", "--home", str(sample_settings.home), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--format 'json'" in bad.output
    bad = runner.invoke(app, ["export", "--tables", "entities,nope", "--home", str(sample_settings.home), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "nope" in bad.output and not (tmp_path / "x").exists()


def test_include_vectors_adds_each_rows_embedding(sample_settings, tmp_path):
    with connect(sample_settings) as con:
        stored = {(kind, item): vec for kind, item, vec in con.execute(
            "SELECT kind, item_id, lh_vector(vector, scale) FROM embeddings WHERE namespace = 'default'").fetchall()}
    runner = CliRunner()
    home = str(sample_settings.home)
    out = runner.invoke(app, ["export", "--format", "parquet", "--tables", "chunks,entities,relations",
                              "--include-vectors", "--out", str(tmp_path / "with"), "--home", home])
    assert out.exit_code == 0, out.output
    for table, kind, key in (("chunks", "chunk", "chunk_id"), ("entities", "entity", "entity_id")):
        rows = pq.read_table(tmp_path / "with" / f"{table}.parquet").to_pylist()
        assert rows and all(r["vector"] == pytest.approx(stored[(kind, r[key])]) for r in rows)
    assert "vector" not in pq.read_table(tmp_path / "with" / "relations.parquet").column_names  # not embedded
    out = runner.invoke(app, ["export", "--format", "csv", "--tables", "chunks", "--out", str(tmp_path / "without"),
                              "--home", home])
    assert out.exit_code == 0 and "vector" not in pcsv.read_csv(tmp_path / "without" / "chunks.csv").column_names


MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
import pyarrow as pa
from lazyhippo.settings import Settings
from lazyhippo.stages.exports import export_tables
from lazyhippo.stores.warehouse import WriterSession, connect
settings = Settings(home=Path(sys.argv[1]), namespace="big")
def hwm(reset=False):  # the process's peak resident size (DuckDB's own allocations included), in bytes
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024
tracemalloc.start()
with connect(settings, read_only=True) as con:
    rss_before = hwm(reset=True)
    done = export_tables(con, "big", sys.argv[2], ["entities"], Path(sys.argv[3]), batch_rows=2000)
    rss_growth = hwm() - rss_before
print(json.dumps({"rows": done[0].rows, "python_peak": tracemalloc.get_traced_memory()[1],
                  "arrow_peak": pa.default_memory_pool().max_memory(), "rss_growth": rss_growth}))
"""


@pytest.fixture(scope="module")
def big_graph(tmp_path_factory) -> Path:
    """50,000 entities with 1 KB descriptions: ~55 MB of rows."""
    home = tmp_path_factory.mktemp("big")
    with WriterSession(Settings(home=home, namespace="big"), "fixture") as writer, writer.connect() as con:  # published
        con.execute("INSERT INTO entities SELECT 'big', 'e_' || i, 'Entity ' || i, 'entity ' || i, 'CONCEPT', "
                    "repeat(chr(97 + (i % 26)::INTEGER), 1000), 1, 1 FROM range(50000) t(i)")
    return home


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_50k_entity_graph_exports_in_bounded_memory(big_graph, tmp_path, fmt):
    out = subprocess.run([sys.executable, "-c", MEASURE, str(big_graph), fmt, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["rows"] == 50_000
    # the rows are ~55 MB; a batch of 2,000 is ~2 MB: what the export holds stays near the batch, not the table
    assert figures["python_peak"] < 16 * 2**20, figures
    assert figures["arrow_peak"] < 16 * 2**20, figures
    # DuckDB's own memory: a result copied whole before the first batch (85-90 MB here) would pass the two above
    assert figures["rss_growth"] < 55 * 2**20, figures


def test_the_exports_asset_sorts_a_slice_at_a_time_and_writes_the_same_objects(sample_settings, tmp_path, monkeypatch):
    """Slices of a table's export order (cut by its leading column, its nulls last) give the rows of one whole
    sort, and the same object to the byte whatever the slices: its row groups are made of batches of the rows
    alone."""
    import io
    import shutil

    from lazyhippo.stages import exports
    from lazyhippo.stores.objects import LocalObjectStore

    s = Settings(home=tmp_path / "home", source=sample_settings.source)
    s.home.mkdir()
    shutil.copy(sample_settings.db_path, s.db_path)
    monkeypatch.setattr(exports, "EXPORT_BATCH_ROWS", 7)
    objects = []
    with connect(s) as con:
        con.execute("UPDATE relations SET description = NULL WHERE source_id IN (SELECT min(source_id) FROM relations)")
        for slice_bytes in (1 << 30, 2048, 1):
            monkeypatch.setattr(exports, "EXPORT_SLICE_BYTES", slice_bytes)
            store = LocalObjectStore(tmp_path / f"objects_{slice_bytes}")
            exports.export_parquet(s, con, store, "r1")
            objects.append({t: store.get(f"default/tables/{t}.parquet") for t in exports.EXPORT_TABLES})
        assert len(exports._cuts(con, "relations", "default")[1]) > 3
        for table in exports.EXPORT_TABLES:
            expected = con.sql(exports.export_query(table), params=["default"]).to_arrow_table()
            assert pq.read_table(io.BytesIO(objects[0][table])).to_pylist() == expected.to_pylist(), table
            assert objects[1][table] == objects[0][table] == objects[2][table], table


SORTED_EXPORT = """
import json, sys
from pathlib import Path
from lazyhippo.settings import Settings
from lazyhippo.stages.exports import export_parquet
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import connect
settings = Settings(home=Path(sys.argv[1]), namespace="big")
with connect(settings, read_only=True) as con:
    Path("/proc/self/clear_refs").write_text("5")
    before = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024
    out = export_parquet(settings, con, LocalObjectStore(Path(sys.argv[2])), "r1")
    growth = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024 - before
print(json.dumps({"rows": out.objects["relations"]["rows"], "rss_growth": growth}))
"""


def test_the_exports_asset_sorts_a_large_table_in_bounded_memory(tmp_path):
    """300,000 relations with 400-character sentences (about 135 MB as Arrow rows): one sort of the whole
    table grew the process by 600 MB; a slice at a time, about 400 MB."""
    home = tmp_path / "home"
    with WriterSession(Settings(home=home, namespace="big"), "fixture") as writer, writer.connect() as con:
        con.execute("INSERT INTO relations (namespace, source_id, target_id, description, weight, n_chunks, type, "
                    "forward) SELECT 'big', 'e_' || (i % 7919), 'e_' || i, 'Sentence ' || (i % 20000) || ' ' || "
                    "repeat(chr(97 + (i % 26)::INTEGER), 400), 1.0, 1, 'RELATED_TO', true FROM range(300000) t(i)")
    out = subprocess.run([sys.executable, "-c", SORTED_EXPORT, str(home), str(tmp_path / "objects")], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["rows"] == 300_000
    assert figures["rss_growth"] < 500 * 2**20, figures
