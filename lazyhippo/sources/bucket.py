"""A MinIO/S3 bucket prefix as the source (`--source s3://bucket/prefix`).

The source sensor diffs the prefix's objects by (key, size, etag) from one listing and reads only the objects
whose stamp changed. An index run mirrors the prefix into a folder under the index home (objects whose etag
changed are downloaded again, objects gone are removed) and reads that folder like any other source, so
document ids are the object keys relative to the prefix.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from lazyhippo.settings import Settings
from lazyhippo.sources.changes import SourceChange, SourceState, diff_source, read_docs
from lazyhippo.sources.files import SUPPORTED, iter_files

SCHEME = "s3://"
_MANIFEST = ".lazyhippo-etags.json"  # the mirror's key -> [size, etag] (not a supported suffix: never read as a document)


def bucket_source(source: str) -> tuple[str, str] | None:
    """(bucket, prefix ending in '/' or empty) of an `s3://bucket/prefix` source; None for a path."""
    if not source.startswith(SCHEME):
        return None
    bucket, _, prefix = source[len(SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"source {source!r} names no bucket (expected s3://bucket/prefix)")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def open_bucket(bucket: str):
    """The MinIO client for a source bucket (endpoint and credentials as for the object store)."""
    from lazyhippo.stores.minio import MinioObjectStore

    return MinioObjectStore.from_env(bucket=bucket)


def source_objects(store, prefix: str) -> dict[str, tuple[int, str]]:
    """Relative name -> (size, etag) of the documents under the prefix (supported suffixes only)."""
    return {key[len(prefix):]: stamp for key, stamp in store.stamps(prefix).items()
            if Path(key).suffix.lower() in SUPPORTED and key[len(prefix):]}


def scan_bucket(store, prefix: str, max_bytes: int, previous: SourceState) -> tuple[SourceState, SourceChange]:
    """The sensor's scan of a bucket prefix: objects whose (size, etag) changed are downloaded to a temporary
    folder and read there; the others keep their cursor entry."""
    with tempfile.TemporaryDirectory(prefix="lazyhippo-scan-") as tmp:
        root = Path(tmp)

        def read(rel: str) -> dict[str, str] | None:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                path.write_bytes(store.get(prefix + rel))
            except FileNotFoundError:  # deleted since the listing: the next tick sees it gone
                return None
            return read_docs(path, root, max_bytes)

        return diff_source(source_objects(store, prefix), read, previous)


def mirror_dir(settings: Settings) -> Path:
    return settings.home / "sources" / settings.namespace


def source_path(settings: Settings) -> Path:
    """The folder (or file) an index run reads: the source itself, or the synced mirror of a bucket prefix."""
    return sync_mirror(settings) if bucket_source(settings.source) else Path(settings.source)


def sync_mirror(settings: Settings, store=None) -> Path:
    """Bring the namespace's mirror of the bucket prefix up to date and return it: changed objects downloaded
    (each file replaced atomically), removed ones deleted."""
    bucket, prefix = bucket_source(settings.source)
    store = store or open_bucket(bucket)
    folder = mirror_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / _MANIFEST
    try:
        held = {k: tuple(v) for k, v in json.loads(manifest_path.read_text()).items()}
    except (FileNotFoundError, json.JSONDecodeError):
        held = {}
    objects = source_objects(store, prefix)
    for path in iter_files(folder):  # objects gone (the manifest may be older than the files)
        if path.relative_to(folder).as_posix() not in objects:
            path.unlink()
    for rel, stamp in objects.items():
        path = folder / rel
        if held.get(rel) == stamp and path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(store.get(prefix + rel))
        tmp.replace(path)
    tmp = manifest_path.with_name(f"{_MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: list(v) for k, v in objects.items()}))
    tmp.replace(manifest_path)
    return folder
