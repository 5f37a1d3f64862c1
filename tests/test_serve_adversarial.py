"""The HTTP API and the MCP tool tried as an adversary would, on loopback only: paths outside the source roots,
bursts of index runs, requests from web pages, stale documents, a stuck engine, bodies sent before the key,
parser bombs, hostile names and text. Each case is bounded in time; new cases join the group they attack."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from lazyhippo.serve.engines import EnginePool
from lazyhippo.serve.limits import Limits
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.sources.files import read_path, read_source
from lazyhippo.sources.pdf import ParseLimits
from lazyhippo.stores.warehouse import snapshot_path
from tests.services_fixtures import namespaces, neo4j_store  # noqa: F401 - fixtures
from tests.test_serve import (  # noqa: F401 - fixtures
    NEW_DOC,
    NEW_Q,
    READ_KEY,
    REPO,
    SUCCESSOR_Q,
    TOKEN,
    WRITE_KEY,
    alive,
    get,
    home,
    keyed,
    pool,
    post,
    running,
    wait_run,
)

TOKEN_HEADERS = {"X-Lazyhippo-Token": TOKEN}
BAD_INPUT = Path(__file__).resolve().parent.parent.parent / "shared" / "badinput" / "pdfs"


def _rows(folder: Path, name: str, rows: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(json.dumps({"id": k, "title": k, "text": v}) for k, v in rows.items()))


# ---------------------------------------------------------------- 1. kg_create reads only under source roots

def test_kg_create_is_off_until_the_operator_names_source_roots(pool, tmp_path):
    with running(pool) as url:
        r = post(f"{url}/api/kg/create", json={"path": str(SAMPLE_CORPUS)}, headers=TOKEN_HEADERS)
    assert r.status_code == 403 and "LAZYHIPPO_SOURCE_ROOTS" in r.json()["error"]


def test_kg_create_refuses_every_path_outside_the_roots_with_one_answer(pool, tmp_path):
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    shutil.copy(SAMPLE_CORPUS / "ada_fenwick.md", root / "docs")
    (root / "credentials.env").write_text("NEO4J_PASSWORD=secret")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "b.txt").write_text("hidden")
    (root / "to_etc").symlink_to("/etc")
    (root / "passwd.txt").symlink_to("/etc/passwd")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside the root")
    probes = ["/etc/passwd", "/etc", str(root / "to_etc"), str(root / "passwd.txt"), str(root / "credentials.env"),
              str(root / ".hidden"), str(root / ".hidden" / "b.txt"), str(root / "docs" / ".." / ".." / "outside.txt"),
              str(outside), "../outside.txt", str(root / "missing"), "/no/such/path", "", "docs\x00/etc/passwd",
              "docs/\ud800", "~root/.bashrc"]
    with running(pool, roots=(root,)) as url:
        answers = {p: post(f"{url}/api/kg/create", content=json.dumps({"path": p, "namespace": "leak"}),  # ASCII escapes
                           headers={**TOKEN_HEADERS, "content-type": "application/json"}) for p in probes}
        ok = post(f"{url}/api/kg/create", json={"path": "docs", "namespace": "inside"}, headers=TOKEN_HEADERS)
        assert ok.status_code == 202  # a path relative to the root
        assert wait_run(url, ok.json()["run_id"], seconds=300)["status"] == "SUCCESS"
        assert get(f"{url}/api/namespaces").json()["namespaces"] == ["default", "inside"]
    for path, r in answers.items():
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"] == f"path {path!r} is not an indexable folder or file under a source root"


def test_a_single_file_of_an_unsupported_type_is_never_read():
    docs, errors = read_source(Path("/etc/passwd"), 10**6)
    assert docs == [] and errors[0].reason.startswith("unsupported file type")


# ---------------------------------------------------------------- 2. index runs out of the serving process

def test_a_burst_of_creates_and_uploads_never_blocks_the_server(pool, tmp_path, monkeypatch):
    """8 submissions at once: the queue takes what it can hold (the rest get 429), /health answers within 1 s
    throughout, and every accepted run ends."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    for i in range(4):
        _rows(tmp_path / "root" / f"s{i}", "rows.jsonl", {f"r{i}": f"Quillon Barrow {i} tended the light at Skerry Point."})
    codes: list[int] = []
    accepted: list[str] = []

    def submit(i: int) -> None:
        if i % 2:
            r = post(f"{url}/api/kg/create", json={"path": f"s{i // 2}", "namespace": f"burst{i}"}, headers=TOKEN_HEADERS)
        else:
            r = post(f"{url}/api/kg/upload", files=[("files", ("a.txt", f"Ada Fenwick {i} founded the Marlow Observatory.".encode()))],
                     data={"namespace": f"burst{i}"}, headers=TOKEN_HEADERS)
        codes.append(r.status_code)
        if r.status_code == 202:
            accepted.append(r.json()["run_id"])

    with running(pool, limits=Limits(max_pending_runs=3), roots=(tmp_path / "root",)) as url:
        threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(set(codes)) == [202, 429] and 3 <= len(accepted) <= 4
        pending = set(accepted)
        deadline = time.time() + 600
        while pending:
            t0 = time.perf_counter()
            assert get(f"{url}/health", timeout=1).status_code == 200 and time.perf_counter() - t0 < 1
            pending = {r for r in pending if get(f"{url}/api/runs/{r}").json()["status"] not in ("SUCCESS", "FAILURE", "CANCELED")}
            assert time.time() < deadline
            time.sleep(0.5)
        ended = [get(f"{url}/api/runs/{r}").json() for r in accepted]
        assert all(run["status"] == "SUCCESS" for run in ended), ended
        assert threading.active_count() < 60


