"""Load benchmark of a running lazyhippo HTTP server: concurrent clients send real questions for a fixed time
and every request's latency and status is kept (QPS, p50/p95/p99 and errors per route)."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

import polars as pl

from lazyhippo.evaluate.bench import percentile_ms


@dataclass
class LoadReport:
    route: str
    clients: int
    rate: float            # offered queries/s (0: closed loop, each client sends as soon as its answer arrived)
    seconds: float
    requests: int
    errors: int
    qps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    server_cpu_ms_per_query: float | None  # CPU the server spent per answered query (capacity = cores / this)
    error_samples: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def run_load(base_url: str, questions: Sequence[str], route: str, clients: int = 8, seconds: float = 30.0,
             headers: dict | None = None, warmup: int = 5, rate: float = 0.0,
             server_pid: int | None = None) -> LoadReport:
    """`clients` threads, each with its own keep-alive connection, POST /api/query in a loop for `seconds`; client i starts
    at question i, so the clients do not ask the same question at the same time. With `rate` > 0 the clients
    together send `rate` queries/s on a fixed schedule and latency counts from the scheduled send time (a slow
    server is not hidden by clients waiting for it). With `server_pid`, the CPU time of the server's process
    tree during the timed part is divided by the requests: a figure that does not depend on how busy the
    machine is."""
    if not questions:
        raise ValueError("no questions to send")
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    begin, deadline = [0.0], [0.0]

    def start_clock() -> None:  # once every client has warmed up: the schedule and the window start now
        begin[0] = time.perf_counter()
        deadline[0] = begin[0] + seconds

    start = threading.Barrier(clients + 1, action=start_clock)

    def client(i: int) -> None:
        mine, bad = [], []
        with Connection(base_url, headers) as c:
            for q in questions[:warmup]:  # the server's code paths warm up before the clock
                c.post_query(q, route)
            start.wait()
            n, k = i, 0
            while time.perf_counter() < deadline[0]:
                q = questions[n % len(questions)]
                n += clients
                t0 = time.perf_counter()
                if rate > 0:
                    t0 = begin[0] + (i + k * clients) / rate
                    k += 1
                    if t0 >= deadline[0]:
                        break
                    time.sleep(max(0.0, t0 - time.perf_counter()))
                try:
                    status, text = c.post_query(q, route)
                    ok = status == 200
                    detail = f"HTTP {status}: {text[:120]}"
                except (OSError, http.client.HTTPException) as exc:
                    ok, detail = False, f"{type(exc).__name__}: {exc}"[:160]
                (mine if ok else bad).append(time.perf_counter() - t0)
                if not ok and len(errors) < 5:
                    errors.append(detail)  # a few samples; the count is `failed`
        with lock:
            lat.extend(mine)
            lat.extend(bad)
            failed[0] += len(bad)

    failed = [0]
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    cpu0 = tree_cpu_seconds(server_pid) if server_pid else None
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - begin[0]
    cpu1 = tree_cpu_seconds(server_pid) if cpu0 is not None else None
    cpu_ms = round((cpu1 - cpu0) * 1000 / len(lat), 2) if cpu1 is not None and lat else None
    return LoadReport(route, clients, rate, round(elapsed, 2), len(lat), failed[0], round(len(lat) / elapsed, 2),
                      round(percentile_ms(lat, 50), 2), round(percentile_ms(lat, 95), 2), round(percentile_ms(lat, 99), 2),
                      cpu_ms, errors[:5])


LOAD_COLUMNS = ("route", "requests", "errors", "qps", "p50_ms", "p95_ms", "p99_ms", "server_cpu_ms_per_query")


def load_table(reports: Sequence[LoadReport]) -> pl.DataFrame:
    """One row per loaded route (error samples aside: they are printed under the table)."""
    return pl.DataFrame([{c: getattr(r, c) for c in LOAD_COLUMNS} for r in reports],
                        schema_overrides={"server_cpu_ms_per_query": pl.Float64})


class Connection:
    """One keep-alive HTTP/1.1 connection on the standard library's client: the load generator shares the
    server's cores, and this spends a fraction of the CPU per request that a full-featured client does."""

    def __init__(self, base_url: str, headers: dict | None = None, timeout: float = 60.0):
        url = urlsplit(base_url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def post_query(self, question: str, route: str) -> tuple[int, str]:
        try:
            self.conn.request("POST", "/api/query", json.dumps({"question": question, "route": route}).encode(),
                              self.headers)
            r = self.conn.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            self.conn.close()  # the next request opens a new connection
            raise

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.conn.close()


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` and its descendants (Linux /proc; None elsewhere)."""
    proc = Path("/proc")
    if not (proc / str(pid)).exists():
        return None
    parent, cpu = {}, {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(fields[1])
        cpu[int(d.name)] = int(fields[11]) + int(fields[12])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(cpu.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")
