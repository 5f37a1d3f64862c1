"""Published snapshots through the object store, so query servers on other hosts serve the same index version.

Publishing a namespace (`warehouse.publish`) with LAZYHIPPO_SNAPSHOTS=s3://bucket/prefix uploads its snapshot
as a new version, `<prefix>/<namespace>/<version>.duckdb`, and then, last, `<prefix>/<namespace>/manifest.json`
naming it (with its md5): a reader sees either the old manifest or the new one, each naming a complete file.
A server (`lazyhippo serve --snapshots s3://...`) pulls a namespace whose manifest changed into its own home's
`published/` (verified, then renamed atomically), where its index pool picks it up as after a local run. When
the store cannot be reached it keeps serving what it has and says so in its status.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from lazyhippo.stores.objects import ObjectStore

KEEP_VERSIONS = 3  # older versions are deleted after a publish (a slow reader may still fetch the previous one)


def parse_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not uri.startswith("s3://") or not bucket:
        raise ValueError(f"--snapshots / LAZYHIPPO_SNAPSHOTS {uri!r}: expected s3://bucket/prefix")
    return bucket, prefix.strip("/")


def open_store(uri: str, **options) -> tuple[ObjectStore, str]:
    from lazyhippo.stores.minio import MinioObjectStore

    bucket, prefix = parse_uri(uri)
    return MinioObjectStore.from_env(bucket=bucket, **options), prefix


def _key(prefix: str, *parts: str) -> str:
    return "/".join(p for p in (prefix, *parts) if p)


def upload(store: ObjectStore, prefix: str, namespace: str, path: Path) -> dict:
    """Upload `path` as the namespace's newest version, then its manifest; drop versions beyond KEEP_VERSIONS."""
    data = path.read_bytes()
    md5 = hashlib.md5(data).hexdigest()
    now = datetime.now(timezone.utc)
    version = f"{now.strftime('%Y%m%dT%H%M%S%fZ')}-{md5[:12]}"
    key = _key(prefix, namespace, f"{version}.duckdb")
    store.put(key, data)
    manifest = {"namespace": namespace, "version": version, "key": key, "md5": md5, "bytes": len(data),
                "published_at": now.isoformat(timespec="seconds")}
    store.put(_key(prefix, namespace, "manifest.json"), json.dumps(manifest).encode())
    for old in sorted(k for k in store.list(_key(prefix, namespace, "")) if k.endswith(".duckdb"))[:-KEEP_VERSIONS]:
        store.delete(old)
    return manifest


class SnapshotSync:
    """Keeps a server's `published/` folder at the newest manifest of every namespace under the prefix."""

    def __init__(self, uri: str, target: Callable[[str], Path], store: ObjectStore | None = None):
        """`target(namespace)`: the local snapshot file the server reads (`warehouse.snapshot_path`); `store`:
        the store `uri` names, opened here unless given."""
        self.uri, self.target = uri, target
        self.store, self.prefix = (store, parse_uri(uri)[1]) if store is not None else open_store(uri, timeout=5, retries=0)
        self.versions: dict[str, str] = {}
        self.reachable: bool | None = None
        self.error: str | None = None
        self.checked_at: str | None = None
        self._lock = threading.Lock()
        self.stop = lambda: None

    def pull(self) -> list[str]:
        """Fetch every namespace whose manifest names a version this server does not have; the namespaces
        swapped. A store that cannot be reached leaves everything as it is (and is reported by `status`)."""
        swapped = []
        with self._lock:
            try:
                manifests = [k for k in self.store.list(_key(self.prefix, "")) if k.endswith("/manifest.json")]
                for key in manifests:
                    manifest = json.loads(self.store.get(key))
                    namespace = manifest["namespace"]
                    if self.versions.get(namespace) == manifest["version"]:
                        continue
                    data = self.store.get(manifest["key"])
                    if hashlib.md5(data).hexdigest() != manifest["md5"]:
                        raise ValueError(f"{manifest['key']}: content does not match its manifest's md5")
                    target = self.target(namespace)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    tmp = target.with_name(f".{target.name}.{os.getpid()}.pull")
                    tmp.write_bytes(data)
                    os.replace(tmp, target)
                    self.versions[namespace] = manifest["version"]
                    swapped.append(namespace)
                self.reachable, self.error = True, None
            except Exception as exc:  # noqa: BLE001 - reported in /health; the last snapshot keeps serving
                self.reachable, self.error = False, f"{type(exc).__name__}: {exc}"
            self.checked_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return swapped

    def start(self, poll_seconds: float = 2.0) -> "SnapshotSync":
        """Pull now (a server starts on the newest snapshot), then in the background every `poll_seconds`."""
        self.pull()
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(poll_seconds):
                self.pull()

        threading.Thread(target=loop, name="lazyhippo-snapshot-sync", daemon=True).start()
        self.stop = stop.set
        return self

    def status(self) -> dict:
        state = "in sync" if self.reachable else ("store unreachable: serving the last snapshot pulled"
                                                   if self.reachable is False else "not checked yet")
        return {"source": self.uri, "state": state, "reachable": self.reachable, "error": self.error,
                "checked_at": self.checked_at, "versions": dict(self.versions)}
