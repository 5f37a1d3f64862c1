"""Index runs the HTTP API and the MCP tool accept, executed outside the serving process.

Each run is one `lazyhippo index`, `delete` or `merge` process (the last two: an edit, then the Dagster
`rebuild_graph` run); a process, because Dagster's in-process runs reconfigure logging and hold locks that
deadlocked a server running several at once; runs go one at a time (they write the same warehouse) from a
bounded queue, so a burst of submissions is refused (429) rather than piling up. The server's threads only
wait on the child, which inherits the server's one compute thread (the other cores keep answering queries). A run is SUCCESS once its index is served: the pool has swapped in the snapshot the run published.
A failed run's `error` is its cause without server paths or exception names; a failed upload's files are
removed.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
COUNTS = re.compile(r"documents: (\d+) added, (\d+) changed, (\d+) removed")
REMOVED = re.compile(r"^removed (\d+) document\(s\)", re.MULTILINE)
KEPT_RUNS = 1000  # ended runs whose status stays available
CAUSE = re.compile(r"^(?:error|root cause|\S+ failed): (.+)$", re.MULTILINE)
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


@dataclass
class Run:
    run_id: str
    namespace: str
    mode: str | None          # an index run's replace | add (None: an edit)
    source: Path | None = field(repr=False)
    upload: bool = False
    options: tuple[str, ...] = ()   # further `lazyhippo index` options (index settings the request set)
    command: tuple[str, ...] = field(default=(), repr=False)  # an edit's `lazyhippo` arguments (none: an index run)
    status: str = "QUEUED"   # QUEUED, STARTED, SUCCESS, FAILURE, CANCELED
    submitted_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    documents: dict | None = None   # {"added", "changed", "removed"} once the run read its source
    error: str | None = None

    @property
    def operation(self) -> str:
        return self.command[0] if self.command else "index"

    def public(self) -> dict:
        return {"operation": self.operation,
                **{k: v for k, v in asdict(self).items() if k not in ("source", "upload", "command")}}

    def argv(self, home: Path) -> list[str]:
        """The `lazyhippo` process of this run (an edit's own arguments come after `--`, so none is an option)."""
        scope = ["--home", str(home), "--namespace", self.namespace]
        if self.command:
            return [sys.executable, "-m", "lazyhippo_dagster.cli", *self.command[:1], *scope, *self.command[1:]]
        return [sys.executable, "-m", "lazyhippo_dagster.cli", "index", str(self.source), *scope, "--mode", self.mode,
                *self.options]


class IndexRuns:
    """The run queue of one server over the home of `pool` (an IndexPool or EnginePool)."""

    def __init__(self, pool, max_pending: int = 4, run_seconds: float = 6 * 3600):
        self.pool = pool
        self.home = Path(pool.settings.home)
        self.run_seconds = run_seconds
        self._queue: queue.Queue[Run | None] = queue.Queue(maxsize=max_pending)
        self._runs: dict[str, Run] = {}
        self._child: subprocess.Popen | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="lazyhippo-index-runs", daemon=True)
        self._thread.start()

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

    def wait(self, run: Run, seconds: float) -> Run:
        """`run` once it ended, or as it is after `seconds`."""
        deadline = time.monotonic() + seconds
        while run.ended_at is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return run

    def _work(self) -> None:
        while (run := self._queue.get()) is not None:
            try:
                self._execute(run)
            except Exception as exc:  # noqa: BLE001 - one run's failure never stops the queue
                log.exception("index run %s failed", run.run_id)
                run.status, run.error = "FAILURE", "the server could not run it; see the server log"
            if run.upload and run.status != "SUCCESS":
                shutil.rmtree(run.source, ignore_errors=True)
            run.ended_at = time.time()

    def _execute(self, run: Run) -> None:
        if self._stopping:
            run.status = "CANCELED"
            return
        run.status = "STARTED"
        argv = run.argv(self.home)
        self.pool.begin_write()
        try:
            self._child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            try:
                out, _ = self._child.communicate(timeout=self.run_seconds)
            except subprocess.TimeoutExpired:
                self._child.kill()
                out, _ = self._child.communicate()
            code = self._child.returncode
        finally:
            self._child = None
            self.pool.end_write()  # the new index is swapped in before the run is reported
        text = out.decode("utf-8", "replace")
        if counts := COUNTS.search(text):
            run.documents = dict(zip(("added", "changed", "removed"), map(int, counts.groups())))
        elif removed := REMOVED.search(text):
            run.documents = {"added": 0, "changed": 0, "removed": int(removed.group(1))}
        if code == 0 and self._served(run.namespace):
            run.status = "SUCCESS"
            if run.upload:
                self._prune(run)
            return
        run.status = "CANCELED" if self._stopping else "FAILURE"
        causes = CAUSE.findall(text)
        if code == 0:
            run.error = "the index was built but the server could not load it (see /health)"
        else:
            run.error = public_error(causes[-1].strip(), run.source) if causes else f"the index process exited with code {code}"
        log.warning("%s run %s for namespace %s failed: %s", run.operation, run.run_id, run.namespace,
                    causes[-1].strip() if causes else run.error)

    def _served(self, namespace: str) -> bool:
        """Whether the pool serves the snapshot the run published (not an older one it still holds)."""
        from lazyhippo.serve.pool import snapshot_version

        version = snapshot_version(self.pool.settings.with_(namespace=namespace))
        return bool(version) and self.pool.served().get(namespace) == version

    def _prune(self, done: Run) -> None:
        """Remove the namespace's upload folders older than the one just indexed, except those of runs still to
        come (newer ones, and uploads still being written, belong to requests in flight)."""
        keep = {done.source} | {r.source for r in self._runs.values() if r.upload and r.status in ("QUEUED", "STARTED")}
        written = done.source.stat().st_mtime
        for folder in (self.home / "uploads" / done.namespace).iterdir():
            if folder not in keep and not folder.name.startswith(".") and folder.stat().st_mtime <= written:
                shutil.rmtree(folder, ignore_errors=True)

    def stop(self) -> None:
        """Cancel the waiting runs and end the running one."""
        self._stopping = True
        while True:
            try:
                waiting = self._queue.get_nowait()
            except queue.Empty:
                break
            if waiting is not None:
                waiting.status, waiting.ended_at = "CANCELED", time.time()
        child = self._child
        if child is not None:  # its own session: the processes it started end with it
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self._queue.put(None)
        self._thread.join(30)
