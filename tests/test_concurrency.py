"""Readers never break an index run and read the last complete index; runs in one home queue;
killed runs are detected; replacing writes are transactional."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from lazyhippo.index import run_index
from lazyhippo.query import answer_question
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.warehouse import IndexIncomplete, WriterSession, connect, counts, index_notice, replace_rows

ROOT = Path(__file__).resolve().parent.parent


def _hold(mode: str, settings: Settings, seconds: float = 60) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.holders", mode, str(settings.home), settings.namespace,
                             str(seconds)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _small_corpus(tmp_path: Path, names: tuple[str, ...]) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(SAMPLE_CORPUS / name, src / name)
    return src


@pytest.fixture
def indexed(tmp_path) -> Settings:
    settings = Settings(home=tmp_path / "home", source=str(_small_corpus(tmp_path, ("ada_fenwick.md", "tomas_reyes.txt"))))
    run_index(settings)
    return settings


def test_a_reader_holding_the_index_never_breaks_the_next_run(indexed, tmp_path):
    reader = _hold("reader", indexed)
    try:
        shutil.copy(SAMPLE_CORPUS / "marlow_observatory.md", Path(indexed.source))
        out = run_index(indexed)  # failed on DuckDB's file lock while the reader held it
        assert out["documents"].documents == 3
    finally:
        reader.kill()
        reader.wait()
    assert counts(indexed)["documents"] == 3


def test_queries_during_a_run_read_the_last_complete_index_and_say_so(indexed):
    before = counts(indexed)
    writer = _hold("writer", indexed)  # a run half-way: chunks deleted in the work file
    try:
        assert counts(indexed) == before
        result = answer_question(indexed, "Who succeeded Ada Fenwick?", route="local", llm=None)
        assert result.to_dict()["citations"]
        assert "still in progress" in index_notice(indexed)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    notice = index_notice(indexed)
    assert "did not finish" in notice and "last complete index" in notice
    assert counts(indexed) == before


def test_a_killed_first_run_leaves_no_index_and_queries_say_so(tmp_path):
    settings = Settings(home=tmp_path / "home")
    writer = _hold("writer", settings)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    with pytest.raises(IndexIncomplete, match="no complete index"):
        index_notice(settings)


def test_a_second_run_in_the_same_home_waits_instead_of_failing(indexed, tmp_path):
    other = indexed.with_(namespace="other", source=str(SAMPLE_CORPUS / "ada_fenwick.md"))
    writer = _hold("writer", indexed, seconds=3)
    waits: list[str] = []
    session = WriterSession(other, "second", on_wait=waits.append, poll_seconds=0.2)
    t0 = time.monotonic()
    with session, session.connect() as con:
        assert con.execute("SELECT count(*) FROM documents").fetchone()[0] >= 0
    assert time.monotonic() - t0 >= 1.0 and waits and "waiting" in waits[0]
    writer.wait()
    out = run_index(other)
    assert out["documents"].documents == 1 and counts(other)["documents"] == 1


def test_replacing_rows_is_all_or_nothing(indexed):
    with connect(indexed) as con:
        n = con.execute("SELECT count(*) FROM documents WHERE namespace = 'default'").fetchone()[0]
        bad = pa.table({"namespace": ["default"], "doc_id": ["d_x"], "source": [None], "content_hash": ["h"],
                        "sections": ["[]"]})  # NOT NULL source: the insert fails after the delete ran
        with pytest.raises(Exception):
            replace_rows(con, "documents", "default", bad)
        assert con.execute("SELECT count(*) FROM documents WHERE namespace = 'default'").fetchone()[0] == n == 2


def test_a_killed_cli_run_is_marked_failed_at_the_next_launch(tmp_path):
    import socket

    from lazyhippo_dagster.runner import fail_dead_runs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    instance = dg.DagsterInstance.ephemeral()
    run = instance.create_run_for_job(dg.GraphDefinition("noop").to_job(), tags={
        "lazyhippo/pid": str(gone.pid), "lazyhippo/host": socket.gethostname()})
    instance.handle_run_event(run.run_id, dg.DagsterEvent(
        event_type_value=dg.DagsterEventType.PIPELINE_START.value, job_name="noop"))
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    assert fail_dead_runs(instance) == [run.run_id]
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


def test_status_and_queries_during_a_cli_index_run_never_break_it(tmp_path, monkeypatch):
    """The reported scenario: `lazyhippo status` and `query` in a loop while `lazyhippo index` runs."""
    import json

    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    src, home = tmp_path / "src", str(tmp_path / "home")
    shutil.copytree(SAMPLE_CORPUS, src)
    runner = CliRunner()
    assert runner.invoke(app, ["index", str(src), "--home", home]).exit_code == 0
    (src / "extra.txt").write_text("Mira Holt restored the Marlow Observatory telescope in 1950.")
    index = subprocess.Popen([sys.executable, "-c", "from lazyhippo_dagster.cli import app; app()", "index", str(src),
                              "--home", home], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    statuses, answers = [], []
    while index.poll() is None:
        status = runner.invoke(app, ["status", "--home", home, "--json"])
        assert status.exit_code == 0, status.output
        statuses.append(json.loads(status.stdout.strip().splitlines()[-1])["documents"])
        if len(answers) < 3:  # each query is a Dagster run: a few are enough, statuses keep polling
            q = runner.invoke(app, ["query", "Who succeeded Ada Fenwick?", "--home", home, "--route", "local", "--json"])
            assert q.exit_code == 0, q.output
            answers.append(q.output)
        time.sleep(0.3)
    assert index.wait() == 0, index.stderr.read()[-2000:]
    assert answers and statuses and set(statuses) <= {8, 9}  # the last complete index, never a half-built one
    assert json.loads(runner.invoke(app, ["status", "--home", home, "--json"]).stdout.strip().splitlines()[-1])["documents"] == 9


def test_the_instance_monitors_runs_and_queues_index_runs_one_at_a_time(tmp_path, monkeypatch):
    from lazyhippo_dagster.definitions import defs
    from lazyhippo_dagster.runner import instance_for

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    instance = instance_for(tmp_path / "home")
    assert instance.run_monitoring_enabled
    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert {"key": "lazyhippo/writer", "limit": 1} in limits
    for job in ("index", "index_graph", "rebuild_graph"):
        assert defs.resolve_job_def(job).tags["lazyhippo/writer"] == "warehouse"


def test_a_cli_run_killed_with_sigkill_is_reported_and_marked_failed(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from lazyhippo.stores.warehouse import read_state
    from lazyhippo_dagster.cli import app

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    home = tmp_path / "home"
    runner = CliRunner()
    assert runner.invoke(app, ["index", str(SAMPLE_CORPUS), "--home", str(home)]).exit_code == 0
    index = subprocess.Popen([sys.executable, "-c", "from lazyhippo_dagster.cli import app; app()", "index", str(SAMPLE_CORPUS),
                              "--home", str(home)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while read_state(Settings(home=home)).get("default", {}).get("pid") != index.pid:
        assert time.time() < deadline and index.poll() is None
        time.sleep(0.2)
    index.send_signal(signal.SIGKILL)
    index.wait()
    status = runner.invoke(app, ["status", "--home", str(home), "--json"])
    assert status.exit_code == 0 and "did not finish" in " ".join(status.output.split())
    assert json.loads(status.stdout.strip().splitlines()[-1])["documents"] == 8  # the last complete index
    q = runner.invoke(app, ["query", "Who succeeded Ada Fenwick?", "--home", str(home), "--route", "local"])
    assert q.exit_code == 0 and "did not finish" in " ".join(q.output.split())
    instance = dg.DagsterInstance.from_config(str(tmp_path / "dagster"))
    killed = instance.get_runs(dg.RunsFilter(tags={"lazyhippo/pid": str(index.pid)}))
    assert killed and killed[0].status == dg.DagsterRunStatus.FAILURE
