"""Query engines in worker processes behind one front process (`lazyhippo serve --workers N`, N > 1).

Why not N uvicorn workers: each keeps the keep-alive connections it happened to accept, and 8 clients spread
8/0, 7/1 or 5/3 over 2 workers (measured), so one worker queues while the other idles. Here the front owns
every connection and hands each query to an engine that is idle at that moment (one queue in front of all
engines), so the load is even whatever the connections do. Queries are CPU-bound Python: an engine runs
one at a time, and N engines use N cores.

Each engine holds its own `IndexPool` (warm indexes, swapped on its own after another process's index run);
the index runs the front launches reach every engine through `begin_write`/`end_write`. An engine that dies
is replaced in the background, and a replacement that fails to start is retried with a growing delay (up to
`max_retry_seconds`) until one starts: the pool comes back to its size once the cause is gone. So is a stuck
one (stopped, or looping): a query it does not answer within `query_seconds`, or a status probe it does not
answer within `probe_seconds`, gets it killed. A query whose engine dies or is killed meanwhile is given once
more to a live engine; with no engine running it fails after `fail_seconds`. What `/health` shows is the
engines' last answers to those probes (the last known ones when none runs), so no request ever waits on an
engine but the query it was given.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from lazyhippo.query import DEFAULT_CONFIG, QueryConfig, QueryResult
from lazyhippo.serve.pool import DAMAGED, IndexPool, limit_threads, namespace_notice, snapshot_sync
from lazyhippo.settings import Settings

log = logging.getLogger(__name__)


class EngineGone(RuntimeError):
    """The engine process running a query died or was stuck; a new one is being started."""


class _Lost(RuntimeError):
    """The engine died or was replaced before answering: the query may go to another one."""


@dataclass
class _Engine:
    process: mp.process.BaseProcess
    queries: Connection   # one query at a time, by whichever front thread holds the engine
    control: Connection   # index-run brackets and status, served by a thread of the engine
    lock: threading.Lock = field(default_factory=threading.Lock)  # one control exchange at a time
    answered: int = 0     # queries sent to it (only the front thread holding the engine counts)

    def close(self) -> None:
        """Closing its pipes ends the engine (it reads end-of-file)."""
        self.queries.close()
        self.control.close()

    def ask(self, message: str, seconds: float):
        """The engine's answer; EngineGone when it is dead or does not answer within `seconds`."""
        with self.lock:
            return self._exchange(message, seconds)

    def _exchange(self, message: str, seconds: float):
        try:
            self.control.send(message)
            if self.control.poll(seconds):
                return self.control.recv()
        except (EOFError, OSError):
            raise EngineGone(f"query engine {self.process.pid} is gone") from None
        raise EngineGone(f"query engine {self.process.pid} did not answer within {seconds:g} s")


