"""Object store protocol: a local folder by default, MinIO/S3 in production (see minio_store)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> str:
        """Store `data` under `key` idempotently; return its content md5 (verified after the write)."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError when `key` holds none."""
        ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete(self, key: str) -> None: ...

    @property
    def uri(self) -> str: ...


class ObjectStoreError(RuntimeError):
    pass


class LocalObjectStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def uri(self) -> str:
        return self.root.resolve().as_uri()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ObjectStoreError(f"object key {key!r} escapes the store root")
        return path

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        md5 = hashlib.md5(data).hexdigest()
        if path.exists() and hashlib.md5(path.read_bytes()).hexdigest() == md5:
            return md5  # unchanged: no rewrite
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        if path.stat().st_size != len(data):
            raise ObjectStoreError(f"short write for {key}: {path.stat().st_size} != {len(data)} bytes")
        return md5

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.exists():
            return []
        keys = (p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix) and not k.endswith(".tmp"))
