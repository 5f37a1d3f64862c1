"""The HTTP API against a real uvicorn server on loopback: every endpoint, auth, limits and bad input, a failing
backend, Dagster index runs launched over HTTP, and the warm index swapped under load."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from lazyhippo.index import run_index
from lazyhippo.query import answer_question
from lazyhippo.serve.app import Access, Limits, create_app
from lazyhippo.serve.connections import server_config
from lazyhippo.serve.middleware import Grant
from lazyhippo.serve.engines import EnginePool
from lazyhippo.serve.pool import IndexPool
from lazyhippo.serve.runs import public_error
from lazyhippo.settings import SAMPLE_CORPUS, Settings, environment

REPO = Path(__file__).resolve().parent.parent
SUCCESSOR_Q = "Who succeeded the founder of the Marlow Observatory as its director?"
NEW_DOC = "Quillon Barrow was a lighthouse keeper at Skerry Point who invented the brass fog whistle in 1921."
NEW_Q = "Who invented the brass fog whistle?"
TIMEOUT = 120  # generous: the machine is shared, and an in-process index run competes for the interpreter
get = functools.partial(httpx.get, timeout=TIMEOUT)
post = functools.partial(httpx.post, timeout=TIMEOUT)


TOKEN = "per-start-token-of-the-test-server"
WRITE_KEY = "write-key-0123456789abcdef"
READ_KEY = "read-key-0123456789abcdef"


def keyed(read_scope: frozenset[str] | None = None) -> Access:
    return Access(((WRITE_KEY, Grant(True)), (READ_KEY, Grant(False, read_scope))))


@contextmanager
def running(pool: IndexPool, access: Access | None = None, limits: Limits = Limits(), roots: tuple[Path, ...] = ()):
    """A real uvicorn server on a free loopback port, in a thread; yields its base URL. Keyless by default,
    with the token `TOKEN`."""
    app = create_app(pool, access or Access(token=TOKEN), limits, source_roots=roots)
    server = uvicorn.Server(server_config(app, "127.0.0.1", 0, limits, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not (server.started and server.servers):
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def home(sample_settings, tmp_path) -> Path:
    """A private copy of the indexed sample warehouse (tests here write to it)."""
    dest = tmp_path / "home"
    shutil.copytree(sample_settings.home, dest, ignore=shutil.ignore_patterns("dagster", "*.lock", "usage.sqlite*"))
    return dest


@pytest.fixture
def pool(home):
    p = IndexPool(Settings(home=home), settle_seconds=0.3, poll_seconds=0.1).start()
    yield p
    p.stop()


@pytest.fixture(params=["in_process", "engines"])
def any_pool(request, home):
    """The server's two query backends: the index in the server process, or engine processes behind it."""
    kind = IndexPool if request.param == "in_process" else functools.partial(EnginePool, workers=2)
    p = kind(Settings(home=home), settle_seconds=0.3, poll_seconds=0.1).start()
    yield p
    p.stop()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def has_new_doc(result: dict) -> bool:
    return any(x["title"] == "barrow" or "Quillon" in x["text"] for x in result["context"])


def test_query_endpoints_give_the_json_of_lazyhippo_query(any_pool, home):
    pool = any_pool
    with running(pool) as url:
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "local", "top_k": 5})
        assert r.status_code == 200
        data = r.json()
        engine = answer_question(Settings(home=home), SUCCESSOR_Q, route="local", top_k=5).to_dict()
        assert data.keys() == engine.keys()
        assert data["answer"] == engine["answer"] and data["citations"] == engine["citations"]
        assert data["citations"] and data["context"]
        r = post(f"{url}/api/kg/qa", json={"question": "What are the main themes of this collection?"})
        assert r.status_code == 200 and r.json()["route"] == "global" and r.json()["citations"]
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "local", "multi_hop": 2, "budget": 2000})
        assert r.status_code == 200 and r.json()["route"] == "local" and r.json()["context_tokens"] <= 2000
        assert r.json()["diagnostics"]["multi_hop"]["subgraph_nodes"] > 0
        old = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "multi_hop"})
        assert old.status_code == 400 and "expected auto or one of local, global" in old.text
        follow = post(f"{url}/api/query", json={
            "question": "Who succeeded her as director?", "route": "local",
            "history": [{"role": "user", "content": "Who founded the Marlow Observatory?"},
                        {"role": "assistant", "content": "Ada Fenwick founded it."}]})
        assert follow.status_code == 200 and follow.json()["question"] == "Who succeeded her as director?"
        combined = answer_question(Settings(home=home), "Who founded the Marlow Observatory? Who succeeded her as director?",
                                   route="local").to_dict()  # the earlier user turn helps retrieval
        assert [c["chunk_id"] for c in follow.json()["context"]] == [c["chunk_id"] for c in combined["context"]]