class EnginePool:
    """The serving surface of `IndexPool` (answer, notice, namespaces, status, swaps, begin/end_write) over
    `workers` engine processes."""

    def __init__(self, settings: Settings, workers: int, config: QueryConfig = DEFAULT_CONFIG,
                 settle_seconds: float = 2.0, poll_seconds: float = 1.0, wait_seconds: float = 60.0,
                 query_seconds: float = 120.0, probe_seconds: float = 10.0, write_seconds: float = 600.0,
                 retry_seconds: float = 1.0, max_retry_seconds: float = 30.0, fail_seconds: float = 3.0):
        self.settings = settings
        self.workers = workers
        self.wait_seconds = wait_seconds  # longest a query waits for a free engine before it is refused
        self.query_seconds = query_seconds  # longest an engine may take over one query before it is killed
        self.probe_seconds = probe_seconds  # longest an idle engine may take to answer a status probe
        self.write_seconds = write_seconds  # longest an engine may take to load the new indexes after a run
        self.retry_seconds, self.max_retry_seconds = retry_seconds, max_retry_seconds  # restart backoff
        self.fail_seconds = fail_seconds    # longest a query waits while no engine runs at all
        self._info: dict[int, dict] = {}    # pid -> the engine's last answer to a status probe
        self._last: list[dict] = []         # the last answers of the engines that ran, while none does
        self._args = (settings, config, settle_seconds, poll_seconds)
        self._ctx = mp.get_context("spawn")  # the front runs threads (event loop, index runs): never fork it
        self._engines: list[_Engine] = []
        self._idle: queue.Queue[_Engine] = queue.Queue()  # FIFO of waiting threads: the first waiter gets the next free engine
        self._stopping = False
        self.snapshots = None
        self._stop = threading.Event()
        self._replacing = threading.Lock()

    def start(self) -> "EnginePool":
        """Start every engine and wait until each has loaded its indexes (pulled snapshots first, by this process:
        the engines reload them like after a local run), then probe them in the background."""
        self.snapshots = snapshot_sync(self.settings)
        starting = [self._spawn() for _ in range(self.workers)]
        for engine in starting:
            self._ready(engine)
        threading.Thread(target=self._monitor, name="lazyhippo-engine-monitor", daemon=True).start()
        return self

    def _spawn(self) -> _Engine:
        queries, their_queries = self._ctx.Pipe()
        control, their_control = self._ctx.Pipe()
        process = self._ctx.Process(target=engine_main, args=(*self._args, their_queries, their_control),
                                    name="lazyhippo-engine", daemon=True)
        process.start()
        their_queries.close()
        their_control.close()
        return _Engine(process, queries, control)

    def _ready(self, engine: _Engine) -> None:
        try:
            engine.queries.recv()  # sent once its IndexPool has started
        except EOFError:
            engine.process.join(5)
            engine.close()
            raise RuntimeError(f"a query engine exited while loading its indexes (exit code "
                               f"{engine.process.exitcode}); see the log above") from None
        self._info[engine.process.pid] = engine.ask("info", self.write_seconds)
        with self._replacing:
            stopped = self._stopping
            if not stopped:
                self._engines.append(engine)
        if stopped:  # the pool stopped while this one loaded: it ends as `stop` ends the others
            engine.close()
            return
        self._idle.put(engine)

    # ------------------------------------------------------------ queries

    def answer(self, namespace: str, question: str, route: str = "auto", top_k: int = 8, budget: int = 32000,
               llm="auto", history: list[dict] | None = None, choices: dict | None = None) -> QueryResult:
        request = dict(namespace=namespace, question=question, route=route, top_k=top_k, budget=budget, llm=llm,
                       history=history, choices=choices)
        try:
            return self._ask(request)
        except _Lost:  # its engine died or was replaced: a query changes nothing, so a live engine answers it
            try:
                return self._ask(request)
            except _Lost as exc:
                raise EngineGone(str(exc)) from None

    def _idle_engine(self) -> _Engine:
        """The next free live engine; EngineGone after `wait_seconds`, or after `fail_seconds` with none running."""
        t0 = time.monotonic()
        while True:  # an engine killed while idle is still in the queue: skipped
            try:
                engine = self._idle.get(timeout=0.25)
            except queue.Empty:
                waited = time.monotonic() - t0
                if not self._engines and waited >= self.fail_seconds:
                    raise EngineGone("no query engine is running; one is being started") from None
                if waited >= self.wait_seconds:
                    raise EngineGone(f"no query engine came free within {self.wait_seconds:g} s") from None
                continue
            if engine in self._engines and engine.process.is_alive():
                return engine

    def _ask(self, request: dict):
        engine = self._idle_engine()
        try:
            engine.queries.send(request)
            engine.answered += 1
            deadline = time.monotonic() + self.query_seconds
            while not engine.queries.poll(0.25):  # short polls: an engine killed meanwhile is noticed at once
                if engine not in self._engines or not engine.process.is_alive():
                    self._restart(engine)
                    raise _Lost(f"query engine {engine.process.pid} was stopped during the query")
                if time.monotonic() > deadline:
                    self._restart(engine)
                    raise EngineGone(f"query engine {engine.process.pid} did not answer within "
                                     f"{self.query_seconds:g} s; restarting it")
            ok, value = engine.queries.recv()
        except (EOFError, OSError):
            self._restart(engine)
            raise _Lost(f"query engine {engine.process.pid} died during the query; restarting it") from None
        except EngineGone:
            raise
        except Exception:  # e.g. an argument that does not pickle: the engine itself is fine
            self._idle.put(engine)
            raise
        self._idle.put(engine)
        if not ok:
            raise value
        return value

    def notice(self, namespace: str) -> str | None:
        return namespace_notice(self.settings, namespace)

    def namespaces(self) -> list[str]:
        return sorted(set().union(*(info["namespaces"] for info in self._infos())))

    def status(self) -> dict:
        return {ns: w for info in self._infos() for ns, w in info["warm"].items()}

    @property
    def swaps(self) -> int:
        """Swaps every live engine has made (the slowest one's count)."""
        return min((info["swaps"] for info in self._infos()), default=0)

    def served(self) -> dict[str, tuple]:
        """The snapshot version of each namespace every live engine serves (left out while they differ)."""
        versions = [info["served"] for info in self._infos()]
        return {ns: v for ns, v in versions[0].items() if all(o.get(ns) == v for o in versions)} if versions else {}

    def health(self) -> dict:
        """`degraded` while fewer engines run than asked for, or a namespace's index could not be read."""
        running = len(self._engines)
        damaged = {ns: DAMAGED for ns in sorted(set().union(*(info["damaged"] for info in self._infos())))}
        return {"status": "degraded" if damaged or running < self.workers else "ok", "engines_running": running,
                "engines_wanted": self.workers, **({"damaged": damaged} if damaged else {})}

    def _infos(self) -> list[dict]:
        """The live engines' last answers to a probe, or the last known ones while none runs (never waits on an
        engine)."""
        infos = [self._info[e.process.pid] for e in list(self._engines) if e.process.pid in self._info]
        if infos:
            self._last = infos
        return infos or self._last

    def _monitor(self) -> None:
        """Probe each idle engine's control thread every second: one that does not answer is killed and replaced.
        An engine busy with a control exchange (loading new indexes) is left alone."""
        while not self._stop.wait(1.0):
            for engine in list(self._engines):
                if not engine.lock.acquire(blocking=False):
                    continue
                try:
                    self._info[engine.process.pid] = engine._exchange("info", self.probe_seconds)
                except EngineGone as exc:
                    log.warning("%s: killing it", exc)
                    self._restart(engine)
                finally:
                    engine.lock.release()

    def engines(self) -> list[dict]:
        """Each engine's process id and the queries it was given: how evenly the load is spread."""
        return [{"pid": e.process.pid, "queries": e.answered} for e in list(self._engines)]

    # ------------------------------------------------------------ index runs, restarts, stop

    def begin_write(self) -> None:
        self._each("begin_write", self.probe_seconds)

    def end_write(self) -> None:
        """Every engine refreshes (and swaps in the new index) before this returns, as `IndexPool.end_write`; one
        that does not within `write_seconds` is replaced (the new one loads the new index)."""
        self._each("end_write", self.write_seconds)

    def _each(self, message: str, seconds: float) -> None:
        for engine in list(self._engines):
            try:
                engine.ask(message, seconds)
                self._info[engine.process.pid] = engine.ask("info", seconds)
            except EngineGone as exc:
                log.warning("%s: killing it", exc)
                self._restart(engine)

    def _restart(self, engine: _Engine) -> None:
        """Kill the engine (a no-op when it is dead) and start a new one in the background."""
        if engine.process.is_alive():
            engine.process.kill()
        threading.Thread(target=self._replace, args=(engine,), name="lazyhippo-engine-restart", daemon=True).start()

    def _replace(self, dead: _Engine) -> None:
        """Several threads may report one engine; they wake together when it exits, and only the one that
        takes it out of the pool closes its pipes (two closing one pipe at once fail) and replaces it."""
        dead.process.join(5)
        with self._replacing:
            if dead not in self._engines:  # already being replaced, or the pool stopped
                return
            self._engines.remove(dead)
            self._info.pop(dead.process.pid, None)
        dead.close()
        log.warning("query engine %s exited (code %s); starting a new one", dead.process.pid, dead.process.exitcode)
        delay = self.retry_seconds
        while not self._stopping:
            try:
                self._ready(self._spawn())
                return
            except Exception:  # noqa: BLE001 - the other engines keep serving; retried until one starts
                log.exception("could not start a query engine; retrying in %g s", delay)
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self.max_retry_seconds)

    def stop(self) -> None:
        """Closing its pipes ends an engine (it reads end-of-file); stragglers are terminated."""
        self._stopping = True
        self._stop.set()
        with self._replacing:  # what a restart thread has not taken out is this thread's to close
            engines = list(self._engines)
            self._engines.clear()
        for engine in engines:
            engine.close()
        for engine in engines:
            engine.process.join(10)
            if engine.process.is_alive():
                engine.process.terminate()
                engine.process.join(5)


