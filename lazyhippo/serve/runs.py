"""Index, delete and merge runs the HTTP API and the MCP tool accept: Dagster runs in the home's instance.

The server chooses each run's id and a `lazyhippo --run-id ID index | delete | merge` process executes the Dagster
run under that id (a delete or merge: its edit, then the `rebuild_graph` run), so it shows in the UI with its
namespace tag like any CLI run. A process, because Dagster's in-process runs reconfigure logging and hold locks
that deadlocked a server running several at once; it inherits the server's one compute thread (the other cores
keep answering queries). Runs go one at a time (they write the same warehouse) from a bounded queue, so a burst
is refused (429) rather than piling up; a run waiting there is QUEUED and not yet in the instance. Everything
else is read from the instance (through the run records the Dagster side registers with `use_run_records`, so
the engine imports no Dagster): status, tags, the
failure reason of its events, the document counts of its materializations; the process's output is never read.
A run ends once the server is done with it: it is SUCCESS once its index is served (the pool has swapped in the
snapshot the run published), FAILURE once a failed upload's files are removed. Canceling
marks the run CANCELING, ends its process group and records it CANCELED. A failed run's `error` is its cause
without server paths or exception names.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

_RECORDS: Callable[[Path], Any] | None = None


def use_run_records(factory: Callable[[Path], Any]) -> None:
    """Register the run system a server reads and records its runs in (a home -> its records, e.g.
    `lazyhippo_dagster.served_runs.ServedRuns`): the Dagster side hands it over, the engine imports no Dagster."""
    global _RECORDS
    _RECORDS = factory

log = logging.getLogger(__name__)
KEPT_RUNS = 1000  # ended runs whose status stays available
EXCEPTION_NAME = re.compile(r"\b(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:?\s*")
ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[^\s'\"/:,;()]+/)*([^\s'\"/:,;()]+)")


def public_error(cause: str, source: Path | None) -> str:
    """A run's cause as a client may see it: files named relative to its source, other paths by their last
    part, no exception names."""
    if source is not None:
        cause = cause.replace(f"{source}/", "").replace(str(source), "the source")
    return EXCEPTION_NAME.sub("", ABSOLUTE_PATH.sub(r"\1", cause)).strip() or "the index run failed"


class QueueFull(RuntimeError):
    """Too many index runs wait already."""


class RunEnded(RuntimeError):
    """The run ended already: nothing to cancel."""


@dataclass
class Run:
    """What the server knows of a run beside the instance: its request, and its place in the queue."""

    run_id: str
    namespace: str
    mode: str | None          # an index run's replace | add (None: an edit)
    source: Path | None = field(repr=False)
    upload: bool = False
    options: tuple[str, ...] = ()   # further `lazyhippo index` options (index settings the request set)
    command: tuple[str, ...] = field(default=(), repr=False)  # an edit's `lazyhippo` arguments (none: an index run)
    submitted_at: float = field(default_factory=time.time)
    state: str = "waiting"    # waiting (in the queue), running (its process runs), done
    canceled: bool = False    # a cancel was asked for
    served: bool | None = None  # after a SUCCESS: whether the pool serves the index it published
    ended_at: float | None = None
    final: dict | None = field(default=None, repr=False)  # the status once ended (the instance's record no longer changes)

    @property
    def operation(self) -> str:
        return self.command[0] if self.command else "index"

    def argv(self, home: Path) -> list[str]:
        """The `lazyhippo` process of this run (an edit's own arguments come after `--`, so none is an option)."""
        scope = ["--home", str(home), "--namespace", self.namespace]
        cli = [sys.executable, "-m", "lazyhippo_dagster.cli", "--run-id", self.run_id]
        if self.command:
            return [*cli, *self.command[:1], *scope, *self.command[1:]]
        return [*cli, "index", str(self.source), *scope, "--mode", self.mode, *self.options]


class IndexRuns:
    """The run queue of one server over the home of `pool` (an IndexPool or EnginePool)."""

    def __init__(self, pool, max_pending: int = 4, run_seconds: float = 6 * 3600):
        self.pool = pool
        self.home = Path(pool.settings.home)
        self.run_seconds = run_seconds
        self._queue: queue.Queue[Run | None] = queue.Queue(maxsize=max_pending)
        self._runs: dict[str, Run] = {}
        self._records = None
        self._lock = threading.Lock()  # a run's state and its process, between the worker and cancels
        self._child: subprocess.Popen | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="lazyhippo-index-runs", daemon=True)
        self._thread.start()

    @property
    def records(self):
        """The home's runs, in the run system registered with `use_run_records`."""
        if self._records is None:
            if _RECORDS is None:
                raise RuntimeError("no run system registered: start the server with `lazyhippo serve` or `lazyhippo mcp`")
            self._records = _RECORDS(self.home)
        return self._records

    def submit(self, source: Path | None, namespace: str, mode: str | None, upload: bool = False,
               options: tuple[str, ...] = (), command: tuple[str, ...] = ()) -> Run:
        """Queue an index run of `source`, or with `command` an edit (`("delete", ..., "--", DOC...)`)."""
        run = Run(str(uuid.uuid4()), namespace, mode, source, upload, options, command=command)
        try:
            self._queue.put_nowait(run)
        except queue.Full:
            raise QueueFull(f"{self._queue.maxsize} index runs are waiting already; retry later") from None
        self._runs[run.run_id] = run
        ended = [r for r in self._runs.values() if r.ended_at is not None]
        for old in ended[:max(0, len(ended) - KEPT_RUNS)]:  # oldest first: dicts keep insertion order
            del self._runs[old.run_id]
        return run

    def get(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    def status(self, run: Run) -> dict:
        """The run as the API reports it: the instance's status, tags and failure reason, and the documents its
        materializations counted; a SUCCESS only once its index is served."""
        if run.final is not None:
            return run.final
        state = run.state
        record = None if state == "waiting" and not run.canceled else self.records.record(run.run_id)
        out = {"run_id": run.run_id, "operation": run.operation, "namespace": run.namespace, "mode": run.mode,
               "status": "QUEUED", "tags": {}, "error": None, "documents": None,
               "submitted_at": run.submitted_at, "ended_at": run.ended_at}
        if record is not None:
            out.update(status=record.status, tags=record.tags, documents=record.documents,
                       error=public_error(record.error, run.source) if record.error else None)
            if record.ended and state != "done":  # the server has yet to finish it: swap its index in, clean up
                out["status"] = "STARTED"
            elif record.status == "SUCCESS" and not run.served:
                out.update(status="FAILURE", error="the index was built but the server could not load it (see /health)")
        if state == "done" and (record is None or record.ended):
            run.final = out
        return out

    def wait(self, run: Run, seconds: float) -> dict:
        """`run`'s status once it ended, or as it is after `seconds`."""
        deadline = time.monotonic() + seconds
        while run.state != "done" and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.status(run)

    def cancel(self, run: Run) -> dict:
        """End `run`: a waiting one is recorded CANCELED and skipped, a running one's process group ended (the
        worker records it CANCELED once the process is gone). RunEnded when it ended already."""
        with self._lock:
            if run.state == "done" or run.canceled:
                raise RunEnded(f"run {run.run_id} has ended already" if run.state == "done"
                               else f"run {run.run_id} is being canceled already")
            run.canceled = True
            if run.state == "waiting":  # the worker skips it
                self._record_canceled(run, "canceled before it started")
                self._ended(run)
                return self.status(run)
            self.records.canceling(run.run_id, "canceled over the API: ending its process")
            self._end_child()
        return self.status(run)

    def _record_canceled(self, run: Run, message: str) -> None:
        self.records.cancel(run.run_id, run.operation, run.namespace, self._tags(run), message)

    def _tags(self, run: Run) -> dict[str, str]:
        return {"lazyhippo/mode": run.mode} if run.mode else {}

    def _end_child(self) -> None:
        child = self._child
        if child is not None:  # its own session: the processes it started end with it
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _ended(self, run: Run) -> None:
        if run.upload and not run.served:
            shutil.rmtree(run.source, ignore_errors=True)
        run.ended_at = time.time()
        run.state = "done"

    def _work(self) -> None:
        while (run := self._queue.get()) is not None:
            try:
                self._execute(run)
            except Exception:  # noqa: BLE001 - one run's failure never stops the queue
                log.exception("index run %s failed", run.run_id)
                try:
                    self.records.fail(run.run_id, run.operation, run.namespace, self._tags(run),
                                      "the server could not run it; see the server log")
                except Exception:  # noqa: BLE001 - the instance itself failed: the server log says so
                    log.exception("run %s could not be recorded failed", run.run_id)
            if run.state != "done":
                self._ended(run)

    def _execute(self, run: Run) -> None:
        with self._lock:
            if run.state == "done":  # canceled while it waited
                return
            if self._stopping:
                self._record_canceled(run, "the server stopped before the run started")
                return
            run.state = "running"
        self.pool.begin_write()
        try:
            with self._lock:
                child = self._child = subprocess.Popen(run.argv(self.home), stdin=subprocess.DEVNULL,
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                       start_new_session=True)
                if run.canceled or self._stopping:  # asked for while the process was being started
                    self._end_child()
            try:
                code = child.wait(timeout=self.run_seconds)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                code = child.wait()
                self.records.fail(run.run_id, run.operation, run.namespace, self._tags(run),
                                  f"the run took longer than {self.run_seconds:.0f} s and was ended")
        finally:
            with self._lock:
                self._child = None
            self.pool.end_write()  # the new index is swapped in before the run is reported
        record = self.records.record(run.run_id)
        if record is not None and record.status == "SUCCESS":
            run.served = self._served(run.namespace)
            if run.served and run.upload:
                self._prune(run)
            return
        if record is None or not record.ended:  # the process ended without ending its run (killed, crashed)
            if run.canceled or self._stopping:
                self._record_canceled(run, "canceled: its process was ended")
            else:
                self.records.fail(run.run_id, run.operation, run.namespace, self._tags(run),
                                  f"the run's process ended with code {code} before the run did; see the server log")
        log.warning("%s run %s for namespace %s did not succeed (process exit code %s)", run.operation, run.run_id,
                    run.namespace, code)

    def _served(self, namespace: str) -> bool:
        """Whether the pool serves the snapshot the run published (not an older one it still holds)."""
        from lazyhippo.serve.pool import snapshot_version

        version = snapshot_version(self.pool.settings.with_(namespace=namespace))
        return bool(version) and self.pool.served().get(namespace) == version

    def _prune(self, done: Run) -> None:
        """Remove the namespace's upload folders older than the one just indexed, except those of runs still to
        come (newer ones, and uploads still being written, belong to requests in flight)."""
        keep = {done.source} | {r.source for r in self._runs.values() if r.upload and r.state != "done"}
        written = done.source.stat().st_mtime
        for folder in (self.home / "uploads" / done.namespace).iterdir():
            if folder not in keep and not folder.name.startswith(".") and folder.stat().st_mtime <= written:
                shutil.rmtree(folder, ignore_errors=True)

    def stop(self) -> None:
        """Cancel the waiting runs and end the running one."""
        with self._lock:
            self._stopping = True
            self._end_child()
        while True:
            try:
                waiting = self._queue.get_nowait()
            except queue.Empty:
                break
            if waiting is not None and waiting.state != "done":
                waiting.canceled = True
                try:
                    self._record_canceled(waiting, "the server stopped before the run started")
                except Exception:  # noqa: BLE001 - stopping goes on
                    log.exception("run %s could not be recorded canceled", waiting.run_id)
                self._ended(waiting)
        self._queue.put(None)
        self._thread.join(30)