def test_health_metrics_namespaces_and_docs(pool):
    with running(pool) as url:
        health = get(f"{url}/health").json()
        assert health["status"] == "ok" and health["namespaces"] == ["default"] and health["warm"]["default"]["chunks"] > 0
        assert get(f"{url}/api/namespaces").json() == {"namespaces": ["default"]}
        post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "local"})
        post(f"{url}/api/query", json={"question": "", "route": "local"})
        text = get(f"{url}/metrics").text
        assert 'lazyhippo_requests_total{endpoint="/api/query",route="local",status="200"} 1.0' in text
        assert 'lazyhippo_requests_total{endpoint="/api/query",route="local",status="400"} 1.0' in text
        assert 'lazyhippo_request_seconds_bucket{endpoint="/api/query",le="0.5",route="local"}' in text
        spec = get(f"{url}/openapi.json").json()
        assert {"/api/query", "/api/kg/qa", "/api/kg/create", "/api/runs/{run_id}", "/health",
                "/metrics"} <= set(spec["paths"]) and "/api/kg/hybrid" not in spec["paths"]
        assert get(f"{url}/docs").status_code == 200


@pytest.mark.parametrize("body, status, needle", [
    ({"question": "   "}, 400, "question is empty"),
    ({"question": "x" * 2001}, 413, "limit is 2000"),
    ({"question": SUCCESSOR_Q, "route": "fastest"}, 400, "unknown route 'fastest'"),
    ({"question": SUCCESSOR_Q, "namespace": "nowhere"}, 404, "unknown namespace 'nowhere' (known: default)"),
    ({"question": SUCCESSOR_Q, "top_k": 500}, 400, "top_k 500 is over the limit 50"),
    ({"question": SUCCESSOR_Q, "budget": 10**6}, 400, "budget 1000000 is over the limit 32000"),
    ({"question": SUCCESSOR_Q, "budget": 0}, 422, "budget"),
    ({"question": 42}, 422, "question"),
    ({"route": "local"}, 422, "question"),
])
def test_bad_input_gets_a_clear_4xx(pool, body, status, needle):
    with running(pool) as url:
        r = post(f"{url}/api/query", json=body)
        assert r.status_code == status and needle in r.text and "Traceback" not in r.text


def test_oversized_body_and_bad_json_are_refused(pool):
    with running(pool, limits=Limits(max_body_bytes=1000)) as url:
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "history": [{"role": "user", "content": "y" * 2000}]})
        assert r.status_code == 413 and "over 1000 bytes" in r.text
        r = post(f"{url}/api/query", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422 and "Traceback" not in r.text
        chunked = (part for part in [b'{"question": "', b"y" * 5000, b'"}'])  # no Content-Length: refused unread
        r = post(f"{url}/api/query", content=chunked, headers={"content-type": "application/json"})
        assert r.status_code == 411 and "Content-Length" in r.text


def test_a_failing_backend_gives_503_without_internals(pool, monkeypatch):
    def down(texts):
        raise ConnectionError("embedding service at 10.0.0.7 refused the connection")

    with running(pool) as url:
        monkeypatch.setattr(pool.embedder.inner, "embed", down)
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "local"})
        assert r.status_code == 503 and r.json() == {"error": "query backend unavailable; retry later"}
        monkeypatch.undo()
        assert post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "local"}).status_code == 200


