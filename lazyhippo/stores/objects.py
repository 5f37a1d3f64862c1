"""Object store protocol: a local folder by default, MinIO/S3 in production (see minio_store)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Protocol


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> str:
        """Store `data` under `key` idempotently; return its content md5 (verified after the write)."""
        ...

    def put_file(self, key: str, path: Path) -> str:
        """`put` of the file at `path`, read in pieces: a large object never sits in memory whole."""
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


PIECE = 8 * 1024 * 1024  # bytes of a file read at a time


def file_md5(path: Path) -> str:
    md5 = hashlib.md5()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(PIECE), b""):
            md5.update(piece)
    return md5.hexdigest()


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
        return self._put(key, hashlib.md5(data).hexdigest(), len(data), lambda tmp: tmp.write_bytes(data))

    def put_file(self, key: str, path: Path) -> str:
        return self._put(key, file_md5(path), path.stat().st_size, lambda tmp: shutil.copyfile(path, tmp))

    def _put(self, key: str, md5: str, size: int, write) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size == size and file_md5(path) == md5:
            return md5  # unchanged: no rewrite
        tmp = path.with_name(path.name + ".tmp")
        write(tmp)
        tmp.replace(path)
        if path.stat().st_size != size:
            raise ObjectStoreError(f"short write for {key}: {path.stat().st_size} != {size} bytes")
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
