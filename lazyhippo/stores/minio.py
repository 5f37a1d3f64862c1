"""MinIO / S3 object store (the `minio` SDK). Same contract as LocalObjectStore: idempotent, verified puts.

* the bucket is created on first use when missing;
* `put` skips the upload when the stored object already has this content (etag or recorded md5 equal to the
  md5 of the data, same size), otherwise uploads in one part (so the etag is the md5) and verifies size and
  etag with `stat_object` afterwards;
* errors name the endpoint, bucket and key, never the credentials; a server that is down fails fast.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from lazyhippo.stores.objects import ObjectStoreError, file_md5

_SINGLE_PART_MAX = 5 * 1024 ** 3           # S3's largest single PUT


class MinioObjectStore:
    def __init__(self, endpoint: str, bucket: str, access_key: str, secret_key: str, secure: bool = False,
                 region: str | None = None, timeout: float = 10.0, retries: int = 2):
        import urllib3
        from minio import Minio

        self.endpoint = endpoint.removeprefix("http://").removeprefix("https://").rstrip("/")
        self.bucket = bucket
        self.secure = secure
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=timeout, read=max(timeout, 60.0)),
            retries=urllib3.Retry(total=retries, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)))
        self.client = Minio(self.endpoint, access_key=access_key, secret_key=secret_key, secure=secure,
                            region=region, http_client=http)
        self._bucket_ready = False

    @classmethod
    def from_env(cls, endpoint: str | None = None, bucket: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, **options) -> "MinioObjectStore":
        """Explicit (non-None) arguments, else MINIO_ENDPOINT (127.0.0.1:9000), MINIO_BUCKET (lazyhippo),
        MINIO_ROOT_USER / MINIO_ROOT_PASSWORD (or MINIO_ACCESS_KEY / MINIO_SECRET_KEY) from the environment or
        the services credentials file, MINIO_SECURE."""
        from lazyhippo.settings import credential, environment

        env = environment()
        return cls(endpoint or env.minio_endpoint, bucket or env.minio_bucket,
                   access_key or credential("MINIO_ACCESS_KEY", "MINIO_ROOT_USER"),
                   secret_key or credential("MINIO_SECRET_KEY", "MINIO_ROOT_PASSWORD"),
                   secure=env.minio_secure, **options)

    def __repr__(self) -> str:  # never shows the keys
        return f"MinioObjectStore(endpoint={self.endpoint!r}, bucket={self.bucket!r}, secure={self.secure})"

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}"

    @property
    def _url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"

    def _error(self, exc: Exception, doing: str, key: str | None = None) -> ObjectStoreError:
        from minio.error import S3Error

        where = f"s3://{self.bucket}/{key}" if key is not None else f"s3://{self.bucket}"
        if isinstance(exc, S3Error):
            if exc.code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
                why = f"{exc.code} (check MINIO_ROOT_USER / MINIO_ROOT_PASSWORD)"
            else:
                why = f"{exc.code}: {exc.message}"
        elif _is_connection_error(exc):
            why = "server unreachable (is it running? `lazyhippo services start minio`)"
        else:
            why = f"{type(exc).__name__}: {exc}"
        return ObjectStoreError(f"MinIO at {self._url}: {why} while {doing} {where}")

    def ensure_bucket(self, doing: str = "creating bucket", key: str | None = None) -> None:
        if self._bucket_ready:
            return
        from minio.error import S3Error

        try:
            if not self.client.bucket_exists(self.bucket):
                try:
                    self.client.make_bucket(self.bucket)
                except S3Error as exc:
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, doing, key) from exc
        self._bucket_ready = True

    def _stat(self, key: str):
        from minio.error import S3Error

        try:
            return self.client.stat_object(self.bucket, key)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound"):
                return None
            raise

    @staticmethod
    def _same(stat, md5: str, size: int) -> bool:
        if stat is None or stat.size != size:
            return False
        etag = (stat.etag or "").strip('"')
        meta = {k.lower(): v for k, v in (stat.metadata or {}).items()}
        return etag == md5 or meta.get("x-amz-meta-md5") == md5

    def put(self, key: str, data: bytes) -> str:
        return self._put(key, hashlib.md5(data).hexdigest(), len(data), lambda: io.BytesIO(data))

    def put_file(self, key: str, path: Path) -> str:
        return self._put(key, file_md5(path), path.stat().st_size, lambda: open(path, "rb"))

    def _put(self, key: str, md5: str, size: int, reader) -> str:
        self.ensure_bucket("writing", key)
        try:
            if self._same(self._stat(key), md5, size):
                return md5  # unchanged: no rewrite
            part = min(max(size, 5 * 1024 * 1024), _SINGLE_PART_MAX)
            with reader() as body:
                written = self.client.put_object(self.bucket, key, body, size, part_size=part, metadata={"md5": md5})
            if (written.etag or "").strip('"') == md5:  # a single-part upload's etag is its md5: nothing to ask
                return md5
            stat = self._stat(key)
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "writing", key) from exc
        if stat is None:
            raise ObjectStoreError(f"MinIO at {self._url}: s3://{self.bucket}/{key} missing right after the write")
        if stat.size != size:
            raise ObjectStoreError(f"MinIO at {self._url}: short write for s3://{self.bucket}/{key}: "
                                   f"{stat.size} != {size} bytes")
        if not self._same(stat, md5, size):
            raise ObjectStoreError(f"MinIO at {self._url}: etag {stat.etag} of s3://{self.bucket}/{key} "
                                   f"does not match the md5 {md5} of the data")
        return md5

    def get(self, key: str) -> bytes:
        from minio.error import S3Error

        self.ensure_bucket("reading", key)
        resp = None
        try:
            resp = self.client.get_object(self.bucket, key)
            return resp.read()
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                raise FileNotFoundError(f"s3://{self.bucket}/{key} not found on MinIO at {self._url}") from exc
            raise self._error(exc, "reading", key) from exc
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "reading", key) from exc
        finally:
            if resp is not None:
                resp.close()
                resp.release_conn()

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self.stamps(prefix))

    def stamps(self, prefix: str = "") -> dict[str, tuple[int, str]]:
        """key -> (size, etag) of every object under `prefix`, from the listing alone (no request per object)."""
        self.ensure_bucket("listing", prefix + "*")
        try:
            return {o.object_name: (o.size, (o.etag or "").strip('"'))
                    for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True) if not o.is_dir}
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "listing", prefix + "*") from exc

    def delete(self, key: str) -> None:
        self.ensure_bucket("deleting", key)
        try:
            self.client.remove_object(self.bucket, key)
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "deleting", key) from exc

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def expire(self, prefix: str, days: int) -> None:
        """Have the store itself delete the objects under `prefix` `days` after they were written: a bucket
        lifecycle rule of its own id, beside (never instead of) the bucket's other rules."""
        from minio.commonconfig import ENABLED, Filter
        from minio.lifecycleconfig import Expiration, LifecycleConfig, Rule

        self.ensure_bucket("setting the expiry of", prefix + "*")
        rule_id = "lazyhippo-expire-" + prefix.strip("/").replace("/", "-")
        try:
            current = self.client.get_bucket_lifecycle(self.bucket)
            rules = [r for r in (current.rules if current else []) if r.rule_id != rule_id]
            rules.append(Rule(ENABLED, rule_filter=Filter(prefix=prefix), rule_id=rule_id,
                              expiration=Expiration(days=days)))
            self.client.set_bucket_lifecycle(self.bucket, LifecycleConfig(rules))
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "setting the expiry of", prefix + "*") from exc

    def expiry_days(self, prefix: str) -> int | None:
        """The days after which the bucket's lifecycle deletes objects under exactly `prefix`, or None."""
        try:
            current = self.client.get_bucket_lifecycle(self.bucket)
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "reading the lifecycle of", prefix + "*") from exc
        return next((r.expiration.days for r in (current.rules if current else [])
                     if r.rule_filter and r.rule_filter.prefix == prefix and r.expiration), None)


def _is_connection_error(exc: BaseException) -> bool:
    import urllib3.exceptions as ux

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ux.MaxRetryError, ux.NewConnectionError, ux.ProtocolError, ux.TimeoutError,
                            ConnectionError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