def test_api_key_auth(pool, monkeypatch, tmp_path):
    """The write key creates and queries, the read key only queries (within its namespaces); /health shows no
    state without a key."""
    with running(pool, keyed(read_scope=frozenset({"default"})), roots=(tmp_path,)) as url:
        body = {"question": SUCCESSOR_Q, "route": "local"}
        assert post(f"{url}/api/query", json=body).status_code == 401
        assert post(f"{url}/api/query", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert post(f"{url}/api/query", json=body, headers={"Authorization": f"Bearer {WRITE_KEY}"}).status_code == 200
        assert post(f"{url}/api/query", json=body, headers={"X-API-Key": READ_KEY}).status_code == 200
        for path in ("/metrics", "/api/namespaces", "/api/runs/abc"):
            assert get(f"{url}{path}").status_code == 401
        assert post(f"{url}/api/kg/create", json={"path": str(tmp_path)}).status_code == 401
        r = post(f"{url}/api/kg/create", json={"path": str(tmp_path)}, headers={"X-API-Key": READ_KEY})
        assert r.status_code == 403 and r.json() == {"error": "this key may only query"}
        other = post(f"{url}/api/query", json={**body, "namespace": "other"}, headers={"X-API-Key": READ_KEY})
        assert other.status_code == 403 and "namespace 'other'" in other.text
        assert get(f"{url}/health").json() == {"status": "ok"}  # no namespaces, no process ids
        full = get(f"{url}/health", headers={"X-API-Key": READ_KEY}).json()
        assert full["namespaces"] == ["default"] and full["engines"]
    env = {"LAZYHIPPO_API_KEY": None, "LAZYHIPPO_READ_KEY": None}
    for name in env:
        monkeypatch.delenv(name, raising=False)
    assert Access.for_host(environment(), "127.0.0.1").token and not Access.for_host(environment(), "localhost").keys
    with pytest.raises(ValueError, match="LAZYHIPPO_API_KEY"):
        Access.for_host(environment(), "0.0.0.0")
    for weak in ("k", "x" * 40, "abcdefghijklmno"):  # short, or no variety
        monkeypatch.setenv("LAZYHIPPO_API_KEY", weak)
        with pytest.raises(ValueError, match="at least 16 random characters"):
            Access.for_host(environment(), "0.0.0.0")
    monkeypatch.setenv("LAZYHIPPO_API_KEY", WRITE_KEY)
    access = Access.for_host(environment(), "0.0.0.0")
    assert access.keys == ((WRITE_KEY, Grant(True)),) and access.token is None


def wait_run(url: str, run_id: str, headers: dict | None = None, seconds: float = 300) -> dict:
    deadline = time.time() + seconds
    while True:
        status = get(f"{url}/api/runs/{run_id}", headers=headers).json()
        if status["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        assert time.time() < deadline, f"run {run_id} did not end: {status}"
        time.sleep(0.5)


def documents_metadata(instance, run_id: str) -> dict:
    """The `documents` materialization's counts of a run, as the instance holds them."""
    import dagster as dg

    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        materialization = entry.dagster_event.event_specific_data.materialization
        if materialization.asset_key == dg.AssetKey("documents"):
            return {k.removeprefix("documents_"): v.value for k, v in materialization.metadata.items()
                    if k in ("documents_added", "documents_changed", "documents_removed", "documents_failed")}
    raise AssertionError(f"run {run_id} materialized no documents")


def test_kg_create_and_upload_run_the_index_job_in_their_own_process(pool, tmp_path, monkeypatch):
    """Each run is a Dagster run of the home's instance, executed by a `lazyhippo index` process; the API
    reports the instance's status, tags, failure reason and document counts; SUCCESS means the new index
    already answers."""
    import dagster as dg

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_CORPUS, src)
    (src / "barrow.txt").write_text(NEW_DOC)
    token = {"X-Lazyhippo-Token": TOKEN}
    with running(pool, roots=(tmp_path,)) as url:
        assert post(f"{url}/api/kg/create", json={"path": str(src), "namespace": "../x"}, headers=token).status_code == 400
        assert get(f"{url}/api/runs/no-such-run").status_code == 404
        r = post(f"{url}/api/kg/create", json={"path": str(src), "namespace": "lights"}, headers=token)
        assert r.status_code == 202 and r.json()["status"] == "QUEUED" and r.json()["mode"] == "replace"
        status = wait_run(url, r.json()["run_id"])
        assert status["status"] == "SUCCESS", status
        assert status["documents"] == {"added": 9, "changed": 0, "removed": 0, "failed": 0}
        assert "lights" in get(f"{url}/api/namespaces").json()["namespaces"]  # served once reported
        r = post(f"{url}/api/query", json={"question": NEW_Q, "namespace": "lights", "route": "local"})
        assert r.status_code == 200 and "Quillon Barrow" in r.json()["answer"]
        files = [("files", (p.name, p.read_bytes())) for p in sorted(src.iterdir()) if p.suffix != ".json"]
        for bad in (".env", "questions.json"):  # hidden, unsupported
            assert post(f"{url}/api/kg/upload", files=[("files", (bad, b"x"))], data={"namespace": "up"},
                        headers=token).status_code == 400
        r = post(f"{url}/api/kg/upload", files=files, data={"namespace": "uploaded"}, headers=token)
        assert r.status_code == 202
        assert wait_run(url, r.json()["run_id"])["status"] == "SUCCESS"
        r = post(f"{url}/api/query", json={"question": NEW_Q, "namespace": "uploaded", "route": "local"})
        assert r.status_code == 200 and "Quillon Barrow" in r.json()["answer"]
        assert r.json()["citations"][0]["source"] == "barrow.txt"
        assert len(list((pool.settings.home / "uploads" / "uploaded").glob("*/barrow.txt"))) == 1
        r = post(f"{url}/api/kg/upload", files=[("files", ("scan.pdf", b"%PDF-1.4 not a PDF"))],
                 data={"namespace": "scans"}, headers=token)  # nothing readable: a failed run that says why
        failed = wait_run(url, r.json()["run_id"])
        assert failed["status"] == "FAILURE" and failed["error"].startswith("no readable document"), failed
        assert str(pool.settings.home) not in failed["error"]
    instance = dg.DagsterInstance.from_config(str(tmp_path / "dagster"))
    created = instance.get_run_by_id(status["run_id"])
    assert created is not None and created.job_name == "index" and created.status.value == status["status"]
    assert created.tags["lazyhippo/namespace"] == created.tags["dagster/partition"] == "lights"
    assert created.tags["lazyhippo/operation"] == "index" and created.tags["lazyhippo/mode"] == "replace"
    assert status["tags"] == dict(created.tags)
    assert documents_metadata(instance, status["run_id"]) == status["documents"]
    refused = instance.get_run_by_id(failed["run_id"])  # refused before it executed: recorded failed all the same
    assert refused.status == dg.DagsterRunStatus.FAILURE and refused.tags["lazyhippo/namespace"] == "scans"
    reason = instance.all_logs(failed["run_id"], of_type=dg.DagsterEventType.RUN_FAILURE)[-1].dagster_event.message
    assert reason.startswith("no readable document") and failed["error"] == public_error(reason, None)


def test_a_cancel_over_http_ends_the_dagster_run_canceled(pool, tmp_path, monkeypatch):
    """A waiting run is canceled before it starts, a running one's process is ended: both end CANCELED in the
    instance and in the API, and the process's output goes nowhere the server reads."""
    import dagster as dg

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_CORPUS, src)
    token = {"X-Lazyhippo-Token": TOKEN}
    with running(pool, roots=(tmp_path,)) as url:
        first, second = (post(f"{url}/api/kg/create", json={"path": str(src), "namespace": ns}, headers=token).json()
                         for ns in ("first", "second"))
        assert post(f"{url}/api/runs/{second['run_id']}/cancel").status_code == 401  # a write: token or key
        r = post(f"{url}/api/runs/{second['run_id']}/cancel", headers=token)
        assert r.status_code == 202 and r.json()["status"] == "CANCELED", r.json()
        deadline = time.time() + 120
        while get(f"{url}/api/runs/{first['run_id']}").json()["status"] != "STARTED":
            assert time.time() < deadline, "the first run never started"
            time.sleep(0.2)
        child = next(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and alive(int(p.name))
                     and first["run_id"].encode() in (p / "cmdline").read_bytes())
        # its output goes nowhere the server reads: /dev/null, or Dagster's compute logs while a step runs; no pipe
        assert not any(os.readlink(f"/proc/{child}/fd/{fd}").startswith("pipe:") for fd in (1, 2))
        r = post(f"{url}/api/runs/{first['run_id']}/cancel", headers=token)
        assert r.status_code == 202
        ended = wait_run(url, first["run_id"])
        assert ended["status"] == "CANCELED" and not alive(child)
        assert post(f"{url}/api/runs/{first['run_id']}/cancel", headers=token).status_code == 409
        assert get(f"{url}/api/runs/{second['run_id']}").json()["status"] == "CANCELED"
    instance = dg.DagsterInstance.from_config(str(tmp_path / "dagster"))
    for run, namespace in ((first, "first"), (second, "second")):
        record = instance.get_run_by_id(run["run_id"])
        assert record.status == dg.DagsterRunStatus.CANCELED and record.tags["lazyhippo/namespace"] == namespace


