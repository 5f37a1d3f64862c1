"""The growth benchmark's corpus and measurements (the full run is `lazyhippo bench index --growth`)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from lazyhippo_dagster import bench_index
from lazyhippo_dagster.bench_growth import PIECE_CHARS, disk_bytes, growth_corpus, growth_source, own_instance
from lazyhippo_dagster.bench_process import TreeRss
from lazyhippo_dagster.cli import app


@pytest.fixture
def sources(tmp_path):
    datasets = tmp_path / "datasets"
    for name, n in (("wiki", 30), ("hotpot", 3)):
        (datasets / name).mkdir(parents=True)
        (datasets / name / "corpus.jsonl").write_text(
            "".join(json.dumps({"id": str(i), "title": f"T{i}", "text": f"{name} passage {i}."}) + "\n" for i in range(n)))
    (datasets / "gitdocs" / "src").mkdir(parents=True)
    (datasets / "gitdocs" / "src" / "guide.txt").write_text("\n\n".join(f"Paragraph {i}. " + "word " * 300 for i in range(20)))
    debian = tmp_path / "doc"
    (debian / "pkg").mkdir(parents=True)
    (debian / "pkg" / "changelog.gz").write_bytes(gzip.compress(b"pkg (1.0) unstable; urgency=low\n\n  * First release."))
    (debian / "pkg" / "copyright").write_text("Same licence text.")
    (debian / "other").mkdir()
    (debian / "other" / "copyright").write_text("Same licence text.")  # a duplicate: left out
    (debian / "other" / "logo.png").write_bytes(b"\x89PNG\0\0")
    (debian / "other" / "manual.ps.gz").write_bytes(gzip.compress(b"%!PS-Adobe-3.0 showpage"))  # not prose
    (debian / "other" / "2XHE.pdb.gz").write_bytes(gzip.compress(b"ATOM 1 N MET A 1"))  # data named in capitals
    (debian / "other" / "status.txt").write_text("\n".join(f"line {i} of a log without blank lines" for i in range(500)))
    (debian / "other" / "guide.html").write_text("<html><body><h1>Guide</h1><p>Set <b>listen</b> to a port.</p></body></html>")
    sphinx = debian / "lib" / "html"
    (sphinx / "_sources").mkdir(parents=True)
    (sphinx / "_sources" / "api.rst.txt").write_text("API\n===\n\nThe source of the page.")
    (sphinx / "api.html").write_text("<html><body><p>The HTML twin of the page.</p></body></html>")  # read once
    return datasets, debian


def test_the_corpus_takes_each_source_in_turn_and_splits_long_texts(sources):
    datasets, debian = sources
    rows = growth_corpus(datasets, 20, debian)
    by_source = Counter(r["id"].split("/")[0] for r in rows[:8])
    assert len(rows) == 20 and len({r["id"] for r in rows}) == 20
    assert by_source == {"hotpot": 2, "wiki": 2, "gitdocs": 2, "debian": 2}  # same mix at every size
    guide = [r for r in growth_corpus(datasets, 40, debian) if r["id"].startswith("gitdocs/")]
    assert len(guide) > 3 and all(len(r["text"]) <= 2 * PIECE_CHARS for r in guide)
    texts = [r["text"] for r in growth_corpus(datasets, 40, debian) if r["id"].startswith("debian/")]
    assert texts.count("Same licence text.") == 1 and not any("PNG" in t or "PS-Adobe" in t or "ATOM" in t for t in texts)
    log = [t for t in texts if "of a log" in t]
    assert len(log) > 3 and all(len(t) <= PIECE_CHARS for t in log)  # one long paragraph, cut at line ends
    assert any("First release" in t for t in texts)  # a compressed changelog is read
    assert any("Set listen to a port." in t and "<" not in t for t in texts)  # an HTML page is read as its text
    assert any("The source of the page." in t for t in texts) and not any("HTML twin" in t for t in texts)


def test_more_documents_than_the_sources_hold_is_refused_with_the_count(sources):
    datasets, debian = sources
    with pytest.raises(ValueError, match="--growth 10000: .* only \\d+ documents"):
        growth_corpus(datasets, 10_000, debian)


def test_a_given_corpus_gives_its_first_documents(sources, tmp_path, monkeypatch):
    datasets, _ = sources
    jsonl, folder = tmp_path / "jsonl", tmp_path / "folder"
    jsonl.mkdir(), folder.mkdir()
    monkeypatch.setattr(bench_index, "SHARD_ROWS", 2)  # a large corpus is written as files under the size limit
    text = growth_source(datasets, 5, jsonl, datasets / "wiki" / "corpus.jsonl")
    shards = sorted(jsonl.glob("*.jsonl"))
    assert [len(p.read_text().splitlines()) for p in shards] == [2, 2, 1]
    rows = [json.loads(line) for p in shards for line in p.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["0", "1", "2", "3", "4"] and text == sum(len(r["text"]) for r in rows)
    (datasets / "gitdocs" / "src" / "howto").mkdir()
    (datasets / "gitdocs" / "src" / "howto" / "a.txt").write_text("A short page.")
    assert growth_source(datasets, 2, folder, datasets / "gitdocs" / "src") == (
        len("A short page.") + (datasets / "gitdocs" / "src" / "guide.txt").stat().st_size)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.txt")) == ["guide.txt", "howto/a.txt"]
    with pytest.raises(ValueError, match="--growth 50: .*holds only 3 documents"):
        growth_source(datasets, 50, tmp_path, datasets / "hotpot" / "corpus.jsonl")


def test_peak_rss_counts_the_child_processes():
    with TreeRss(every=0.05) as alone:
        pass
    with TreeRss(every=0.05) as tree:
        subprocess.run([sys.executable, "-c", "import time; b = bytearray(200_000_000); time.sleep(1.0)"], check=True)
    assert tree.peak - alone.peak > 150_000_000


def _hold(n: int) -> int:
    import time

    b = bytearray(n)
    time.sleep(0.5)
    return len(b)


def test_peak_rss_is_told_per_kind_of_process_and_per_span_of_time():
    """Which process and which step set the peak: a forkserver's child holding 200 MB is an extraction worker,
    the peak between two times is that of those times only."""
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    with TreeRss(every=0.05) as tree:
        before = time.time()
        time.sleep(0.3)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:
            start = time.time()
            assert pool.submit(_hold, 200_000_000).result() == 200_000_000
            end = time.time()
    roles = tree.by_role()
    assert roles["forkserver's children (extraction workers)"]["largest_peak_mb"] > 200
    assert roles["forkserver's children (extraction workers)"]["at_tree_peak_mb"] > 200
    assert roles["run process"]["processes"] == 1
    assert tree.peak_between(start, end)[0] - tree.peak_between(before, before + 0.2)[0] > 150_000_000
    assert tree.peak_between(start, end)[1] < tree.peak_between(start, end)[0]  # the run process alone


def test_disk_bytes_counts_allocated_blocks_and_a_hard_linked_file_once(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100_000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").hardlink_to(tmp_path / "a")
    assert 100_000 <= disk_bytes([tmp_path]) < 120_000
    seen: set = set()
    assert disk_bytes([tmp_path / "a"], seen) >= 100_000 and disk_bytes([tmp_path / "sub"], seen) == 0
    assert disk_bytes([tmp_path / "missing", tmp_path / "sub"]) >= 100_000  # a part the home lacks counts 0


@pytest.mark.parametrize("value", ["", "ten", "0,100"])
def test_a_bad_growth_option_is_refused_by_name(value):
    out = CliRunner().invoke(app, ["bench", "index", "--growth", value])
    assert out.exit_code == 2 and "--growth" in out.output


def test_each_size_records_its_runs_in_its_own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "elsewhere"))
    with own_instance(tmp_path / "small") as first:
        assert first.root_directory == str((tmp_path / "small" / "dagster").resolve())
    with own_instance(tmp_path / "large") as second:
        assert second.root_directory == str((tmp_path / "large" / "dagster").resolve())
    assert os.environ["DAGSTER_HOME"] == str(tmp_path / "elsewhere")  # later runs of the process are not moved


def test_the_growth_table_rounds_its_figures_and_says_how_loaded_the_machine_was():
    from lazyhippo_dagster.bench_growth import growth_table

    result = {"documents": 10, "text_mb": 0.01, "seconds": 150.7627715540002, "mb_per_minute": 4.51,
              "peak_rss_mb": 1300, "home_mb": 3.2, "home_ratio": 29.1, "local_p50_ms": 20.5265,
              "local_p95_ms": 25.310000000000002, "home_parts_mb": {"warehouse": 1.5},
              "load_start": [0.3, 1.0, 1.1], "load_end": [2.5, 1.4, 1.2]}
    table = {row["figure"]: row["10 docs"] for row in growth_table([result]).to_dicts()}
    assert table["seconds"] == 150.8 and table["local p95 ms"] == 25.3 and table["local p50 ms"] == 20.5
    assert table["load average at start"] == 0.3 and table["load average at end"] == 2.5
    assert table["  warehouse MB"] == 1.5


def test_a_timed_index_tells_each_step_as_it_ends(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    bench_index.write_jsonl_source(source, [json.dumps({"id": str(i), "title": f"Note {i}",
                                                        "text": f"Ada Lovelace wrote note {i} in London."}) for i in range(3)])
    lines: list[str] = []
    with own_instance(tmp_path / "home") as instance:
        bench_index._timed_index(tmp_path / "home", source, None, instance=instance, progress=lines.append)
    ended = [line.split()[0] for line in lines]
    assert "documents" in ended and "exports" in ended and "published_snapshot" in ended
    assert all(" done at " in line and line.endswith(" s") for line in lines)
