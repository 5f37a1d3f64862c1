"""Warm indexes for servers (the HTTP API and the MCP tool): one GraphIndex per namespace, loaded once and
swapped atomically when the warehouse changes.

A query takes the namespace's current `Warm` entry and keeps it for its whole run, so a query in flight
finishes on the index it started with while a refresher thread builds the newer one off the request path.
Indexes are read from the published snapshots (`published/<namespace>.duckdb`, replaced atomically at the
end of a complete index run; see `lazyhippo.stores.warehouse`): a run under way is never read half-written and the
server never holds a lock a run needs. Each snapshot file's modification time and size are its version; a
namespace whose file changed is reloaded once the folder has stayed put for `settle_seconds`.
`begin_write()`/`end_write()` bracket an index run this process launched: no polling meanwhile, one forced
refresh right after it.

A snapshot that cannot be read harms only its namespace: it is published again from the warehouse when that
holds its complete index, else the namespace keeps its previous index (if any) and is reported `damaged` until
a run replaces the file. Snapshots missing at start are published again the same way.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lazyhippo.models.embedders import get_embedder
from lazyhippo.query import (
    DEFAULT_CONFIG,
    GraphIndex,
    QueryConfig,
    QueryOptions,
    QueryResult,
    Retrieval,
    answer_question,
    load_index,
    search,
)
from lazyhippo.query.routes import check_route
from lazyhippo.settings import Settings, environment
from lazyhippo.stores.snapshots import SnapshotSync
from lazyhippo.stores.usage import record_answer_usage
from lazyhippo.stores.warehouse import (IndexIncomplete, index_notice, published_namespaces, read_state, republish,
                                        snapshot_dir, snapshot_path)

log = logging.getLogger(__name__)


class UnknownNamespace(LookupError):
    """The warehouse holds no index for this namespace."""


class SerializedEmbedder:
    """One embedding call at a time: the Hugging Face tokenizer inside model2vec is not thread-safe ("Already
    borrowed" under concurrent queries); a query embeds in well under a millisecond, so the lock costs little."""

    def __init__(self, embedder, lock: threading.Lock | None = None):
        self.inner = embedder
        self.name = getattr(embedder, "name", None)
        self._lock = lock or threading.Lock()
        passages = getattr(embedder, "passages", embedder)
        self.passages = self if passages is embedder else SerializedEmbedder(passages, self._lock)

    def embed(self, texts):
        with self._lock:
            return self.inner.embed(texts)


@dataclass(frozen=True)
class Warm:
    settings: Settings
    index: GraphIndex
    version: tuple   # the snapshot file version the index was read from


DAMAGED = "its published index could not be read; answering from the previous one if any; run `lazyhippo index` for it"


class IndexPool:
    def __init__(self, settings: Settings, config: QueryConfig = DEFAULT_CONFIG, settle_seconds: float = 2.0,
                 poll_seconds: float = 1.0, max_concurrent: int | None = None):
        self.settings = settings
        self.config = config
        self.settle_seconds = settle_seconds
        self.poll_seconds = poll_seconds
        self.embedder = SerializedEmbedder(get_embedder(settings.embedder, settings.embedding_model))
        self._warm: dict[str, Warm] = {}
        self._known: set[str] = set()
        self._version: dict | None = None    # snapshot versions by namespace, as of the last complete refresh
        self.damaged: dict[str, tuple] = {}  # namespace -> version of the snapshot that could not be read
        self._republished: set[tuple] = set()  # (namespace, version) already published again once
        self._lock = threading.Lock()        # one loader at a time; readers never take it
        self._holds = 0                      # index runs of this process under way
        self._seen: tuple[dict, float] | None = None  # (snapshot versions, first seen at) while settling
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.preload = True                  # load every known namespace (else on first use)
        self.swaps = 0
        self.snapshots: SnapshotSync | None = None  # pulling published snapshots from the object store
        self.answered = 0                    # queries answered (answer and retrieve)
        self._count_lock = threading.Lock()
        # queries are CPU-bound Python: more running at once than cores only adds interpreter-lock churn
        # (measured: 8 at once gave half the throughput of 2 on 2 cores); the rest wait their turn
        self._slots = threading.BoundedSemaphore(max_concurrent or os.cpu_count() or 1)

    # ------------------------------------------------------------ reading

    def namespaces(self) -> list[str]:
        """Namespaces with an index in the warehouse (as of the last refresh)."""
        return sorted(self._known)

    def get(self, namespace: str) -> Warm:
        """The namespace's current warm index, loading it on first use."""
        warm = self._warm.get(namespace)
        if warm is not None:
            return warm
        if namespace not in self._known:
            raise UnknownNamespace(namespace)
        with self._lock:
            if namespace not in self._warm:
                self._load(namespace)
            return self._warm[namespace]

    def answer(self, namespace: str, question: str, route: str = "auto", top_k: int = 8, budget: int = 32000,
               llm="auto", history: list[dict] | None = None, choices: dict | None = None) -> QueryResult:
        """`history`: earlier turns of the conversation; `choices`: query options for this question
        (QueryOptions names: rerank, chunk_selection, damping, ...) over the server's."""
        check_route(route)
        warm = self.get(namespace)
        settings, config, index = self._chosen(warm, choices)
        self._count()
        with self._slots:
            result = answer_question(settings, question, route=route, top_k=top_k, budget=budget, config=config,
                                     llm=llm, embedder=self.embedder, index=index, history=history)
        record_answer_usage(settings.home, namespace, None, result.usage)
        return result

    def notice(self, namespace: str) -> str | None:
        return namespace_notice(self.settings, namespace)

    def retrieve(self, namespace: str, question: str, route: str = "local", top_k: int = 8,
                 choices: dict | None = None, with_entities: bool = False, with_support: bool = False) -> Retrieval:
        check_route(route)
        warm = self.get(namespace)
        settings, config, index = self._chosen(warm, choices)
        self._count()
        with self._slots:
            return search(settings, question, route=route, top_k=top_k, config=config, embedder=self.embedder,
                          index=index, with_entities=with_entities, with_support=with_support)

    def _chosen(self, warm: Warm, choices: dict | None) -> tuple[Settings, QueryConfig, GraphIndex]:
        """The settings, query config and index of one question with its query options (QueryOptions names);
        another KNN threshold walks another graph, built once over the warm index's other parts."""
        options = QueryOptions.from_mapping(choices)
        config = options.config(self.config)
        index = warm.index if config.graph == self.config.graph else load_index(warm.settings, config.graph)
        return options.settings(warm.settings), config, index

    def _count(self) -> None:
        with self._count_lock:
            self.answered += 1

    def engines(self) -> list[dict]:
        """This process is the one engine (the shape of `EnginePool.engines`)."""
        return [{"pid": os.getpid(), "queries": self.answered}]

    # ------------------------------------------------------------ loading and swapping

    def _load(self, namespace: str) -> None:
        settings = self.settings.with_(namespace=namespace)
        version = snapshot_version(settings)
        index = load_index(settings, self.config.graph)
        self._warm[namespace] = Warm(settings, index, version)  # one reference assignment: the swap
        self.damaged.pop(namespace, None)
        # the index is millions of long-lived objects: out of the cyclic collector's reach, a full collection
        # no longer walks them all in the middle of some query (unfreeze first: a replaced index is freed)
        gc.unfreeze()
        gc.collect()
        gc.freeze()

    def _load_or_repair(self, namespace: str) -> bool:
        """Load the namespace; when its snapshot cannot be read, publish it again from the warehouse (once per
        damaged file) and retry. False: the namespace is marked damaged, its previous index (if any) kept."""
        try:
            self._load(namespace)
            return True
        except Exception:  # noqa: BLE001 - any unreadable file: only this namespace is affected
            settings = self.settings.with_(namespace=namespace)
            version = snapshot_version(settings)
            if self.damaged.get(namespace) != version:  # once per damaged file: it is retried every refresh
                log.warning("the published index of namespace %s could not be read", namespace, exc_info=True)
            if (namespace, version) not in self._republished:
                self._republished.add((namespace, version))
                try:
                    if republish_from_warehouse(settings):
                        log.warning("published namespace %s again from the warehouse", namespace)
                        self._load(namespace)
                        return True
                except Exception:  # noqa: BLE001 - the warehouse cannot repair it: a new index run will
                    log.warning("namespace %s could not be published again", namespace, exc_info=True)
            self.damaged[namespace] = version
            return False

    def refresh(self, force: bool = False) -> bool:
        """Reload the namespaces whose snapshot changed (once the folder settled; at once when `force`d, even
        while this process writes); True if anything was swapped. A namespace that failed to load is retried at
        the next refresh."""
        db = Path(snapshot_dir(self.settings))
        if not db.exists() or (self._holds and not force):
            return False
        version = snapshot_versions(self.settings)
        if version == self._version and not force:
            self._seen = None
            return False
        if not force:
            if self._seen is None or self._seen[0] != version:
                self._seen = (version, time.monotonic())
                return False
            if time.monotonic() - self._seen[1] < self.settle_seconds:
                return False
        with self._lock:
            known = set(list_namespaces(self.settings))
            for ns in set(self._warm) - known:  # its snapshot was deleted: keep serving it, publish it again
                if republish_from_warehouse(self.settings.with_(namespace=ns)):
                    log.warning("the published snapshot of namespace %s was gone: published it again", ns)
                    known.add(ns)
            self._known = known
            swapped, ok = False, True
            for ns in sorted(set(self._warm) | set(self.damaged) | (known if self.preload else set())):
                warm = self._warm.get(ns)
                if ns not in known:
                    self._warm.pop(ns, None)
                    self.damaged.pop(ns, None)
                elif warm is None or warm.version != snapshot_version(warm.settings):
                    loaded = self._load_or_repair(ns)
                    swapped, ok = swapped or loaded, ok and loaded
            if ok:  # a namespace that failed is retried at the next poll
                self._version = snapshot_versions(self.settings)
            self._seen = None
            self.swaps += swapped
        return swapped

    def begin_write(self) -> None:
        """This process starts writing the warehouse (an index run launched by the server): no refresh until
        the matching `end_write`, which forces one."""
        with self._lock:
            self._holds += 1

    def end_write(self) -> None:
        with self._lock:
            self._holds -= 1
        if not self._holds:
            try:
                self.refresh(force=True)
            except Exception:  # noqa: BLE001 - the poller retries; the old index keeps serving
                log.warning("refresh after an index run failed; retrying in the background", exc_info=True)

    def start(self, preload: bool = True, sync_snapshots: bool = True) -> "IndexPool":
        """Read the namespace list (and load every index when `preload`), then refresh in the background.
        With LAZYHIPPO_SNAPSHOTS (and `sync_snapshots`), the snapshots are pulled from the object store first."""
        if sync_snapshots:
            self.snapshots = snapshot_sync(self.settings)
        self.preload = preload
        known = set(list_namespaces(self.settings))  # (publishes a home indexed before snapshots existed)
        for ns in sorted(completed_namespaces(self.settings) - known):  # its snapshot went while the server was down
            if republish_from_warehouse(self.settings.with_(namespace=ns)):
                log.warning("the published snapshot of namespace %s was missing: published it again", ns)
                known.add(ns)
        if known:
            self._known = known
            if preload:
                with self._lock:
                    for ns in sorted(known):
                        self._load_or_repair(ns)
            if not self.damaged:  # else the poller retries the damaged ones
                self._version = snapshot_versions(self.settings)
        self._thread = threading.Thread(target=self._poll, name="lazyhippo-index-pool", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.snapshots is not None:
            self.snapshots.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        gc.unfreeze()  # the indexes are ordinary garbage again once the server stops

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a failed reload keeps the old index serving; retried next poll
                log.warning("index refresh failed; still serving the previous index", exc_info=True)

    def status(self) -> dict:
        return {ns: {"chunks": w.index.n_chunks, "entities": w.index.n_entities, "loaded_at": w.index.loaded_at,
                     "load_seconds": round(w.index.load_seconds, 3)} for ns, w in sorted(self._warm.items())}

    def served(self) -> dict[str, tuple]:
        """The snapshot version each warm namespace was loaded from."""
        return {ns: w.version for ns, w in self._warm.items()}

    def health(self) -> dict:
        """`ok`, or `degraded` with the namespaces whose index could not be read."""
        damaged = {ns: DAMAGED for ns in sorted(self.damaged)}
        return {"status": "degraded", "damaged": damaged} if damaged else {"status": "ok"}


def snapshot_sync(settings: Settings) -> SnapshotSync | None:
    """The server's pull of published snapshots when LAZYHIPPO_SNAPSHOTS (`serve --snapshots`) names a store."""
    uri = environment().snapshots
    return SnapshotSync(uri, lambda ns: snapshot_path(settings.with_(namespace=ns))).start() if uri else None


def list_namespaces(settings: Settings) -> list[str]:
    """Namespaces with a published (complete) index."""
    return published_namespaces(settings)


def republish_from_warehouse(settings: Settings) -> bool:
    """Publish the namespace's snapshot again when this home has a warehouse (a replica has only snapshots)."""
    return settings.db_path.exists() and republish(settings)


def completed_namespaces(settings: Settings) -> set[str]:
    """Namespaces whose last run completed and published (their snapshot should exist)."""
    return {ns for ns, entry in read_state(settings).items() if entry.get("published_at")}


def snapshot_version(settings: Settings) -> tuple:
    """The namespace's snapshot file's modification time and size (() when it is gone)."""
    try:
        st = snapshot_path(settings).stat()
    except OSError:
        return ()
    return st.st_mtime_ns, st.st_size


def snapshot_versions(settings: Settings) -> dict[str, tuple]:
    return {ns: snapshot_version(settings.with_(namespace=ns)) for ns in list_namespaces(settings)}


def namespace_notice(settings: Settings, namespace: str) -> str | None:
    """What a client should know about the namespace's latest index run (in progress, failed, killed), or None
    when the warm index is from the latest run."""
    try:
        return index_notice(settings.with_(namespace=namespace))
    except IndexIncomplete as exc:  # nothing published since: the warm index is an older complete one
        return str(exc)


def limit_threads() -> None:
    """A server process runs each query on one thread when `LAZYHIPPO_THREADS` says so (`serve` sets 1: the
    other cores already serve other queries); BLAS is already loaded, so it is limited here."""
    threads = environment().threads
    if threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