def test_index_swaps_atomically_under_load(any_pool, home, tmp_path):
    """Clients query without pause while another process re-indexes the namespace with one more document: no
    request fails, answers come from the old index until the swap and from the new one after it."""
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_CORPUS, src)
    (src / "barrow.txt").write_text(NEW_DOC)
    results: list[tuple[float, int, bool]] = []
    stop = threading.Event()

    def client():
        with httpx.Client(timeout=TIMEOUT) as c:
            while not stop.is_set():
                r = c.post(f"{url}/api/query", json={"question": NEW_Q, "route": "local", "top_k": 3})
                found = r.status_code == 200 and has_new_doc(r.json())
                results.append((time.time(), r.status_code, found))

    pool = any_pool
    with running(pool) as url:
        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        code = ("from pathlib import Path; from lazyhippo.settings import Settings; from lazyhippo.index import run_index; "
                f"run_index(Settings(home=Path({str(home)!r}), source={str(src)!r}))")
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, timeout=600)
        deadline = time.time() + 60
        while not (results and results[-1][2] and pool.swaps >= 1):
            assert time.time() < deadline, "the new index was never swapped in"
            time.sleep(0.2)
        all_swapped = len(results)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(60)
    assert [s for _, s, _ in results if s != 200] == []
    first_new = next(i for i, (_, _, found) in enumerate(results) if found)
    # one index swaps at once; engines each swap on their own, so answers are all new once every engine has
    # swapped (`EnginePool.swaps` is the slowest engine's count); the 8 allow for queries still in flight
    settled = first_new if isinstance(pool, IndexPool) else all_swapped
    assert first_new > 0 and all(found for _, _, found in results[settled + 8:])


