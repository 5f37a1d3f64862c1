"""`lazyhippo query` through the home's warm query daemon: the same Dagster run in the home's instance with the
CLI's tags and the same output, a fallback to the query's own process when no daemon answers, and a daemon that
serves only holders of its token."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from lazyhippo_dagster import query_daemon

SUCCESSOR_Q = "Who succeeded the founder of the Marlow Observatory as its director?"
OUT_OF_CORPUS_Q = "Which rebase option keeps merge commits when replaying a branch in git?"
LAUNCHER = [sys.executable, "-m", "lazyhippo_dagster.launcher"]  # what the `lazyhippo` script runs


def _env(**extra: str) -> dict[str, str]:
    """The test process's variables without an instance of its own: runs go to <home>/dagster."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.pop("LAZYHIPPO_HOME", None)
    return {**env, "LAZYHIPPO_QUERY_DAEMON": "5", **extra}


def _home(sample_settings, path: Path) -> Path:
    shutil.copytree(sample_settings.home, path, ignore=shutil.ignore_patterns("dagster", "*.lock", "query-daemon.*"))
    return path


def _start_daemon(home: Path) -> subprocess.Popen:
    proc = subprocess.Popen([*LAUNCHER, "daemon", "--home", str(home), "--idle-minutes", "5"], env=_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        advert = query_daemon.read_advert(home)
        if advert and advert["pid"] == proc.pid:
            return proc
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the daemon did not advertise itself")


def _query(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCHER, "query", *args, "--home", str(home)], env=_env(**env), capture_output=True,
                          text=True, timeout=300)


def _runs(home: Path) -> list[dg.DagsterRun]:
    if not (home / "dagster").is_dir():  # no run yet
        return []
    return dg.DagsterInstance.from_config(str(home / "dagster")).get_runs()


@pytest.fixture(scope="module")
def warm_home(sample_settings, tmp_path_factory):
    home = _home(sample_settings, tmp_path_factory.mktemp("warm") / "home")
    proc = _start_daemon(home)
    yield home, proc
    proc.terminate()
    proc.wait(30)
    assert not (home / query_daemon.ADVERT).exists()  # a daemon that ends takes its advert with it


def test_a_query_through_the_daemon_is_the_clis_dagster_run_in_the_home(warm_home):
    home, daemon = warm_home
    advert = home / query_daemon.ADVERT
    assert advert.stat().st_mode & 0o777 == 0o600  # the token is its owner's alone
    before = {r.run_id for r in _runs(home)}
    out = _query(home, SUCCESSOR_Q)
    assert out.returncode == 0, out.stderr
    assert "Tomas Reyes" in out.stdout and re.search(r"\[\d+\] Tomas Reyes", out.stdout), out.stdout
    assert re.search(r"run \S+ succeeded", out.stderr)
    new = [r for r in _runs(home) if r.run_id not in before]
    assert len(new) == 1 and new[0].job_name == "query" and new[0].status == dg.DagsterRunStatus.SUCCESS
    tags = new[0].tags
    assert tags["lazyhippo/namespace"] == "default" and tags["lazyhippo/question"] == SUCCESSOR_Q
    assert "lazyhippo/cli_run" in tags and tags["lazyhippo/answerable"] == "true"
    assert tags["lazyhippo/pid"] == str(daemon.pid)  # executed by the warm process, not the command's own
    assert new[0].run_config["ops"]["answer_question"]["config"]["question"] == SUCCESSOR_Q

    data = json.loads(_query(home, OUT_OF_CORPUS_Q, "--json").stdout)  # "not answerable" comes through too
    assert data["answerable"] is False and data["closest"] and data["citations"] == []
    text = " ".join(_query(home, OUT_OF_CORPUS_Q).stdout.split())
    assert "nothing in namespace 'default' answers this question" in text

    bad = _query(home, SUCCESSOR_Q, "--top-k", "0")  # the CLI's own checks, before any run
    assert bad.returncode == 2 and "top" in bad.stderr.lower()
    assert len(_runs(home)) == len(before) + 3


