"""A warm query process per home: `lazyhippo query` hands its command line to it and prints what it printed, so a
question costs a small process and the Dagster run, not importing Dagster and reading the index again.

The daemon executes the CLI's own `query` command (its option parsing and checks, the Dagster `query` run in
the home's instance with the CLI's tags, its text or JSON output) in its process, one command at a time:
Dagster's in-process runs reconfigure logging and are not made to run side by side in one process, and a
query takes a fraction of a second there, so a second client waits its turn. It advertises itself in
`<home>/query-daemon.json` (loopback port, pid, host, a random token; mode 0600, replaced atomically), listens on
127.0.0.1 only, refuses a request without that token, and proves itself to the client (an HMAC of the client's
nonce under the token) so a process that took over a dead daemon's port cannot answer in its place. It serves
only clients whose environment (the variables that decide settings and stores) and Python are its own; any
other, a dead or unreachable daemon, or a refused request, and the client runs the query in its own process as
before. It exits after `idle` seconds without a request.

The client side imports only the standard library (and `lazyhippo.settings` to find the home): the `lazyhippo`
entry point (`lazyhippo_dagster.launcher`) hands a query over before importing the CLI.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

ADVERT = "query-daemon.json"   # in the home: how to reach its daemon
LOCK = "query-daemon.lock"     # held by the home's one daemon for its lifetime
MAX_REQUEST = 64 * 1024        # bytes: a command line, its question included
MAX_ARGS = 64
# the variables that decide what a query run does (settings, stores, models, the LLM, the instance)
SETTINGS_PREFIXES = ("LAZYHIPPO_", "OPENAI_", "NEO4J_", "MINIO_", "DAGSTER_")
NOT_SETTINGS = {"LAZYHIPPO_HOME", "LAZYHIPPO_QUERY_DAEMON"}  # the home is sent as --home; the daemon's own knob


# ------------------------------------------------------------------ client


def forward(args: list[str]) -> dict | None:
    """The warm daemon's output of `lazyhippo query ARGS` ({exit_code, stdout, stderr}), or None when no daemon
    of this home serves this client (the caller runs the query itself)."""
    from lazyhippo.settings import environment

    try:
        if not environment().query_daemon_minutes:
            return None
        home_arg, rest = split_home(args)
        home = home_of(home_arg)
    except ValueError:  # a malformed variable: the CLI reports it
        return None
    advert = read_advert(home)
    if advert is None:
        return None
    return ask(advert, ["--home", str(home), *rest], fingerprint(home))


def split_home(args: list[str]) -> tuple[str | None, list[str]]:
    """The `--home` value (the last one, as click takes it) and the other arguments; after `--` all are kept."""
    home, rest, i = None, [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        if arg == "--home" and i + 1 < len(args):
            home, i = args[i + 1], i + 2
            continue
        if arg.startswith("--home="):
            home = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return home, rest


def home_of(value: str | None) -> Path:
    """The home the CLI's `--home` option resolves to (its default from the environment)."""
    from lazyhippo.settings import Settings

    return Settings.from_env(home=Path(value) if value is not None else None).home


def fingerprint(home: Path) -> dict:
    """What a daemon and its client must share: the settings variables (DAGSTER_HOME as the CLI resolves it; as
    a hash, since they hold keys), the interpreter and the installed code."""
    env = {k: v for k, v in os.environ.items() if k.startswith(SETTINGS_PREFIXES) and k not in NOT_SETTINGS}
    env["DAGSTER_HOME"] = str(Path(os.environ.get("DAGSTER_HOME") or home / "dagster").resolve())
    digest = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()
    return {"env": digest, "python": sys.executable, "code": code_stamp()}


def code_stamp() -> list:
    """The installed code: its folders and the newest modification of a module in them (an upgrade or an edit
    retires a daemon running the code before it)."""
    from importlib.util import find_spec

    folders = [Path(__file__).resolve().parent, *(Path(p) for p in find_spec("lazyhippo").submodule_search_locations)]
    newest = max(f.stat().st_mtime_ns for folder in folders for f in folder.rglob("*.py"))
    return [*map(str, folders), newest]