def test_engines_share_the_queries_of_one_connection_and_a_dead_one_is_replaced(home):
    """Each query goes to a free engine, so even one keep-alive connection keeps both busy (uvicorn's own
    workers each keep the connections they accepted: 8 clients split 8/0 or 7/1 over 2); the query an engine
    was running when it died goes to the live one, and the dead one is started again. The engine is stopped
    before it is killed, so the query is on it when it dies (killed while idle, it may already be skipped)."""
    pool = EnginePool(Settings(home=home), 2).start()
    body = {"question": SUCCESSOR_Q, "route": "local"}
    try:
        with running(pool) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as c:
            for _ in range(6):
                assert c.post("/api/query", json=body).status_code == 200
            engines = c.get("/health").json()["engines"]
            assert [e["queries"] for e in engines] == [3, 3] and all(alive(e["pid"]) for e in engines)
            r = c.post("/api/query", json={**body, "namespace": "nowhere"})  # an engine's error, raised in the front
            assert r.status_code == 404 and "unknown namespace 'nowhere' (known: default)" in r.text
            os.kill(engines[0]["pid"], signal.SIGSTOP)  # alive, answering nothing
            sent = c.get("/health").json()["engines"][0]["queries"]
            codes: list[int] = []
            asking = [threading.Thread(target=lambda: codes.append(post(f"{url}/api/query", json=body).status_code))
                      for _ in range(2)]  # the two engines are free: one query goes to each
            for t in asking:
                t.start()
            deadline = time.time() + TIMEOUT
            while c.get("/health").json()["engines"][0]["queries"] == sent:
                assert time.time() < deadline, "no query went to the stopped engine"
                time.sleep(0.05)
            os.kill(engines[0]["pid"], signal.SIGKILL)
            for t in asking:
                t.join(TIMEOUT)
            assert sorted(codes) == [200, 200]
            deadline = time.time() + TIMEOUT
            while len(now := c.get("/health").json()["engines"]) < 2 or engines[0]["pid"] in [e["pid"] for e in now]:
                assert time.time() < deadline, "the dead engine was not replaced"  # (in the background)
                time.sleep(0.2)
            assert all(c.post("/api/query", json=body).status_code == 200 for _ in range(4))
    finally:
        pool.stop()
    assert not any(alive(e["pid"]) for e in now)


