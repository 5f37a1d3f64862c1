"""The CLI launches Dagster jobs: runs are recorded in the instance that `dagster dev` reads."""

from __future__ import annotations

import json

import dagster as dg
from typer.testing import CliRunner

from lazyhippo.query.loader import clear_cache
from lazyhippo_dagster.cli import app


def test_index_then_query_from_the_cli_records_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    runner = CliRunner()
    home = str(tmp_path / "idx")
    out = runner.invoke(app, ["index", "--home", home])
    assert out.exit_code == 0, out.output
    status = runner.invoke(app, ["status", "--home", home, "--json"])
    counts = json.loads(status.stdout.strip().splitlines()[-1])
    assert counts["documents"] == 8 and counts["knn_edges"] > 0 and counts["community_summaries"] > 0
    q = runner.invoke(app, ["query", "Who succeeded Ada Fenwick as director of the Marlow Observatory?",
                            "--home", home, "--json", "--route", "local"])
    assert q.exit_code == 0, q.output
    data = json.loads(q.stdout[q.stdout.index("{"):])
    assert data["route"] == "local" and data["citations"]
    assert "Tomas Reyes" in {c["title"] for c in data["citations"]}
    assert data["context_tokens"] <= 32000
    instance = dg.DagsterInstance.from_config(str(tmp_path / "dagster"))
    runs = {r.job_name: r for r in instance.get_runs()}
    assert runs["index"].status == dg.DagsterRunStatus.SUCCESS and runs["index"].tags["dagster/partition"] == "default"
    assert instance.get_materialized_partitions(dg.AssetKey("extractions")) == {"default"}  # one partition per namespace
    assert runs["query"].status == dg.DagsterRunStatus.SUCCESS
    assert runs["query"].tags["lazyhippo/answer"] == data["answer"][:500]  # the answer heads the run page
    mats = instance.fetch_materializations(dg.AssetKey("entities"), limit=1).records
    assert mats and mats[0].asset_materialization.metadata["dagster/row_count"].value > 0

    clear_cache()  # as the next `lazyhippo query` process: the index comes from its disk cache, in a Dagster run still
    again = runner.invoke(app, ["query", "Who succeeded Ada Fenwick as director of the Marlow Observatory?",
                                "--home", home, "--json", "--route", "local"])
    assert again.exit_code == 0, again.output
    cached = json.loads(again.stdout[again.stdout.index("{"):])
    assert cached["citations"] == data["citations"] and cached["answer"] == data["answer"]
    query_runs = instance.get_runs(dg.RunsFilter(job_name="query"))
    assert len(query_runs) == 2 and query_runs[0].status == dg.DagsterRunStatus.SUCCESS
    assert query_runs[0].tags["lazyhippo/route"] == "local" and query_runs[0].tags["dagster/partition"] == "default"

    readme = runner.invoke(app, ["query", "Who succeeded the founder of the Marlow Observatory as its director?",
                                 "--multi-hop", "2", "--home", home, "--json"])  # the README's example
    assert readme.exit_code == 0, readme.output
    example = json.loads(readme.stdout[readme.stdout.index("{"):])
    assert example["route"] == "local" and "Tomas Reyes" in example["answer"]
    assert example["diagnostics"]["multi_hop"]["levels"] == 2


def test_query_without_index_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    out = CliRunner().invoke(app, ["query", "anything", "--home", str(tmp_path / "empty")])
    assert out.exit_code == 2 and "has no index yet" in " ".join(out.output.split())


def test_index_of_missing_path_fails_clearly(tmp_path):
    out = CliRunner().invoke(app, ["index", str(tmp_path / "nope"), "--home", str(tmp_path / "h")])
    assert out.exit_code == 2 and "does not exist" in " ".join(out.output.split())


def test_neo4j_down_fails_fast_with_the_root_cause_last(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.setenv("NEO4J_URI", "bolt://127.0.0.1:9")
    monkeypatch.setenv("NEO4J_PASSWORD", "not-logged-secret")
    out = CliRunner().invoke(app, ["index", "--home", str(tmp_path / "h"), "--graph-store", "neo4j"])
    text = " ".join(out.output.split())
    assert out.exit_code == 1
    assert text[text.rindex("root cause:"):].startswith("root cause: lazyhippo.stores.neo4j.client.Neo4jStoreError: "
                                                         "Neo4j at bolt://127.0.0.1:9: server unreachable")
    assert "not-logged-secret" not in out.output


def test_the_cli_query_job_is_the_one_the_ui_shows():
    """`lazyhippo query` builds the query job without the asset graph: it must stay the job of the definitions."""
    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.runner import job_def

    assert job_def("query").get_job_snapshot_id() == defs.resolve_job_def("query").get_job_snapshot_id()


def test_a_cli_query_imports_neither_a_dataframe_library_nor_model2vec(sample_settings, tmp_path):
    """What a `lazyhippo query` process loads is its latency: its run's metadata tables are plain Python, and
    the static embedder reads the distilled model itself (model2vec builds it once, at index time). The index
    is read from its disk cache, as every query after the first reads it."""
    import shutil
    import subprocess
    import sys

    from lazyhippo.query.loader import load_index
    from lazyhippo.settings import Settings

    home = tmp_path / "home"
    shutil.copytree(sample_settings.home, home, ignore=shutil.ignore_patterns("dagster", "*.lock"))
    load_index(Settings(home=home))  # writes the disk cache
    script = ("import sys; from typer.testing import CliRunner; from lazyhippo_dagster.cli import app; "
              f"out = CliRunner().invoke(app, ['query', 'Who founded the Marlow Observatory?', '--home', {str(home)!r}, '--json']); "
              "assert out.exit_code == 0, out.output; "
              "print(sorted(m for m in ('polars', 'pandas', 'model2vec', 'huggingface_hub') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**__import__("os").environ, "DAGSTER_HOME": str(tmp_path / "dagster")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_cli_query_loads_its_index_beside_the_dagster_run_which_finds_it_loaded(sample_settings, tmp_path, monkeypatch):
    """The index (with the embedder and tokenizer) is loaded in a thread while Dagster starts the run, with the
    settings the run resolves: the run's step reads it from the process's cache instead of loading it again."""
    import shutil
    import threading

    from lazyhippo.query import loader

    home = tmp_path / "home"
    shutil.copytree(sample_settings.home, home, ignore=shutil.ignore_patterns("dagster", "*.lock"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    clear_cache()
    loads, build = [], loader._build
    monkeypatch.setattr(loader, "_build", lambda *a: loads.append(threading.current_thread().name) or build(*a))
    out = CliRunner().invoke(app, ["query", "Who founded the Marlow Observatory?", "--home", str(home), "--json"])
    assert out.exit_code == 0, out.output
    assert loads == ["warm query engine"]
    clear_cache()