def test_two_queries_at_once_both_succeed(warm_home):
    home, _ = warm_home
    before = len(_runs(home))
    results: list[subprocess.CompletedProcess] = []
    threads = [threading.Thread(target=lambda q=q: results.append(_query(home, q, "--json")))
               for q in (SUCCESSOR_Q, "Who founded the Marlow Observatory?")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert all(json.loads(r.stdout)["answerable"] for r in results)
    assert len(_runs(home)) == before + 2


def test_the_daemon_refuses_a_wrong_token_and_declines_another_environment(warm_home):
    home, _ = warm_home
    advert = query_daemon.read_advert(home)
    before = len(_runs(home))
    fp = query_daemon.fingerprint(home)

    def raw(request: dict) -> dict:
        with socket.create_connection(("127.0.0.1", advert["port"]), timeout=30) as sock:
            sock.sendall(json.dumps(request).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            return json.loads(sock.makefile("rb").read())

    args = ["--home", str(home), SUCCESSOR_Q]
    refused = raw({"token": "x" * 43, "nonce": "n", "args": args, "fingerprint": fp})
    assert "wrong token" in refused["error"] and "stdout" not in refused and "proof" not in refused
    assert query_daemon.ask({**advert, "token": "y" * 43}, args, fp) is None  # the client then runs it itself
    other = raw({"token": advert["token"], "nonce": "n", "args": args,
                 "fingerprint": {**fp, "env": "0" * 64}})
    assert other["declined"] and other["proof"] == query_daemon.proof(advert["token"], "n") and "stdout" not in other
    assert len(_runs(home)) == before  # nothing ran


def test_a_reindex_is_answered_from_at_once(warm_home, tmp_path):
    """The daemon keeps no index of its own past a re-index: the next query reads the newly published one."""
    from lazyhippo.index import run_index
    from lazyhippo.settings import SAMPLE_CORPUS, Settings

    home, daemon = warm_home
    question = "Who designed the Quillon Harbour Lighthouse?"
    assert "Marisol Varga" not in _query(home, question).stdout
    corpus = tmp_path / "corpus"
    shutil.copytree(SAMPLE_CORPUS, corpus)
    (corpus / "quillon_lighthouse.md").write_text("# Quillon Harbour Lighthouse\n\nThe Quillon Harbour Lighthouse "
                                                  "was designed by the engineer Marisol Varga in 1877.\n")
    run_index(Settings(home=home, source=str(corpus)))
    out = _query(home, question, "--json")
    data = json.loads(out.stdout)
    assert "Marisol Varga" in data["answer"] and data["citations"][0]["source"].endswith("quillon_lighthouse.md")
    assert _runs(home)[0].tags["lazyhippo/pid"] == str(daemon.pid)


def test_a_dead_daemon_falls_back_to_the_querys_own_process_which_starts_a_new_one(sample_settings, tmp_path):
    home = _home(sample_settings, tmp_path / "home")
    gone = subprocess.Popen(["true"])
    gone.wait()
    advert = {"pid": gone.pid, "host": socket.gethostname(), "port": 9, "token": "t" * 43}
    query_daemon.write_advert(home, advert)
    assert query_daemon.read_advert(home) is None  # its process is gone: ignored
    with socket.socket() as closed:  # a live process (this one) but nothing listening on its port
        closed.bind(("127.0.0.1", 0))
        query_daemon.write_advert(home, {**advert, "pid": os.getpid(), "port": closed.getsockname()[1]})
    out = _query(home, SUCCESSOR_Q)
    assert out.returncode == 0 and re.search(r"\[\d+\] Tomas Reyes", out.stdout), out.stdout + out.stderr
    runs = _runs(home)
    assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
    assert runs[0].tags["lazyhippo/pid"] not in (str(os.getpid()), str(gone.pid))  # the command's own process
    deadline = time.monotonic() + 180  # ... which started the home's daemon for the next query
    while (started := query_daemon.read_advert(home)) is None or started["pid"] == os.getpid():
        assert time.monotonic() < deadline, "no daemon was started"
        time.sleep(0.2)
    try:
        warm = _query(home, SUCCESSOR_Q, "--json")
        assert warm.returncode == 0 and json.loads(warm.stdout)["answerable"]
        assert _runs(home)[0].tags["lazyhippo/pid"] == str(started["pid"])
    finally:
        stopped = subprocess.run([*LAUNCHER, "daemon", "--stop", "--home", str(home)], env=_env(),
                                 capture_output=True, text=True, timeout=60)
    assert f"stopped the query daemon {started['pid']}" in " ".join(stopped.stderr.split())
    assert query_daemon.read_advert(home) is None


def test_a_daemon_running_other_code_than_its_client_ends(sample_settings, tmp_path):
    """After an upgrade or an edit of the code, the daemon of the code before declines and exits."""
    home = _home(sample_settings, tmp_path / "home")
    daemon = _start_daemon(home)
    try:
        advert = query_daemon.read_advert(home)
        fp = query_daemon.fingerprint(home)
        assert query_daemon.ask(advert, ["--home", str(home), SUCCESSOR_Q], {**fp, "code": [*fp["code"][:-1], 1]}) is None
        assert daemon.wait(30) == 0 and query_daemon.read_advert(home) is None
    finally:
        daemon.kill()
        daemon.wait()


def test_without_a_daemon_a_query_runs_in_its_own_process_and_starts_none(sample_settings, tmp_path):
    home = _home(sample_settings, tmp_path / "home")
    out = _query(home, SUCCESSOR_Q, "--json", LAZYHIPPO_QUERY_DAEMON="0")
    assert out.returncode == 0 and json.loads(out.stdout)["answerable"], out.stderr
    time.sleep(1)
    assert not (home / query_daemon.ADVERT).exists() and len(_runs(home)) == 1


def test_split_home_takes_the_last_home_option_and_keeps_the_rest():
    assert query_daemon.split_home(["q", "--home", "a", "--json", "--home=b", "-n", "x"]) == ("b", ["q", "--json", "-n", "x"])
    assert query_daemon.split_home(["--", "--home", "a"]) == (None, ["--", "--home", "a"])


def test_the_fingerprint_holds_the_settings_variables_as_a_hash(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-to-be-sent")
    fp = query_daemon.fingerprint(tmp_path)
    assert "sk-not-to-be-sent" not in json.dumps(fp)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))  # the default, named: the same instance
    monkeypatch.setenv("LAZYHIPPO_QUERY_DAEMON", "3")
    assert query_daemon.fingerprint(tmp_path) == fp
    monkeypatch.setenv("LAZYHIPPO_EMBEDDER", "minilm")
    assert query_daemon.fingerprint(tmp_path)["env"] != fp["env"]
