"""Query engines in worker processes behind one front process (`lazyhippo serve --workers N`, N > 1).

Why not N uvicorn workers: each keeps the keep-alive connections it happened to accept, and 8 clients spread
8/0, 7/1 or 5/3 over 2 workers (measured), so one worker queues while the other idles. Here the front owns
every connection and hands each query to an engine that is idle at that moment (one queue in front of all
engines), so the load is even whatever the connections do. Queries are CPU-bound Python: an engine runs
one at a time, and N engines use N cores.

Each engine holds its own `IndexPool` (warm indexes, swapped on its own after another process's index run);
the index runs the front launches reach every engine through `begin_write`/`end_write`. An engine that dies
is replaced in the background; the query it was running gets an error (a 503 over HTTP). So is a stuck one
(stopped, or looping): a query it does not answer within `query_seconds`, or a status probe it does not answer
within `probe_seconds`, gets it killed. What `/health` shows is the engines' last answers to those probes, so
no request ever waits on an engine but the query it was given.
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
from lazyhippo.serve.pool import IndexPool, limit_threads, namespace_notice, snapshot_sync
from lazyhippo.settings import Settings

log = logging.getLogger(__name__)


class EngineGone(RuntimeError):
    """The engine process running a query died or was stuck; a new one is being started."""


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
                 query_seconds: float = 120.0, probe_seconds: float = 10.0, write_seconds: float = 600.0):
        self.settings = settings
        self.workers = workers
        self.wait_seconds = wait_seconds  # longest a query waits for a free engine before it is refused
        self.query_seconds = query_seconds  # longest an engine may take over one query before it is killed
        self.probe_seconds = probe_seconds  # longest an idle engine may take to answer a status probe
        self.write_seconds = write_seconds  # longest an engine may take to load the new indexes after a run
        self._info: dict[int, dict] = {}    # pid -> the engine's last answer to a status probe
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
        deadline = time.monotonic() + self.wait_seconds
        while True:  # an engine killed while idle is still in the queue: skipped
            try:
                engine = self._idle.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise EngineGone(f"no query engine came free within {self.wait_seconds:g} s") from None
            if engine in self._engines and engine.process.is_alive():
                break
        try:
            engine.queries.send(dict(namespace=namespace, question=question, route=route, top_k=top_k,
                                     budget=budget, llm=llm, history=history, choices=choices))
            engine.answered += 1
            if not engine.queries.poll(self.query_seconds):
                self._restart(engine)
                raise EngineGone(f"query engine {engine.process.pid} did not answer within {self.query_seconds:g} s; "
                                 "restarting it")
            ok, value = engine.queries.recv()
        except (EOFError, OSError):
            self._restart(engine)
            raise EngineGone(f"query engine {engine.process.pid} died during the query; restarting it") from None
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
        return min(info["swaps"] for info in self._infos())

    def _infos(self) -> list[dict]:
        """The live engines' last answers to a probe (never waits on an engine)."""
        infos = [self._info[e.process.pid] for e in list(self._engines) if e.process.pid in self._info]
        if not infos:
            raise EngineGone("no query engine is running")
        return infos

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
        if self._stopping:
            return
        try:
            self._ready(self._spawn())
        except Exception:  # noqa: BLE001 - the other engines keep serving
            log.exception("could not restart a query engine")

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
               "info": lambda: {"namespaces": pool.namespaces(), "warm": pool.status(), "swaps": pool.swaps}}
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
