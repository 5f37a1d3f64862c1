"""Bad input becomes a per-file report and never stops or corrupts a run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import pytest

from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.sources.files import MAX_WORD_CHARS, read_source
from lazyhippo.stages.chunks import build_chunks
from lazyhippo.stages.documents import ingest_documents
from lazyhippo.stores.warehouse import connect, counts

BAD_PDFS = Path(__file__).resolve().parent.parent.parent / "shared" / "badinput" / "pdfs"


def _ingest(settings: Settings):
    with connect(settings) as con:
        return ingest_documents(settings, con)


def _errors(settings: Settings) -> dict[str, str]:
    with connect(settings) as con:
        return dict(con.execute("SELECT source, reason FROM document_errors WHERE namespace = ?",
                                [settings.namespace]).fetchall())


@pytest.mark.skipif(not BAD_PDFS.exists(), reason="shared bad-input PDFs not present")
def test_each_malformed_pdf_is_a_per_file_error_and_the_rest_indexes(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(BAD_PDFS, src)
    shutil.copy(SAMPLE_CORPUS / "ada_fenwick.md", src)
    docs, errors = read_source(src, 20_000_000)
    assert [d.source for d in docs] == ["ada_fenwick.md"]
    assert sorted(e.source for e in errors) == sorted(p.name for p in BAD_PDFS.glob("*.pdf"))
    assert len(errors) == 28 and all(e.reason.startswith(("unparsable PDF", "encrypted", "PDF has no")) for e in errors)


def _jsonl(tmp_path: Path, lines: list[str], bom: bool = False) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "\n".join(lines).encode())
    return path


def test_jsonl_duplicate_id_is_reported_null_text_is_an_error_and_a_bom_is_accepted(tmp_path):
    rows = [json.dumps({"id": "a", "title": "Alpha", "text": "Alpha was first."}),
            json.dumps({"id": "b", "title": "Beta", "text": None}),
            json.dumps({"id": "a", "title": "Alpha again", "text": "A second alpha."}),
            json.dumps({"id": "c", "title": "Gamma", "text": "Gamma was third."})]
    docs, errors = read_source(_jsonl(tmp_path, rows, bom=True), 10_000)
    assert sorted(d.title for d in docs) == ["Alpha", "Gamma"]  # the BOM no longer costs the first row
    assert all("None" not in s.text for d in docs for s in d.sections)
    reasons = {e.source: e.reason for e in errors}
    assert reasons == {"rows.jsonl:2": '"text" is null, not a string',
                       "rows.jsonl:3": "duplicate id 'a' (first on line 1): row skipped"}


def test_an_empty_or_wrong_source_never_wipes_the_namespace(tmp_path):
    settings = Settings(home=tmp_path / "home", source=str(SAMPLE_CORPUS))
    _ingest(settings)
    before = counts(settings)  # not published yet: read the work file through the writer
    with connect(settings) as con:
        n = con.execute("SELECT count(*) FROM documents").fetchone()[0]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no readable file"):
        _ingest(settings.with_(source=str(tmp_path / "empty")))
    with connect(settings) as con:
        assert con.execute("SELECT count(*) FROM documents").fetchone()[0] == n == 8
    assert counts(settings) == before


def test_a_long_run_without_spaces_is_cut_and_reported(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.txt").write_text("The Orrery of Vell was built in 1820.\n" + "x" * 5_000_000 + "\nIt still turns.\n")
    settings = Settings(home=tmp_path / "home", source=str(src))
    out = _ingest(settings)
    assert out.documents == 1
    with connect(settings) as con:
        chunks = build_chunks(settings, con).chunks
    assert chunks == 1  # was 2,926 junk chunks for a 5 MB line
    reason = _errors(settings)["blob.txt"]
    assert f"more than {MAX_WORD_CHARS} characters without whitespace" in reason and "5,000,000" in reason


def test_symlinks_outside_dangling_and_looping_are_skipped_and_reported(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("The vault code is 1234.")
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("Ada Fenwick directed the Marlow Observatory.")
    os.symlink(outside, src / "leak.txt")
    os.symlink(tmp_path / "missing.txt", src / "dangling.txt")
    os.symlink(src / "loop_b", src / "loop_a")
    os.symlink(src / "loop_a", src / "loop_b")
    os.symlink(src, src / "again")
    docs, errors = read_source(src, 10_000)
    assert [d.source for d in docs] == ["good.txt"]
    reasons = {e.source: e.reason for e in errors}
    assert "outside the source folder" in reasons["leak.txt"]
    assert "dangling symlink" in reasons["dangling.txt"]
    assert "symlink loop" in reasons["loop_a"] and "symlink loop" in reasons["loop_b"]
    assert "inside the source folder" in reasons["again"]


def test_a_file_with_a_colon_in_its_name_keeps_its_indexed_version_when_it_breaks(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes: part 1.txt").write_text("Ada Fenwick directed the Marlow Observatory.")
    (src / "other.txt").write_text("Tomas Reyes succeeded her.")
    settings = Settings(home=tmp_path / "home", source=str(src))
    _ingest(settings)
    (src / "notes: part 1.txt").write_bytes(b"\x00\x01binary now")
    out = _ingest(settings)
    assert out.kept_after_error == 1
    with connect(settings) as con:
        sources = sorted(r[0] for r in con.execute("SELECT source FROM documents").fetchall())
    assert sources == ["notes: part 1.txt", "other.txt"]


def test_a_two_document_corpus_indexes_fully_through_dagster(tmp_path):
    from lazyhippo_dagster.runner import index_run, run_config

    src = tmp_path / "src"
    src.mkdir()
    (src / "kettle.txt").write_text("Brenna Holt repaired the copper kettle in Dunmore.")
    (src / "comet.txt").write_text("The astronomer Ivo Sandberg sighted a comet over Tallinn in 1881.")
    result = index_run(dg.DagsterInstance.ephemeral(), tmp_path / "home", run_config({
        "lazyhippo": {"home": str(tmp_path / "home"), "source": str(src), "namespace": "default"},
        "graph_store": {"kind": "embedded"}, "object_store": {"kind": "local"}}), {}, "default")
    failed = [e.step_key for e in result.all_events if e.is_step_failure]
    assert result.success, failed
    settings = Settings(home=tmp_path / "home")
    figures = counts(settings)
    assert figures["documents"] == 2 and figures["community_summaries"] > 0


def test_a_source_with_files_but_no_readable_document_is_an_error_naming_each_file_and_starts_no_run(tmp_path):
    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app
    from lazyhippo_dagster.runner import instance_for

    src, home = tmp_path / "src", tmp_path / "home"
    src.mkdir()
    (src / "scan.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 9 0 R >> endobj\ntrailer << >>\n%%EOF\n")
    (src / "rows.jsonl").write_text(json.dumps({"id": "a", "title": "Alpha", "text": None}) + "\n")
    out = CliRunner().invoke(app, ["index", str(src), "--home", str(home), "-n", "papers"])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    assert "error: no readable document, nothing to index (2 file(s) failed):" in out.output
    assert "scan.pdf:" in text and 'rows.jsonl:1: "text" is null, not a string' in text
    assert "Traceback" not in out.output and "graph_not_empty" not in out.output
    assert not instance_for(home).get_runs()  # no run started, so none failed
    assert counts(Settings(home=home, namespace="papers"))["documents"] == 0