def test_engines_hold_off_during_a_run_the_server_launched_and_swap_when_it_ends(home, tmp_path):
    """`begin_write`/`end_write` reach every engine: no half-way refresh, every engine on the new index once
    `end_write` returns (the API's `kg_create` brackets its index runs with them)."""
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_CORPUS, src)
    (src / "barrow.txt").write_text(NEW_DOC)
    pool = EnginePool(Settings(home=home), 2, settle_seconds=0.1, poll_seconds=0.1).start()
    try:
        pool.begin_write()
        run_index(Settings(home=home, source=str(src)))
        time.sleep(1.0)  # many polls and settles: a held engine still does not refresh
        assert not any(has_new_doc(pool.answer("default", NEW_Q, "local", 3).to_dict()) for _ in range(2))
        pool.end_write()
        assert pool.swaps == 1 and all(has_new_doc(pool.answer("default", NEW_Q, "local", 3).to_dict()) for _ in range(2))
        before = [e["queries"] for e in pool.engines()]
        with pytest.raises(Exception):  # an argument that does not pickle never reaches an engine...
            pool.answer("default", NEW_Q, "local", 3, llm=lambda: None)
        pool.answer("default", NEW_Q, "local", 3)
        pool.answer("default", NEW_Q, "local", 3)
        assert [e["queries"] for e in pool.engines()] == [b + 1 for b in before]  # ...and both engines still serve
    finally:
        pool.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_command_on_loopback_with_an_api_key(home, tmp_path, workers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "LAZYHIPPO_API_KEY": WRITE_KEY, "DAGSTER_HOME": str(tmp_path / "d")}
    proc = subprocess.Popen([sys.executable, "-c", "from lazyhippo_dagster.cli import app; app()", "serve", "--home", str(home),
                             "--port", str(port), "--workers", str(workers)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 120
        while True:
            try:
                if get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.time() < deadline and proc.poll() is None, proc.stdout.read().decode() if proc.poll() is not None else "timeout"
                time.sleep(0.5)
        assert post(f"{url}/api/query", json={"question": SUCCESSOR_Q}).status_code == 401
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q}, headers={"X-API-Key": WRITE_KEY})
        assert r.status_code == 200 and r.json()["citations"]
        engines = [e["pid"] for e in get(f"{url}/health", headers={"X-API-Key": WRITE_KEY}).json()["engines"]]
        assert len(engines) == workers and (workers == 1) == (engines == [proc.pid])
    finally:
        proc.terminate()
        proc.wait(20)
    assert not any(alive(pid) for pid in engines)  # engine processes end with the server
    env.pop("LAZYHIPPO_API_KEY")
    out = subprocess.run([sys.executable, "-c", "from lazyhippo_dagster.cli import app; app()", "serve", "--home", str(home),
                          "--host", "0.0.0.0"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "LAZYHIPPO_API_KEY" in out.stderr


def test_load_generator_counts_requests_and_errors(pool):
    from lazyhippo.evaluate.bench_serve import run_load

    with running(pool) as url:
        good = run_load(url, [SUCCESSOR_Q, NEW_Q], "local", clients=2, seconds=1.0, warmup=1)
        bad = run_load(url, [SUCCESSOR_Q], "fastest", clients=2, seconds=0.5, warmup=0)
        paced = run_load(url, [SUCCESSOR_Q], "local", clients=2, seconds=1.0, warmup=0, rate=10)
    assert good.requests > 0 and good.errors == 0 and good.p50_ms > 0 and good.p99_ms >= good.p95_ms >= good.p50_ms
    assert bad.requests > 0 and bad.errors == bad.requests and "HTTP 400" in bad.error_samples[0]
    assert paced.errors == 0 and paced.requests <= 10


def test_the_load_clock_starts_after_every_client_warmed_up(monkeypatch):
    """A paced run's schedule starts once the warm-up requests are answered: a clock started before them made
    every send due during the warm-up go out at once, late, and that backlog was the p95 of a paced run."""
    import lazyhippo.evaluate.bench_serve as bench_serve

    class SlowWarmup:  # a server that answers at once, except for each connection's warm-up requests
        def __init__(self, *args):
            self.calls = 0

        def post_query(self, question, route):
            self.calls += 1
            if self.calls <= 5:
                time.sleep(0.2)
            return 200, "{}"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(bench_serve, "Connection", SlowWarmup)
    report = bench_serve.run_load("http://unused", list("abcde"), "local", clients=2, seconds=2.0, warmup=5, rate=10)
    assert report.requests == 20 and report.errors == 0
    assert report.p99_ms < 150  # a backlog from the 1 s warm-up would put it near 1,000 ms


def test_a_failed_refresh_keeps_the_old_index_and_is_retried(home, monkeypatch):
    import lazyhippo.serve.pool as serving
    from lazyhippo.stores.warehouse import snapshot_dir, snapshot_path

    pool = IndexPool(Settings(home=home), settle_seconds=0.0).start()
    pool.stop()  # no poller: refresh by hand
    old = pool.get("default").index
    # a publish replaces the snapshot file, which changes it and its folder (the pool watches the folder)
    for db in (snapshot_path(Settings(home=home)), snapshot_dir(Settings(home=home))):
        st = os.stat(db)
        os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    real = serving.load_index

    def locked(*args, **kwargs):
        raise OSError("warehouse locked by a writer")

    real_republish = serving.republish_from_warehouse
    monkeypatch.setattr(serving, "load_index", locked)
    monkeypatch.setattr(serving, "republish_from_warehouse", locked)  # the writer holds the warehouse too
    assert pool.refresh(force=True) is False and set(pool.damaged) == {"default"}
    assert pool.get("default").index is old and pool.swaps == 0 and pool.health()["status"] == "degraded"
    monkeypatch.setattr(serving, "load_index", real)
    monkeypatch.setattr(serving, "republish_from_warehouse", real_republish)
    assert pool.refresh() is False and pool.refresh() is True  # seen once, then settled (settle 0 s): retried
    assert pool.get("default").index is not old and pool.swaps == 1 and pool.health() == {"status": "ok"}


def test_answers_say_when_the_latest_index_run_did_not_finish(pool, home):
    """A run killed half-way leaves the last complete index served, and every answer says so."""
    from lazyhippo.stores.warehouse import _write_state

    with running(pool) as url:
        ok = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "local"})
        assert ok.status_code == 200 and "notice" not in ok.json()
        gone = subprocess.Popen(["true"])
        gone.wait()  # a pid that no longer runs: the run's process was killed
        _write_state(Settings(home=home), run_id="r-killed", status="running", pid=gone.pid,
                     host=socket.gethostname(), started_at="2026-11-22T09:00:00")
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": "local"})
        assert r.status_code == 200 and r.json()["citations"]
        assert "r-killed" in r.json()["notice"] and "did not finish" in r.json()["notice"]
        assert "last complete index" in r.json()["notice"]


def test_a_loaded_index_is_kept_out_of_the_cyclic_collector(pool):
    """Millions of long-lived index objects: a full collection walking them stalls whatever query is running."""
    import gc
    import weakref

    from lazyhippo.stores.warehouse import snapshot_path

    def published_again() -> None:  # a new version of the snapshot, as an index run publishes it
        snapshot = snapshot_path(pool.settings)
        st = os.stat(snapshot)
        os.utime(snapshot, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    gc.unfreeze()
    published_again()
    assert pool.refresh(force=True)
    warm = pool.get("default")
    assert gc.get_freeze_count() > 0
    old = weakref.ref(warm.index.entities)
    del warm
    published_again()
    pool.refresh(force=True)  # a swap unfreezes: the replaced index can be freed
    gc.collect()
    assert pool.get("default").index.entities is not None and gc.get_freeze_count() > 0
    assert old() is None or old() is pool.get("default").index.entities
