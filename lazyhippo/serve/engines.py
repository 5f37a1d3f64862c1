"""Query engines in worker processes behind one front process (`lazyhippo serve --workers N`, N > 1).

Why not N uvicorn workers: each keeps the keep-alive connections it happened to accept, and 8 clients spread
8/0, 7/1 or 5/3 over 2 workers (measured), so one worker queues while the other idles. Here the front owns
every connection and hands each query to an engine that is idle at that moment (one queue in front of all
engines), so the load is even whatever the connections do. Queries are CPU-bound Python: an engine runs
one at a time, and N engines use N cores.

Each engine holds its own `IndexPool` (warm indexes, swapped on its own after another process's index run);
the index runs the front launches reach every engine through `begin_write`/`end_write`. An engine that dies
is replaced in the background; the query it was running gets an error (a 503 over HTTP).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from lazyhippo.query import DEFAULT_CONFIG, QueryConfig, QueryResult
from lazyhippo.serve.pool import IndexPool, limit_threads, namespace_notice, snapshot_sync
from lazyhippo.settings import Settings

log = logging.getLogger(__name__)


class EngineGone(RuntimeError):
    """The engine process running a query died; a new one is being started."""


@dataclass
class _Engine:
    process: mp.process.BaseProcess
    queries: Connection   # one query at a time, by whichever front thread holds the engine
    control: Connection   # index-run brackets and status, served by a thread of the engine
    lock: threading.Lock = field(default_factory=threading.Lock)  # one control exchange at a time
    answered: int = 0     # queries sent to it (only the front thread holding the engine counts)

    def ask(self, message: str):
        with self.lock:
            self.control.send(message)
            return self.control.recv()


class EnginePool:
    """The serving surface of `IndexPool` (answer, notice, namespaces, status, swaps, begin/end_write) over
    `workers` engine processes."""

    def __init__(self, settings: Settings, workers: int, config: QueryConfig = DEFAULT_CONFIG,
                 settle_seconds: float = 2.0, poll_seconds: float = 1.0, wait_seconds: float = 60.0):
        self.settings = settings
        self.workers = workers
        self.wait_seconds = wait_seconds  # longest a query waits for a free engine before it is refused
        self._args = (settings, config, settle_seconds, poll_seconds)
        self._ctx = mp.get_context("spawn")  # the front runs threads (event loop, index runs): never fork it
        self._engines: list[_Engine] = []
        self._idle: queue.Queue[_Engine] = queue.Queue()  # FIFO of waiting threads: the first waiter gets the next free engine
        self._stopping = False
        self.snapshots = None

    def start(self) -> "EnginePool":
        """Start every engine and wait until each has loaded its indexes (pulled snapshots first, by this process:
        the engines reload them like after a local run)."""
        self.snapshots = snapshot_sync(self.settings)
        starting = [self._spawn() for _ in range(self.workers)]
        for engine in starting:
            self._ready(engine)
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
        self._engines.append(engine)
        self._idle.put(engine)

    # ------------------------------------------------------------ queries

    def answer(self, namespace: str, question: str, route: str = "auto", top_k: int = 8, budget: int = 32000,
               llm="auto", history: list[dict] | None = None, choices: dict | None = None) -> QueryResult:
        try:
            engine = self._idle.get(timeout=self.wait_seconds)
        except queue.Empty:
            raise EngineGone(f"no query engine came free within {self.wait_seconds:g} s") from None
        try:
            engine.queries.send(dict(namespace=namespace, question=question, route=route, top_k=top_k,
                                     budget=budget, llm=llm, history=history, choices=choices))
            engine.answered += 1
            ok, value = engine.queries.recv()
        except (EOFError, OSError):
            threading.Thread(target=self._replace, args=(engine,), name="lazyhippo-engine-restart", daemon=True).start()
            raise EngineGone(f"query engine {engine.process.pid} died during the query; restarting it") from None
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
        return self._infos()[0]["namespaces"]

    def status(self) -> dict:
        return self._infos()[0]["warm"]

    @property
    def swaps(self) -> int:
        """Swaps every live engine has made (the slowest one's count)."""
        return min(info["swaps"] for info in self._infos())

    def _infos(self) -> list[dict]:
        """What each live engine reports; one dying meanwhile (its restart under way) is left out."""
        infos = []
        for engine in list(self._engines):
            try:
                infos.append(engine.ask("info"))
            except (EOFError, OSError):
                continue
        if not infos:
            raise EngineGone("no query engine is running")
        return infos

    def engines(self) -> list[dict]:
        """Each engine's process id and the queries it was given: how evenly the load is spread."""
        return [{"pid": e.process.pid, "queries": e.answered} for e in list(self._engines)]

    # ------------------------------------------------------------ index runs, restarts, stop

    def begin_write(self) -> None:
        for engine in list(self._engines):
            engine.ask("begin_write")

    def end_write(self) -> None:
        """Every engine refreshes (and swaps in the new index) before this returns, as `IndexPool.end_write`."""
        for engine in list(self._engines):
            engine.ask("end_write")

    def _replace(self, dead: _Engine) -> None:
        dead.process.join(5)
        dead.queries.close()
        dead.control.close()
        log.warning("query engine %s exited (code %s); starting a new one", dead.process.pid, dead.process.exitcode)
        self._engines.remove(dead)
        if self._stopping:
            return
        try:
            self._ready(self._spawn())
        except Exception:  # noqa: BLE001 - the other engines keep serving
            log.exception("could not restart a query engine")

    def stop(self) -> None:
        """Closing its pipes ends an engine (it reads end-of-file); stragglers are terminated."""
        self._stopping = True
        for engine in list(self._engines):
            engine.queries.close()
            engine.control.close()
        for engine in list(self._engines):
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
