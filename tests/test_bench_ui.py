"""`lazyhippo bench ui` and `bench index --storage postgres`: the UI's operations are valid for the installed
Dagster, a real webserver loads the three pages of an indexed home, and a PostgreSQL bench records its runs there."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from graphql import OperationDefinitionNode, parse, validate
from typer.testing import CliRunner

from lazyhippo.settings import SAMPLE_CORPUS
from lazyhippo_dagster.bench_ui import QUERIES, _python_errors
from lazyhippo_dagster.cli import app
from tests.services_fixtures import unavailable


def test_the_ui_operations_are_valid_against_the_installed_dagster_schema():
    from dagster_graphql.schema import create_schema

    document = parse(QUERIES.read_text())
    assert validate(create_schema().graphql_schema, document) == []
    operations = {d.name.value for d in document.definitions if isinstance(d, OperationDefinitionNode)}
    assert {"AssetCatalogTableQuery", "AssetOverviewMetadataEventsQuery", "RunRootQuery", "RunLogsQuery"} <= operations


def test_a_python_error_anywhere_in_a_response_is_found():
    data = {"assetsOrError": {"nodes": [{"id": 1}]},
            "run": [{"logsForRun": {"__typename": "PythonError", "message": "boom"}}]}
    assert _python_errors(data) == ["boom"]
    assert _python_errors({"assetsOrError": {"__typename": "AssetConnection", "nodes": []}}) == []


@pytest.fixture(scope="module")
def indexed_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("ui_bench") / "home"
    with pytest.MonkeyPatch.context() as mp:  # the home's own instance, whatever an earlier CLI test left set
        mp.delenv("DAGSTER_HOME", raising=False)
        result = CliRunner().invoke(app, ["index", str(SAMPLE_CORPUS), "--home", str(home)])
    assert result.exit_code == 0, result.output
    return home


def test_bench_ui_loads_the_three_pages_of_the_full_index_run_through_a_webserver(indexed_home, tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    out = tmp_path / "ui.json"
    result = CliRunner().invoke(app, ["bench", "ui", "--home", str(indexed_home), "--repeat", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert set(figures["pages"]) == {"asset catalog", "asset documents", "run"}
    assert figures["run_event_rows"] > 50
    run = figures["pages"]["run"]["operations"]
    assert run["RunLogsQuery"]["kb"] > 10  # the run's events came back, metadata previews and all
    metadata = figures["pages"]["asset documents"]["operations"]["AssetOverviewMetadataEventsQuery"]
    assert metadata["kb"] > 1
    for page in figures["pages"].values():
        assert page["first_s"] == pytest.approx(sum(o["first_s"] for o in page["operations"].values()))
        assert 0 < page["first_cpu_s"] < page["first_s"] * 2 + 1  # the webserver's own CPU went into the page


def test_bench_ui_names_a_run_the_instance_does_not_hold(indexed_home, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    result = CliRunner().invoke(app, ["bench", "ui", "--home", str(indexed_home), "--run-id", "not-a-run"])
    assert result.exit_code == 1
    assert "--run-id not-a-run: no such run" in " ".join(result.output.split())


def test_bench_ui_without_an_instance_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    result = CliRunner().invoke(app, ["bench", "ui", "--home", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "no Dagster instance at" in " ".join(result.output.split())


def test_bench_index_refuses_an_unknown_storage(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "t", "text": "x"}) + "\n")
    result = CliRunner().invoke(app, ["bench", "index", "--corpus", str(corpus), "--storage", "mysql"])
    assert result.exit_code == 2
    assert "--storage 'mysql': expected sqlite or postgres" in " ".join(result.output.split())


@pytest.mark.services
def test_bench_index_on_postgres_records_its_runs_there_and_not_in_the_home(tmp_path, wiki_dataset):
    import dagster as dg

    from lazyhippo.settings import MissingCredentials, postgres_environment
    from lazyhippo_dagster.bench_index import bench_postgres_instance, run_index_bench

    try:
        env = postgres_environment()
        socket.create_connection((env["LAZYHIPPO_PG_HOST"], int(env["LAZYHIPPO_PG_PORT"])), timeout=2).close()
    except (MissingCredentials, OSError) as exc:
        unavailable(f"PostgreSQL not usable (`scripts/services.sh start postgres`): {exc}")
    result = run_index_bench(wiki_dataset / "corpus.jsonl", tmp_path / "bench", workers=1, limit=5,
                             progress=lambda _: None, storage="postgres")
    instance = bench_postgres_instance(tmp_path / "bench")
    for run in ("full_in_process", "changed_one", "deleted_one"):
        recorded = instance.get_run_by_id(result[run]["run_id"])
        assert recorded is not None and recorded.status == dg.DagsterRunStatus.SUCCESS
        assert result[run]["event_rows"] == len(instance.all_logs(result[run]["run_id"]))
    assert not (tmp_path / "bench" / "home_in_process" / "dagster" / "history" / "runs.db").exists()