def engine_main(settings: Settings, config: QueryConfig, settle_seconds: float, poll_seconds: float,
                queries: Connection, control: Connection) -> None:
    """One engine process: answers the queries on `queries` one at a time until the front closes it."""
    limit_threads()
    pool = IndexPool(settings, config, settle_seconds, poll_seconds, max_concurrent=1).start(sync_snapshots=False)
    threading.Thread(target=_serve_control, args=(pool, control), name="lazyhippo-engine-control", daemon=True).start()
    queries.send(os.getpid())
    while True:
        try:
            request = queries.recv()
        except EOFError:  # the front closed the pipe or is gone
            break
        try:
            reply = (True, pool.answer(**request))
        except Exception as exc:  # noqa: BLE001 - the front turns it into its own error (a 404 or a 503)
            if not isinstance(exc, LookupError):
                log.warning("query failed in engine %s", os.getpid(), exc_info=True)
            reply = (False, _portable(exc))
        queries.send(reply)
    pool.stop()


def _serve_control(pool: IndexPool, control: Connection) -> None:
    actions = {"begin_write": pool.begin_write, "end_write": pool.end_write,
               "info": lambda: {"namespaces": pool.namespaces(), "warm": pool.status(), "swaps": pool.swaps,
                                "served": pool.served(), "damaged": sorted(pool.damaged)}}
    while True:
        try:
            message = control.recv()
        except EOFError:
            return
        control.send(actions[message]())


def _portable(exc: Exception) -> Exception:
    """The exception itself if it survives pickling, else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}")
