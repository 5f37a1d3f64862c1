"""One Unicode name normalization, options checked before a run, vectors that
match their text, one namespace rule, live progress."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from lazyhippo.graph.names import norm_key
from lazyhippo.index import run_index
from lazyhippo.models.embedders import get_embedder
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stages.entities import build_graph_tables
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import CODE_LEVELS, connect, replace_rows
from lazyhippo_dagster.cli import app
from tests.services_fixtures import namespaces, neo4j_store  # noqa: F401 - fixtures

NAMES = ["Anna Müller", "Anna Mäller", "Émile Zola", "Emile Zola", "Лев Толстой", "Фёдор Достоевский",
         "北京大学", "鲁迅", "Straße"]


def _multilingual(settings: Settings) -> dict[str, tuple[str, str]]:
    """Extracted names in German, French, Russian and Chinese, each mentioned twice, related in a ring."""
    ns = settings.namespace
    ents = [{"namespace": ns, "chunk_id": f"c{i % 2}", "name": n, "type": "PERSON", "description": ""}
            for n in NAMES for i in range(2)]
    rels = [{"namespace": ns, "chunk_id": "c0", "source": a, "target": b, "description": "", "weight": 1.0}
            for a, b in zip(NAMES, NAMES[1:] + NAMES[:1])]
    with connect(settings) as con:
        replace_rows(con, "extracted_entities", ns, pa.Table.from_pylist(ents))
        replace_rows(con, "extracted_relations", ns, pa.Table.from_pylist(rels))
        build_graph_tables(settings, con)
        return {name: (eid, norm) for eid, name, norm in
                con.execute("SELECT entity_id, name, norm_name FROM entities WHERE namespace = ?", [ns]).fetchall()}


def test_names_normalize_unicode_aware_in_one_place(tmp_path):
    found = _multilingual(Settings(home=tmp_path))
    by_norm = {norm: eid for eid, norm in found.values()}
    assert norm_key("Anna Müller") != norm_key("Anna Mäller")
    assert {"anna muller", "anna maller", "emile zola", "лев толстой", "фёдор достоевский", "北京大学", "鲁迅",
            "strasse"} == set(by_norm)  # Cyrillic and CJK kept; 'Émile'/'Emile' one entity
    for eid, norm in found.values():  # the SQL ids are the Python normalization's
        assert eid == "e_" + hashlib.sha256(norm.encode()).hexdigest()[:16]
    assert all(norm_key(name) == norm for name, (_, norm) in found.items())


def test_the_vectorized_name_keys_are_norm_key():
    """names.norm_keys (the SQL function lh_norm) keys ASCII names in Arrow compute: the same keys as norm_key
    for ASCII and non-ASCII names, punctuation, underscores, digits, empty names and nulls."""
    import random

    from lazyhippo.graph.names import norm_keys

    rng = random.Random(11)
    alphabet = "aZ09_ -.,'()&/\\\t\n!?\x00é—ßİǅ"
    names = NAMES + ["", " ", "__", "_a_b_", "O'Brien & Sons, Ltd.", "R2-D2", "x_y", None]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(5000)]
    keys = norm_keys(pa.array(names, pa.string())).to_pylist()
    assert keys == [None if n is None else norm_key(n) for n in names]
    ascii_only = [n for n in names if n is not None and n.isascii()]
    assert norm_keys(pa.array(ascii_only, pa.string())).to_pylist() == [norm_key(n) for n in ascii_only]


@pytest.mark.services
def test_neo4j_gets_the_same_entities_as_the_embedded_store(tmp_path, neo4j_store, namespaces):  # noqa: F811
    settings = Settings(home=tmp_path, namespace=namespaces("unicode"))
    found = _multilingual(settings)
    with connect(settings) as con:
        neo4j_store.sync(con, settings.namespace, "entities")
    rows = neo4j_store.query("MATCH (e:Entity {namespace: $ns}) RETURN e.id AS id, e.norm_name AS norm",
                             {"ns": settings.namespace})
    assert {(r["id"], r["norm"]) for r in rows} == set(found.values())


def test_every_vector_matches_its_current_text(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = [{"id": "r1", "title": "Old Title", "text": "Ada Fenwick directed the Marlow Observatory in Cresswell."},
            {"id": "r2", "title": "Second", "text": "Tomas Reyes succeeded Ada Fenwick as director."}]
    (src / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    settings = Settings(home=tmp_path / "home", source=str(src))
    run_index(settings)
    rows[0]["title"] = "New Title"
    (src / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    run_index(settings)
    embedder = get_embedder(settings.embedder, settings.embedding_model)
    with connect(settings) as con:
        texts = dict(con.execute("SELECT chunk_id, title || E'\\n' || text FROM chunks").fetchall())
        texts |= {c: f"{t}\n{s}" for c, t, s in con.execute("SELECT community_id, title, summary FROM community_summaries").fetchall()}
        stored = con.execute("SELECT item_id, kind, lh_vector(vector, scale) FROM embeddings "
                             "WHERE kind IN ('chunk', 'community')").fetchall()
    assert any("New Title" in t for t in texts.values())
    for kind, by in (("chunk", embedder.passages), ("community", embedder)):
        ids = [i for i, k, _ in stored if k == kind]
        expected = by.embed([texts[i] for i in ids])
        got = np.array([v for i, k, v in stored if k == kind], dtype=np.float32)
        half_step = np.abs(expected).max(axis=1, keepdims=True) / (2 * CODE_LEVELS)  # the stored codes' rounding
        assert ids and np.all(np.abs(got - expected) <= half_step + 1e-6)


@pytest.mark.parametrize("namespace", ["attacker/../victim", ".", "", "a b", "x" * 65, "..", "ns/"])
def test_a_bad_namespace_is_refused_once_up_front(tmp_path, namespace):
    with pytest.raises(ValueError, match="invalid namespace"):
        Settings(home=tmp_path, namespace=namespace)
    out = CliRunner().invoke(app, ["index", str(SAMPLE_CORPUS), "--home", str(tmp_path), "-n", namespace])
    assert out.exit_code == 2 and "invalid namespace" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "warehouse.duckdb").exists() and not LocalObjectStore(tmp_path / "objects").list()


@pytest.mark.parametrize("args, message", [
    (["index", "--chunk-size", "0"], "--chunk-size must be at least"),
    (["index", "--chunk-size", "-5"], "--chunk-size must be at least"),
    (["index", "--chunk-overlap", "300"], "--chunk-overlap (300) must be smaller"),
    (["index", "--knn-top-k", "-1"], "--knn-top-k must be at least 0"),
    (["index", "--relations-per-chunk", "-2"], "--relations-per-chunk must be at least 0"),
    (["index", "--knn-cutoff", "2"], "--knn-cutoff is a cosine"),
    (["index", "--graph-store", "bogus"], "--graph-store 'bogus' is not one of"),
    (["index", "--object-store", "s4"], "--object-store 's4' is not one of"),
    (["index", "--extractor", "magic"], "--extractor 'magic' is not one of"),
    (["index", "--embedder", "word2vec"], "--embedder 'word2vec' is not one of"),
    (["index", "--community-algorithm", "kmeans"], "--community-algorithm 'kmeans' is not one of"),
    (["query", "", "--route", "local"], "the question is empty"),
    (["query", "   ", "--route", "local"], "the question is empty"),
    (["query", "Who?", "--route", "bogus"], "--route 'bogus' is not one of"),
    (["query", "Who?", "--top-k", "0"], "--top-k must be at least 1"),
    (["query", "Who?", "--budget", "-10"], "--budget must be at least"),
    (["query", "Who?", "--graph-store", "bogus"], "--graph-store 'bogus' is not one of"),
])
def test_every_option_is_checked_before_a_run_with_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    out = CliRunner().invoke(app, args + ["--home", str(tmp_path / "home")])
    assert out.exit_code == 2, out.output
    assert message in " ".join(out.output.split()) and len(out.output.strip().splitlines()) <= 2
    assert not (tmp_path / "dagster").exists()  # no run was launched


def test_an_empty_folder_is_refused_by_the_cli(tmp_path):
    (tmp_path / "empty").mkdir()
    out = CliRunner().invoke(app, ["index", str(tmp_path / "empty"), "--home", str(tmp_path / "home")])
    assert out.exit_code == 2 and "holds no readable" in " ".join(out.output.split())


def test_progress_is_reported_live_per_step(tmp_path, monkeypatch):
    """Steps are reported as they start and finish while the run goes on, not only at its end."""
    from lazyhippo_dagster.runner import execute, run_config

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    seen: list[tuple[str, str]] = []
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("Ada Fenwick directed the Marlow Observatory. Tomas Reyes succeeded her.")
    result = execute("index", tmp_path / "home", run_config({
        "lazyhippo": {"home": str(tmp_path / "home"), "source": str(src)}}), lambda s, st: seen.append((s, st)),
        tags={"lazyhippo/cli_run": "progress-test"}, namespace="default")
    assert result.success
    steps = [s for s, st in seen if st == "done"]
    extract = "extractions.load_extraction_parts"  # the last step of the extractions graph asset
    assert {"documents", extract, "exports"} <= set(steps)  # "documents" also chunks
    for step in ("documents", extract, "exports"):
        assert seen.index((step, "started")) < seen.index((step, "done"))
    assert seen.index((extract, "started")) < seen.index(("embeddings", "started"))


def test_a_run_launched_outside_the_cli_refuses_bad_settings_before_any_stage(tmp_path):
    import dagster as dg

    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.runner import run_config

    instance = dg.DagsterInstance.ephemeral()
    for bad in ({"chunk_size": 0}, {"namespace": "../victim"}):
        namespace = bad.get("namespace", "default")  # the run's partition is its namespace
        instance.add_dynamic_partitions("namespaces", [namespace])  # as the UI could
        result = defs.resolve_job_def("index_graph").execute_in_process(
            raise_on_error=False, instance=instance, partition_key=namespace, run_config=run_config({
                "lazyhippo": {"home": str(tmp_path / "home"), "source": str(SAMPLE_CORPUS), **bad}}))
        assert not result.success
        errors = " ".join(e.event_specific_data.error.to_string() for e in result.all_events
                          if e.is_failure and getattr(e.event_specific_data, "error", None))
        assert "chunk" in errors or "namespace" in errors, errors
        assert not result.get_step_success_events() and not (tmp_path / "home" / "warehouse.duckdb").exists()


def test_every_valid_choice_passes_the_option_checks():
    from lazyhippo.models.embedders import PROFILES
    from lazyhippo.query import ROUTES
    from lazyhippo_dagster.options import check_index_options, check_query_options

    for graph_store, object_store, extractor, embedder, algorithm in zip(
            ("embedded", "neo4j", "neo4j"), ("local", "minio", "minio"), ("nlp", "llm", "llm"), PROFILES,
            ("leiden", "louvain", "leiden")):
        check_index_options(SAMPLE_CORPUS, "kb-1", chunk_size=64, chunk_overlap=8, knn_top_k=0, knn_cutoff=-0.5,
                            community_algorithm=algorithm, graph_store=graph_store, object_store=object_store,
                            extractor=extractor, embedder=embedder)
    for route in ("auto", *ROUTES):
        check_query_options("Who?", "kb-1", route=route, top_k=1, budget=64, graph_store="neo4j")


def test_a_cli_started_in_the_background_leaves_sigterm_to_the_processes_a_run_starts():
    """Background jobs inherit SIGINT ignored; Dagster copies SIGINT's handler to SIGTERM, so without the CLI's
    reset every process a run starts (Dagster's compute-log tails) would ignore SIGTERM and hold each step 30 s."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import signal, subprocess\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "from lazyhippo_dagster.interrupts import restore_interrupts\n"
        "restore_interrupts()\n"
        "from dagster._utils.interrupts import setup_interrupt_handlers\n"
        "setup_interrupt_handlers()\n"
        "status = subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout\n"
        "print(int(status.split('SigIgn:')[1].split()[0], 16) >> 14 & 1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "0", out.stderr  # SIGTERM is not ignored by the child