# ---------------------------------------------------------------- 3. web pages against a keyless loopback server

def test_a_keyless_server_refuses_foreign_hosts_origins_and_writes_without_the_token(pool, tmp_path):
    (tmp_path / "a.txt").write_text("Planted text.")
    upload = {"files": [("files", ("a.txt", b"Planted text."))], "data": {"namespace": "planted"}}
    with running(pool, roots=(tmp_path,)) as url:
        port = url.rsplit(":", 1)[1]
        body = {"question": SUCCESSOR_Q, "route": "local"}
        rebound = post(f"{url}/api/query", json=body, headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 400 and "loopback host" in rebound.text
        for origin in ("http://attacker.example", f"http://localhost:{int(port) + 1}", "null"):
            r = post(f"{url}/api/kg/upload", **upload, headers={"Origin": origin})
            assert r.status_code == 403, origin
        assert post(f"{url}/api/query", json=body, headers={"Origin": url}).status_code == 200  # its own pages
        for headers in ({}, {"X-Lazyhippo-Token": "guessed"}, {"Authorization": "Bearer guessed"}):
            r = post(f"{url}/api/kg/upload", **upload, headers=headers)
            assert r.status_code == 401 and "token printed at server start" in r.text
            r = post(f"{url}/api/kg/create", json={"path": str(tmp_path)}, headers=headers)
            assert r.status_code == 401
        assert not (pool.settings.home / "uploads").exists()
        assert get(f"{url}/health", headers={"Host": "localhost"}).status_code == 200
        assert get(f"{url}/health", headers={"Host": "[::1]"}).status_code == 200


def _running_with(marker: str) -> list[int]:
    """Processes whose command line names `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_the_serve_command_prints_its_token_and_sigterm_ends_it_during_a_run(home, tmp_path):
    """Keyless: the token printed at start lets a create through; SIGTERM in the middle of the run ends the
    server and the run's process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = tmp_path / "roots" / "sigterm-src"
    shutil.copytree(SAMPLE_CORPUS, src)
    env = {k: v for k, v in os.environ.items() if k not in ("LAZYHIPPO_API_KEY", "LAZYHIPPO_READ_KEY")}
    env.update(DAGSTER_HOME=str(tmp_path / "d"), LAZYHIPPO_SOURCE_ROOTS=str(tmp_path / "roots"))
    proc = subprocess.Popen([sys.executable, "-m", "lazyhippo_dagster.cli", "serve", "--home", str(home), "--port",
                             str(port)], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "X-Lazyhippo-Token" not in line.replace("x-lazyhippo-token", "X-Lazyhippo-Token"):
            line = proc.stderr.readline()
            assert line, "the server ended without printing a token"
        token = line.rsplit(":", 1)[1].strip()
        assert len(token) >= 24
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                r = post(f"{url}/api/kg/create", json={"path": "sigterm-src"}, headers={"X-Lazyhippo-Token": token})
                break
            except httpx.TransportError:
                assert time.time() < deadline
                time.sleep(0.3)
        assert r.status_code == 202
        while not _running_with(str(src)):  # the index process is under way
            assert time.time() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) is not None
        deadline = time.time() + 30
        while _running_with(str(src)):
            assert time.time() < deadline, "the run's process outlived the server"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


# ---------------------------------------------------------------- 4. re-creating a knowledge base

def test_replace_drops_what_the_new_source_lacks_and_add_drops_nothing(pool, tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    root = tmp_path / "root"
    _rows(root / "v1", "a.jsonl", {"a1": "Ada Quist built the tide clock of Harwick."})
    _rows(root / "v1", "b.jsonl", {"b1": "Borin Tallow painted the harbour gates of Lindmoor."})
    _rows(root / "v2", "a.jsonl", {"a1": "Ada Quist built the tide clock of Harwick."})
    _rows(root / "v3", "c.jsonl", {"c1": "Cela Voss mapped the salt caves of Orrin."})
    question = {"question": "Who painted the harbour gates of Lindmoor?", "namespace": "rm2", "route": "local"}

    def create(path: str, mode: str | None = None) -> dict:
        r = post(f"{url}/api/kg/create", json={"path": path, "namespace": "rm2", **({"mode": mode} if mode else {})},
                 headers=TOKEN_HEADERS)
        assert r.status_code == 202, r.text
        status = wait_run(url, r.json()["run_id"])
        assert status["status"] == "SUCCESS", status
        return status

    def sources() -> set[str]:
        r = post(f"{url}/api/query", json=question)
        return {c["source"].split("#")[0] for c in r.json()["context"]}

    with running(pool, roots=(root,)) as url:
        assert create("v1")["documents"] == {"added": 2, "changed": 0, "removed": 0, "failed": 0}
        assert "b.jsonl" in sources()
        replaced = create("v2")  # the default mode is replace
        assert replaced["mode"] == "replace" and replaced["documents"] == {"added": 0, "changed": 0, "removed": 1, "failed": 0}
        assert sources() == {"a.jsonl"}
        added = create("v3", "add")
        assert added["documents"] == {"added": 1, "changed": 0, "removed": 0, "failed": 0}
        assert sources() == {"a.jsonl", "c.jsonl"}
        r = post(f"{url}/api/kg/create", json={"path": "v1", "namespace": "rm2", "mode": "merge"}, headers=TOKEN_HEADERS)
        assert r.status_code == 422 and "mode" in r.text
        uploads = []
        for text in ("Dala Fenn rowed the ferry of Quell.", "Erik Munn kept the bells of Sarrow."):
            r = post(f"{url}/api/kg/upload", files=[("files", ("u.txt", text.encode()))],
                     data={"namespace": "rm2"}, headers=TOKEN_HEADERS)
            uploads.append(wait_run(url, r.json()["run_id"]))
        assert uploads[1]["documents"] == {"added": 0, "changed": 1, "removed": 0, "failed": 0}  # a.jsonl, c.jsonl went with the first
        assert uploads[0]["documents"]["removed"] == 2 and sources() == {"u.txt"}
        assert len(list((pool.settings.home / "uploads" / "rm2").iterdir())) == 1  # older upload folders pruned


@pytest.mark.parametrize("graph_store", ["embedded", pytest.param("neo4j", marks=pytest.mark.services)])
def test_index_mode_on_the_cli_on_both_stores(tmp_path, monkeypatch, graph_store, request):
    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    namespace = "mode-cli"
    store = None
    if graph_store == "neo4j":
        namespace = request.getfixturevalue("namespaces")("mode")
        store = request.getfixturevalue("neo4j_store")
    _rows(tmp_path / "v1", "a.jsonl", {"a1": "Ada Quist built the tide clock of Harwick."})
    _rows(tmp_path / "v1", "b.jsonl", {"b1": "Borin Tallow painted the harbour gates of Lindmoor."})
    _rows(tmp_path / "v2", "a.jsonl", {"a1": "Ada Quist built the tide clock of Harwick."})
    _rows(tmp_path / "v3", "c.jsonl", {"c1": "Cela Voss mapped the salt caves of Orrin."})
    base = ["--home", str(tmp_path / "home"), "-n", namespace, "--graph-store", graph_store]

    def index(folder: str, *mode: str) -> str:
        out = CliRunner().invoke(app, ["index", str(tmp_path / folder), *base, *mode])
        assert out.exit_code == 0, out.output
        return " ".join(out.output.split())

    def held() -> set[str]:
        from lazyhippo.stores.warehouse import connect

        with connect(Settings(home=tmp_path / "home", namespace=namespace), read_only=True) as con:
            rows = {r[0].split("#")[0] for r in con.execute("SELECT source FROM documents WHERE namespace = ?",
                                                             [namespace]).fetchall()}
        if store is not None:  # the served graph holds the same documents
            served = store.query("MATCH (c:Chunk {namespace: $ns}) RETURN DISTINCT c.doc_id AS d", {"ns": namespace})
            with connect(Settings(home=tmp_path / "home", namespace=namespace), read_only=True) as con:
                ids = {r[0] for r in con.execute("SELECT doc_id FROM documents WHERE namespace = ?", [namespace]).fetchall()}
            assert {r["d"] for r in served} == ids
        return rows

    assert "2 added, 0 changed, 0 removed, 0 failed (mode replace)" in index("v1")
    assert "0 added, 0 changed, 1 removed, 0 failed (mode replace)" in index("v2", "--mode", "replace")
    assert held() == {"a.jsonl"}
    assert "1 added, 0 changed, 0 removed, 0 failed (mode add)" in index("v3", "--mode", "add")
    assert held() == {"a.jsonl", "c.jsonl"}
    bad = CliRunner().invoke(app, ["index", str(tmp_path / "v1"), *base, "--mode", "merge"])
    assert bad.exit_code == 2 and "merge" in bad.output


# ---------------------------------------------------------------- 5. a stuck engine

def test_a_stopped_engine_is_detected_killed_and_replaced(home):
    pool = EnginePool(Settings(home=home), 2, query_seconds=5, probe_seconds=2).start()
    body = {"question": SUCCESSOR_Q, "route": "local"}
    stopped = pool.engines()[0]["pid"]
    try:
        with running(pool) as url, httpx.Client(base_url=url, timeout=60) as c:
            assert c.post("/api/query", json=body).status_code == 200
            os.kill(stopped, signal.SIGSTOP)
            codes = []
            t_end = time.time() + 20
            while time.time() < t_end:
                for _ in range(5):
                    t0 = time.perf_counter()
                    assert c.get("/health").status_code == 200 and time.perf_counter() - t0 < 1
                t0 = time.perf_counter()
                codes.append(c.post("/api/query", json=body).status_code)
                assert time.perf_counter() - t0 < 10  # the stuck engine's query is cut off, not waited for
                if stopped not in [e["pid"] for e in c.get("/health").json()["engines"]] and len(pool.engines()) == 2:
                    break
            assert not alive(stopped) and len(pool.engines()) == 2
            assert set(codes) <= {200, 503} and codes.count(503) <= 1
            assert all(c.post("/api/query", json=body).status_code == 200 for _ in range(4))
    finally:
        if alive(stopped):
            os.kill(stopped, signal.SIGKILL)
        pool.stop()



def test_an_engine_reported_dead_by_several_threads_is_replaced_once(home, monkeypatch):
    """Front threads and the watchdog may all report one dead engine at once: their restart threads wake
    together when it exits, and only the one that takes it out of the pool closes its pipes and replaces it
    (two closing one pipe at once raised EBADF in the restart thread)."""
    errors: list = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    pool = EnginePool(Settings(home=home), 1, query_seconds=5, probe_seconds=2).start()
    try:
        for _ in range(3):
            dead = pool._engines[0]
            reporters = [threading.Thread(target=pool._restart, args=(dead,)) for _ in range(4)]
            for t in reporters:
                t.start()
            for t in reporters:
                t.join()
            t_end = time.time() + 60
            while [e["pid"] for e in pool.engines()] in ([], [dead.process.pid]) and time.time() < t_end:
                time.sleep(0.1)
            time.sleep(0.5)  # the other restart threads finish
            assert len(pool.engines()) == 1 and pool.engines()[0]["pid"] != dead.process.pid
        assert not errors, [e.exc_value for e in errors]
    finally:
        pool.stop()


# ---------------------------------------------------------------- 6. bodies before the key

def _raw_post(url: str, path: str, headers: dict[str, str], first_bytes: bytes) -> tuple[str, float]:
    """Send headers and the first bytes of a body, then read the status line without sending the rest."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{host}:{port}", **headers}.items())
        t0 = time.perf_counter()
        s.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + first_bytes)
        status = s.recv(4096).split(b"\r\n", 1)[0].decode()
        return status, time.perf_counter() - t0


def test_auth_is_decided_before_the_body_is_read(pool):
    with running(pool, keyed()) as url:
        status, seconds = _raw_post(url, "/api/kg/upload", {"Content-Type": "multipart/form-data; boundary=x",
                                                            "Content-Length": str(40 * 1024 * 1024)}, b"--x\r\n")
        assert status.endswith("401 Unauthorized") and seconds < 5
        r = post(f"{url}/api/query", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 401
    with running(pool) as url:  # keyless: a write without the token
        status, _ = _raw_post(url, "/api/kg/upload", {"Content-Length": str(40 * 1024 * 1024)}, b"x" * 1024)
        assert status.endswith("401 Unauthorized")


# ---------------------------------------------------------------- 7. parser bombs

def _content_bomb(path: Path, repeats: int) -> Path:
    """Three pages sharing one content stream of `repeats` text operators, compressed to a few kilobytes."""
    import zlib

    stream = zlib.compress(b"BT /F1 1 Tf (a) Tj ET\n" * repeats, 9)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >>",
               *[b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 6 0 R "
                 b"/Resources << /Font << /F1 7 0 R >> >> >>"] * 3,
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def test_a_pdf_bomb_is_stopped_by_the_cpu_memory_and_text_limits(tmp_path):
    bomb = _content_bomb(tmp_path / "bomb.pdf", 50_000)
    assert bomb.stat().st_size < 8192
    cases = [(ParseLimits(cpu_seconds=1), "over the CPU limit (1 s)"),
             (ParseLimits(memory_bytes=80 << 20), "over the memory limit (80 MB)"),
             (ParseLimits(max_chars=10_000), "extracted text over 10,000 characters")]
    for limits, reason in cases:
        t0 = time.perf_counter()
        [error] = list(read_path(bomb, tmp_path, 10**6, limits))
        assert error.source == "bomb.pdf" and reason in error.reason, error
        assert time.perf_counter() - t0 < 30
    small = _content_bomb(tmp_path / "small.pdf", 10)  # the same shape, small: read as usual
    [doc] = list(read_path(small, tmp_path, 10**6))
    assert [s.page for s in doc.sections] == [1, 2, 3]


@pytest.mark.skipif(not BAD_INPUT.exists(), reason=f"shared bad-input PDFs not found at {BAD_INPUT}")
def test_malformed_pdfs_stay_per_file_errors_in_the_child_process(tmp_path):
    docs, errors = read_source(BAD_INPUT, 10**6, ParseLimits(cpu_seconds=10))
    assert docs == [] and len(errors) == len(list(BAD_INPUT.glob("*.pdf")))


# ---------------------------------------------------------------- 8. hostile names, text and files

@pytest.mark.parametrize("name", ["x" * 300 + ".txt", "a\x00b.txt", "é" * 130 + ".txt", "..", "/", "notes.exe"])
def test_hostile_upload_names_are_a_400_and_leave_nothing_behind(pool, name):
    """The multipart body is written by hand: a client library would escape the NUL."""
    body = (b'--b\r\nContent-Disposition: form-data; name="namespace"\r\n\r\nnames\r\n'
            b'--b\r\nContent-Disposition: form-data; name="files"; filename="' + name.encode() + b'"\r\n'
            b"Content-Type: text/plain\r\n\r\nsome text\r\n--b--\r\n")
    with running(pool) as url:
        r = post(f"{url}/api/kg/upload", content=body,
                 headers={**TOKEN_HEADERS, "Content-Type": "multipart/form-data; boundary=b"})
    assert r.status_code == 400 and "Traceback" not in r.text
    assert not list((pool.settings.home / "uploads").glob("names/*"))


def test_an_empty_namespace_is_refused_not_taken_for_default(pool):
    with running(pool) as url:
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "namespace": ""})
        assert r.status_code == 400 and "invalid namespace ''" in r.text
        r = post(f"{url}/api/kg/upload", files=[("files", ("a.txt", b"text"))], data={"namespace": ""},
                 headers=TOKEN_HEADERS)
        assert r.status_code == 400 and "invalid namespace ''" in r.text


def test_an_unpaired_surrogate_is_bad_input_not_a_backend_failure(pool):
    with running(pool) as url:
        r = post(f"{url}/api/query", content=b'{"question": "Who founded \\ud800 the observatory?"}',
                 headers={"content-type": "application/json"})
        assert r.status_code == 400 and "unpaired surrogate" in r.text
        r = post(f"{url}/api/query", content=b'{"question": "Who?", "history": [{"role": "user", "content": "\\udfff"}]}',
                 headers={"content-type": "application/json"})  # refused by the field's validation
        assert r.status_code == 422 and "history.0.content" in r.text and "unicode" in r.text


def test_malformed_json_rpc_over_mcp_gets_error_replies_and_the_session_goes_on(sample_settings, tmp_path):
    """Unparsable lines, wrong shapes, unpaired surrogates and deep nesting each get a JSON-RPC error (a
    notification none); the session answers the next request, and a literal U+FFFD is ordinary text."""
    proc = subprocess.Popen([sys.executable, "-m", "lazyhippo_dagster.cli", "mcp", "--home", str(sample_settings.home)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO,
                            env={**os.environ, "DAGSTER_HOME": str(tmp_path / "d")})
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

    def call(message: dict) -> None:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    try:
        call({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "adversary", "version": "1"}}})
        assert json.loads(lines.get(timeout=120))["id"] == 1
        call({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "lazyhippo_retrieve", "arguments": {"query": "Who \ud800 founded it?"}}})
        reply = json.loads(lines.get(timeout=60))
        assert reply["id"] == 2 and reply["error"]["code"] == -32602 and "not valid Unicode" in reply["error"]["message"]
        head = b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "lazyhippo_retrieve", ' \
               b'"arguments": {"query": "\\udfff", "x": '
        for depth, ident, code in ((100_000, None, -32700), (100, 3, -32600)):  # too deep to parse; parsed, too deep
            proc.stdin.write(head + b"[" * depth + b"]" * depth + b"}}}\n")
            proc.stdin.flush()
            reply = json.loads(lines.get(timeout=60))
            assert reply["id"] == ident and reply["error"]["code"] == code, reply
        for raw, ident, code in ((b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": ', None, -32700),
                                 (b'{"jsonrpc": "1.0", "id": 5, "method": "tools/call"}', 5, -32600),
                                 (b'{"jsonrpc": "2.0", "id": 6, "method": 7}', 6, -32600),
                                 (b'[1, 2]', None, -32600), (b"\xff\xfe", None, -32700)):
            proc.stdin.write(raw + b"\n")
            proc.stdin.flush()
            reply = json.loads(lines.get(timeout=60))
            assert reply["id"] == ident and reply["error"]["code"] == code, (raw, reply)
        call({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"x": "\ud800"}})  # no reply
        call({"jsonrpc": "2.0", "id": 7, "method": "tools/call",  # a literal U+FFFD is valid text
              "params": {"name": "lazyhippo_retrieve", "arguments": {"query": "Who \ufffd succeeded the founder?", "limit": 2}}})
        reply = json.loads(lines.get(timeout=60))
        assert reply["id"] == 7 and not reply["result"].get("isError"), reply
        call({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
              "params": {"name": "lazyhippo_retrieve", "arguments": {"query": SUCCESSOR_Q, "limit": 2}}})
        reply = json.loads(lines.get(timeout=60))
        assert reply["id"] == 8 and not reply["result"].get("isError")
    finally:
        proc.kill()
        proc.wait(10)


def test_a_deleted_snapshot_is_published_again_and_its_namespace_kept(pool, home):
    settings = Settings(home=home)
    snapshot_path(settings).unlink()
    deadline = time.time() + 30
    while not snapshot_path(settings).exists():
        assert time.time() < deadline, "the snapshot was not published again"
        time.sleep(0.1)
    assert pool.namespaces() == ["default"]
    with running(pool) as url:
        assert post(f"{url}/api/query", json={"question": SUCCESSOR_Q}).status_code == 200


def test_errors_name_no_exception_class(pool, monkeypatch):
    def down(texts):
        raise ConnectionRefusedError("refused by 10.0.0.7")

    with running(pool, keyed()) as url:
        monkeypatch.setattr(pool.embedder.inner, "embed", down)
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q}, headers={"X-API-Key": READ_KEY})
        assert r.status_code == 503 and "Error" not in r.text and "10.0.0.7" not in r.text
        r = post(f"{url}/api/kg/create", json={"path": "/tmp"}, headers={"X-API-Key": WRITE_KEY})
        assert r.status_code == 403 and "Error" not in r.text


# ---------------------------------------------------------------- 9. abusive connections, before any key check

def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _status(s: socket.socket) -> str:
    return s.recv(65536).split(b"\r\n", 1)[0].decode()


def _health_ms(url: str) -> float:
    """The best of five /health round trips (one slow answer on a shared machine is noise; a server busy
    with an attacker answers all of them late)."""
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        assert get(f"{url}/health", timeout=5).status_code == 200
        times.append((time.perf_counter() - t0) * 1000)
    return min(times)


def test_oversized_or_numerous_headers_get_431_at_once_and_health_stays_fast(pool):
    with running(pool, keyed()) as url:
        for head in ("X-Big: " + "a" * 64 * 1024 * 1024 + "\r\n",                      # one 64 MB header
                     "".join(f"X-H{i}: {'b' * 100}\r\n" for i in range(200)),          # 20 KB in many headers
                     "".join(f"X-H{i}: b\r\n" for i in range(101)),                     # small but too many
                     "X-Line: " + "c" * 20_000 + "\r\n"):
            with _connect(url) as s:
                t0 = time.perf_counter()
                try:
                    s.sendall(f"GET /health HTTP/1.1\r\nHost: localhost\r\n{head}\r\n".encode())
                except (BrokenPipeError, ConnectionResetError):  # refused while the rest was still on its way
                    pass
                status = _status(s)
                assert status.endswith("431 Request Header Fields Too Large"), (head[:20], status)
                assert time.perf_counter() - t0 < 2
                assert _health_ms(url) < 100
        with _connect(url) as s:  # 100 headers of a normal size are fine
            s.sendall(("GET /health HTTP/1.1\r\nHost: localhost\r\n" + "".join(f"X-H{i}: b\r\n" for i in range(98))
                       + "\r\n").encode())
            assert _status(s).endswith("200 OK")


def test_slow_silent_and_idle_connections_are_closed_by_their_timeouts(pool):
    limits = Limits(header_seconds=0.5, body_seconds=0.5, idle_seconds=0.5)

    def closed_after(s: socket.socket, drip: bytes = b"") -> tuple[bytes, float]:
        """Send `drip` a byte every 0.1 s until the server answers or closes; what it sent and when."""
        t0, got = time.perf_counter(), b""
        s.settimeout(0.1)
        for i in range(100):
            try:
                if drip:
                    s.sendall(drip[i % len(drip):i % len(drip) + 1])
                chunk = s.recv(4096)
                got += chunk
                if not chunk:
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        return got, time.perf_counter() - t0

    with running(pool, keyed(), limits=limits) as url:
        with _connect(url) as s:  # silent: never sends a byte
            got, seconds = closed_after(s)
            assert got == b"" and 0.4 < seconds < 2
        with _connect(url) as s:  # slow headers: a byte at a time, never done
            s.sendall(b"GET /health HTTP/1.1\r\n")
            got, seconds = closed_after(s, b"X-Slow: aaaaaaaaaa\r\n")
            assert got.startswith(b"HTTP/1.1 408") and seconds < 2
        with _connect(url) as s:  # slow body
            s.sendall(f"POST /api/query HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {READ_KEY}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
            got, seconds = closed_after(s, b" ")
            assert got.startswith(b"HTTP/1.1 408") or got == b"", got
            assert seconds < 2
        with _connect(url) as s:  # idle after an answer: the keep-alive timeout
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert _status(s).endswith("200 OK")
            got, seconds = closed_after(s)
            assert got == b"" and seconds < 2
        assert _health_ms(url) < 1000  # still answering


def test_open_connections_are_capped(pool):
    with running(pool, keyed(), limits=Limits(max_connections=4, header_seconds=5)) as url:
        held = [_connect(url) for _ in range(4)]
        try:
            time.sleep(0.2)
            with _connect(url) as extra:
                assert _status(extra).endswith("503 Service Unavailable")
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        assert _health_ms(url) < 1000  # answering again


def test_the_host_check_reads_one_host_header_and_the_request_line(pool):
    with running(pool) as url:  # keyless: loopback names only
        for head in ("GET /health HTTP/1.1\r\nHost: localhost\r\nHost: attacker.example\r\n\r\n",
                     "GET http://attacker.example/health HTTP/1.1\r\nHost: localhost\r\n\r\n"):
            with _connect(url) as s:
                s.sendall(head.encode())
                assert _status(s).endswith("400 Bad Request"), head
        with _connect(url) as s:
            s.sendall(b"GET http://localhost/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert _status(s).endswith("200 OK")


# ---------------------------------------------------------------- 10. engines that come back, damaged snapshots

def test_the_engine_pool_comes_back_to_its_size_after_every_engine_died(home, monkeypatch):
    """Both engines die while replacements cannot start: /health answers at once (degraded, not a 500), a
    query fails within seconds instead of waiting a minute; once the cause is gone the pool is whole again."""
    pool = EnginePool(Settings(home=home), 2, probe_seconds=2, retry_seconds=0.2, max_retry_seconds=0.5,
                      fail_seconds=1).start()
    body = {"question": SUCCESSOR_Q, "route": "local"}
    snapshot = snapshot_path(Settings(home=home))
    try:
        with running(pool) as url, httpx.Client(base_url=url, timeout=60) as c:
            assert c.post("/api/query", json=body).status_code == 200
            monkeypatch.setenv("LAZYHIPPO_THREADS", "not-a-number")  # engines started from now on fail at once
            with open(snapshot, "r+b") as f:
                f.truncate(4096)  # and the published file is damaged
            dead = [e["pid"] for e in pool.engines()]
            for pid in dead:
                os.kill(pid, signal.SIGKILL)
            deadline = time.time() + 30
            while pool.engines():
                assert time.time() < deadline
                time.sleep(0.1)
            time.sleep(1)  # a few failed starts
            t0 = time.perf_counter()
            health = c.get("/health")
            assert health.status_code == 200 and time.perf_counter() - t0 < 0.1
            assert health.json()["status"] == "degraded" and health.json()["engines_running"] == 0
            t0 = time.perf_counter()
            assert c.post("/api/query", json=body).status_code == 503 and time.perf_counter() - t0 < 5
            monkeypatch.delenv("LAZYHIPPO_THREADS")  # the cause is gone: the next retry starts
            deadline = time.time() + 120
            while len(pool.engines()) < 2 or c.get("/health").json()["status"] != "ok":
                assert time.time() < deadline, c.get("/health").json()
                time.sleep(0.2)
            assert not set(dead) & {e["pid"] for e in pool.engines()}
            assert all(c.post("/api/query", json=body).status_code == 200 for _ in range(4))
    finally:
        pool.stop()


def test_a_query_on_a_stuck_engine_goes_to_a_live_one_once_it_is_replaced(home):
    """The query timeout is two minutes, but the stuck engine is killed after its missed probe (1 s): the query
    it held is answered by the live engine within seconds."""
    pool = EnginePool(Settings(home=home), 2, query_seconds=120, probe_seconds=1).start()
    body = {"question": SUCCESSOR_Q, "route": "local"}
    stopped = pool.engines()[0]["pid"]
    try:
        with running(pool) as url:
            os.kill(stopped, signal.SIGSTOP)
            results: list[tuple[int, float]] = []

            def ask() -> None:
                t0 = time.perf_counter()
                results.append((post(f"{url}/api/query", json=body).status_code, time.perf_counter() - t0))

            asking = [threading.Thread(target=ask) for _ in range(2)]  # both engines free: one query each
            for t in asking:
                t.start()
            for t in asking:
                t.join(60)
            assert [code for code, _ in results] == [200, 200] and max(s for _, s in results) < 15, results
            assert not alive(stopped)
    finally:
        if alive(stopped):
            os.kill(stopped, signal.SIGKILL)
        pool.stop()


@pytest.fixture
def two_namespaces(home) -> Path:
    """The sample home with a second, small namespace `second`."""
    from lazyhippo.index import run_index

    _rows(home.parent / "second_src", "rows.jsonl", {"s1": "Ilse Marrow charted the reefs of Tolland in 1904.",
                                                    "s2": "The Tolland reef chart guided the Varne lifeboat."})
    run_index(Settings(home=home, namespace="second", source=str(home.parent / "second_src")))
    return home


def test_a_damaged_snapshot_harms_only_its_namespace(two_namespaces):
    """`second`'s snapshot is truncated while the warehouse cannot publish it again (a run holds it): the server
    starts, serves `default`, reports `second` damaged; `lazyhippo index` for it repairs it and it is served."""
    from filelock import FileLock

    from lazyhippo.serve.pool import IndexPool

    home = two_namespaces
    second = Settings(home=home, namespace="second")
    with open(snapshot_path(second), "r+b") as f:
        f.truncate(4096)
    lock = FileLock(home / "warehouse.lock", thread_local=False)
    lock.acquire()
    try:
        pool = IndexPool(Settings(home=home), settle_seconds=0.2, poll_seconds=0.1).start()
    finally:
        lock.release()
    try:
        with running(pool) as url:
            health = get(f"{url}/health").json()
            assert health["status"] == "degraded" and list(health["damaged"]) == ["second"]
            assert post(f"{url}/api/query", json={"question": SUCCESSOR_Q}).status_code == 200
            r = post(f"{url}/api/query", json={"question": "Who charted the reefs of Tolland?", "namespace": "second"})
            assert r.status_code == 503 and "Error" not in r.text
            out = subprocess.run([sys.executable, "-m", "lazyhippo_dagster.cli", "index", str(home.parent / "second_src"),
                                  "--home", str(home), "-n", "second"], cwd=REPO, capture_output=True, text=True,
                                 env={**os.environ, "DAGSTER_HOME": str(home.parent / "dagster")}, timeout=300)
            assert out.returncode == 0, out.stdout + out.stderr
            deadline = time.time() + 60
            while get(f"{url}/health").json()["status"] != "ok":
                assert time.time() < deadline
                time.sleep(0.1)
            r = post(f"{url}/api/query", json={"question": "Who charted the reefs of Tolland?", "namespace": "second"})
            assert r.status_code == 200 and "Marrow" in r.text
    finally:
        pool.stop()


def test_a_missing_or_damaged_snapshot_is_published_again_at_start(two_namespaces):
    from lazyhippo.serve.pool import IndexPool

    home = two_namespaces
    snapshot_path(Settings(home=home)).unlink()  # deleted while the server was down
    with open(snapshot_path(Settings(home=home, namespace="second")), "r+b") as f:
        f.truncate(4096)
    pool = IndexPool(Settings(home=home)).start()
    try:
        assert pool.namespaces() == ["default", "second"] and pool.health() == {"status": "ok"}
        assert snapshot_path(Settings(home=home)).exists() and set(pool.status()) == {"default", "second"}
    finally:
        pool.stop()


def test_a_run_is_success_only_once_its_index_is_served_beside_a_damaged_namespace(two_namespaces, tmp_path,
                                                                                 monkeypatch):
    """`second` is damaged beyond repair (its last run failed): an upload into `default` still swaps in and
    reports SUCCESS only then; the failed upload's folder is removed and its error names no server path."""
    from lazyhippo.serve.pool import IndexPool
    from lazyhippo.stores.warehouse import _write_state

    home = two_namespaces
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    second = Settings(home=home, namespace="second")
    pool = IndexPool(Settings(home=home), settle_seconds=0.2, poll_seconds=0.1).start()
    try:
        with running(pool) as url:
            _write_state(second, status="failed")  # the warehouse cannot publish it again
            with open(snapshot_path(second), "r+b") as f:
                f.truncate(4096)
            deadline = time.time() + 30
            while get(f"{url}/health").json()["status"] != "degraded":
                assert time.time() < deadline
                time.sleep(0.1)
            r = post(f"{url}/api/kg/upload", files=[("files", ("barrow.txt", NEW_DOC.encode()))],
                     data={"namespace": "default", "mode": "add"}, headers=TOKEN_HEADERS)
            assert wait_run(url, r.json()["run_id"])["status"] == "SUCCESS"
            answer = post(f"{url}/api/query", json={"question": NEW_Q, "route": "local"}).json()
            assert any("Quillon" in c["text"] for c in answer["context"])
            bad = post(f"{url}/api/kg/upload", files=[("files", ("empty.txt", b"   "))], data={"namespace": "third"},
                       headers=TOKEN_HEADERS)
            failed = wait_run(url, bad.json()["run_id"])
            assert failed["status"] == "FAILURE" and str(home) not in failed["error"] and "Error" not in failed["error"]
            assert not [p for p in (home / "uploads" / "third").iterdir()]
    finally:
        pool.stop()


# ---------------------------------------------------------------- 11. clean errors and configuration

def test_error_bodies_carry_no_python_object_text(pool, tmp_path):
    with running(pool, roots=(tmp_path,)) as url:
        answers = [
            post(f"{url}/api/kg/upload", data={"files": "not a file", "namespace": "x"}, headers=TOKEN_HEADERS),
            post(f"{url}/api/kg/upload", files=[("files", ("a.txt", b"x")), ("namespace", ("n.txt", b"y"))],
                 headers=TOKEN_HEADERS),
            post(f"{url}/api/kg/create", content=b'{"path": ".", "community_resolutions": [NaN, Infinity]}',
                 headers={**TOKEN_HEADERS, "content-type": "application/json"}),
            post(f"{url}/api/query", json=[1, 2])]
    for r in answers:
        assert 400 <= r.status_code < 500, r.text
        assert not any(s in r.text for s in ("<class", "UploadFile(", "Error", "Traceback")), r.text
    assert "finite" in answers[2].text and answers[3].json()["problems"][0].startswith("body:")


def test_predictable_keys_and_non_finite_resolutions_are_refused():
    from lazyhippo.serve.middleware import Access
    from lazyhippo.settings import Environment

    for key in ("1234567812345678", "abcdefghijklmnopqrst", "abababababababab"):
        with pytest.raises(ValueError, match="LAZYHIPPO_API_KEY must be at least 16 random characters"):
            Access.for_host(Environment(api_key=key), "0.0.0.0")
    assert Access.for_host(Environment(api_key="Jx3f_9Qm2-LpZr8t"), "0.0.0.0").keys
    for bad in ([float("nan")], [0.5, float("inf")]):
        with pytest.raises(ValueError, match="positive finite values"):
            Settings().with_(community_resolutions=bad)


def test_a_malformed_key_scope_is_one_line_naming_the_variable(home):
    env = {**os.environ, "LAZYHIPPO_API_KEY_NAMESPACES": "docs,../etc"}
    out = subprocess.run([sys.executable, "-m", "lazyhippo_dagster.cli", "serve", "--home", str(home)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "LAZYHIPPO_API_KEY_NAMESPACES: invalid namespace '../etc'" in " ".join(out.stderr.split())


# ---------------------------------------------------------------- 12. budgets per upload and per document

def test_many_small_pdfs_share_one_cpu_budget(tmp_path):
    """50 tiny PDFs, each well within the per-file limit: together they get the source's total and no more."""
    for i in range(50):
        _content_bomb(tmp_path / f"p{i:02d}.pdf", 10_000)  # about 0.5 s of CPU each
    t0 = time.perf_counter()
    docs, errors = read_source(tmp_path, 10**6, ParseLimits(cpu_seconds=5, total_cpu_seconds=3))
    seconds = time.perf_counter() - t0
    over = [e for e in errors if "used up their CPU budget (3 s)" in e.reason]
    assert len(over) >= 40 and len(docs) + len(errors) == 50  # a few parsed, the rest never started
    assert seconds < 30, seconds


def test_a_document_is_cut_at_the_chunk_cap(tmp_path):
    """A few kilobytes can expand to megabytes of short words (a PDF bomb's text): at most 2,000 chunks."""
    from lazyhippo.stages.chunks import MAX_CHUNKS_PER_DOCUMENT, chunk_document

    (tmp_path / "words.txt").write_text("a b. " * 400_000)
    [doc] = list(read_path(tmp_path / "words.txt", tmp_path, 10**7))
    chunks = chunk_document(doc)
    assert len(chunks) == MAX_CHUNKS_PER_DOCUMENT == 2000 and [c.position for c in chunks] == list(range(2000))