def read_advert(home: Path) -> dict | None:
    """The home's daemon as advertised, if its process lives on this host."""
    try:
        advert = json.loads((home / ADVERT).read_text())
        pid, port, token = int(advert["pid"]), int(advert["port"]), str(advert["token"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if advert.get("host") != socket.gethostname() or not alive(pid):
        return None
    return {"pid": pid, "port": port, "token": token}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: not this home's daemon (its file is ours)
        return False
    return True


def proof(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def ask(advert: dict, args: list[str], fp: dict) -> dict | None:
    """Send the command to the daemon; its reply, or None when it cannot be reached, declines, refuses or does
    not prove it holds the token."""
    nonce = secrets.token_hex(16)
    request = {"token": advert["token"], "nonce": nonce, "args": args, "fingerprint": fp,
               "tty": sys.stdout.isatty(), "columns": shutil.get_terminal_size().columns}
    try:
        with socket.create_connection(("127.0.0.1", advert["port"]), timeout=2) as sock:
            sock.sendall(json.dumps(request).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(None)  # a query takes what it takes (an LLM answer, a query ahead of it)
            with sock.makefile("rb") as stream:
                reply = json.loads(stream.read())
    except (OSError, ValueError):
        return None
    if not isinstance(reply, dict) or not hmac.compare_digest(str(reply.get("proof", "")), proof(advert["token"], nonce)):
        return None
    if reply.get("declined") or not all(k in reply for k in ("exit_code", "stdout", "stderr")):
        return None
    return reply


def start_daemon(home: Path, namespace: str, minutes: int) -> None:
    """Start the home's daemon in the background unless one holds its lock (two started at once: the second
    exits at the lock)."""
    if not minutes or daemon_running(home):
        return
    import subprocess

    subprocess.Popen([sys.executable, "-m", "lazyhippo_dagster.cli", "daemon", "--home", str(home),
                      "--namespace", namespace, "--idle-minutes", str(minutes)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, cwd=home)


def daemon_running(home: Path) -> bool:
    """Whether a daemon holds the home's lock (whatever its advert says)."""
    import fcntl

    try:
        with open(home / LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a home this user cannot write: no daemon of its own either
        return True
    return False


# ------------------------------------------------------------------ daemon


class AlreadyRunning(RuntimeError):
    """The home has a daemon already."""


class Retired(Exception):
    """The daemon's code is not the clients' any more: it ends."""


def serve(home: Path, idle: float, app, ready=None) -> None:
    """Serve this home's queries with `app` (a Typer app whose `query` command is the CLI's) until `idle` seconds
    pass without one (or SIGTERM). `ready()` is called once the daemon is advertised."""
    import fcntl
    import signal

    from typer.testing import CliRunner

    from lazyhippo_dagster.runner import keep_instances

    home.mkdir(parents=True, exist_ok=True)
    lock = open(home / LOCK, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise AlreadyRunning(f"a query daemon serves {home} already") from None
    fp = fingerprint(home)  # before a run sets DAGSTER_HOME in this process
    keep_instances()
    token = secrets.token_urlsafe(32)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the advert is removed on the way out
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(idle)
    try:
        write_advert(home, {"pid": os.getpid(), "host": socket.gethostname(), "port": server.getsockname()[1],
                            "token": token, "started_at": time.time()})
        if ready is not None:
            ready()
        runner = CliRunner()
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                break
            with conn:
                try:
                    handle(conn, token, fp, runner, app)
                except (OSError, ValueError, TypeError, AttributeError):  # a client gone, or garbage: the next one
                    pass
                except Retired:
                    break
    finally:
        server.close()
        remove_advert(home, os.getpid())
        lock.close()


def handle(conn: socket.socket, token: str, fp: dict, runner, app) -> None:
    """One request: checked, then the CLI's `query` command executed here, its output sent back."""
    conn.settimeout(5)  # a client that sends nothing does not hold the daemon
    data = b""
    while len(data) <= MAX_REQUEST and not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    if len(data) > MAX_REQUEST:
        conn.sendall(json.dumps({"error": f"request over {MAX_REQUEST} bytes"}).encode())
        return
    request = json.loads(data)
    if not isinstance(request, dict) or not hmac.compare_digest(str(request.get("token", "")).encode(), token.encode()):
        conn.sendall(json.dumps({"error": "refused: wrong token"}).encode())
        return
    answer = {"proof": proof(token, str(request.get("nonce", "")))}
    args = request.get("args")
    if request.get("fingerprint") != fp:
        answer["declined"] = "another environment than the daemon's"
        if {k: v for k, v in request["fingerprint"].items() if k != "env"} != {k: v for k, v in fp.items() if k != "env"}:
            conn.sendall(json.dumps(answer).encode())
            raise Retired("the client runs other code: this daemon is out of date")
    elif not isinstance(args, list) or len(args) > MAX_ARGS or not all(isinstance(a, str) for a in args):
        answer["declined"] = "malformed command line"
    else:
        env = {"COLUMNS": str(int(request.get("columns") or 80))}
        if request.get("tty") is True:
            env["FORCE_COLOR"] = "1"
        result = runner.invoke(app, ["query", *args], env=env, catch_exceptions=True, prog_name="lazyhippo")
        stderr = result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            import traceback

            stderr += "".join(traceback.format_exception(result.exception))
        answer.update(exit_code=result.exit_code, stdout=result.stdout, stderr=stderr)
    conn.sendall(json.dumps(answer).encode())


def write_advert(home: Path, advert: dict) -> None:
    """Replace the advert atomically, readable by its owner only (it holds the token)."""
    fd, tmp = tempfile.mkstemp(dir=home, prefix=f".{ADVERT}.")  # created 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(advert, f)
        os.replace(tmp, home / ADVERT)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_advert(home: Path, pid: int) -> None:
    """Remove the advert if it is still this process's."""
    path = home / ADVERT
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def stop(home: Path, seconds: float = 10.0) -> int | None:
    """End the home's daemon (SIGTERM) and wait for it; its pid, or None when none runs."""
    import signal

    advert = read_advert(home)
    if advert is None:
        return None
    os.kill(advert["pid"], signal.SIGTERM)
    deadline = time.monotonic() + seconds
    while alive(advert["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return advert["pid"]
