"""The ASGI layer in front of every endpoint: who may call what, decided from the headers before any body is
read, then body-size limits, then request metrics.

Keys (lazyhippo.settings.environment): the write key (`LAZYHIPPO_API_KEY`) may create knowledge bases and query,
the read key (`LAZYHIPPO_READ_KEY`) only query; either may be scoped to some namespaces. Without a key the
server listens on loopback only and guards against web pages: only loopback `Host` names (DNS rebinding),
no foreign `Origin`, and endpoints that change data need the token printed at start. Plain ASGI: Starlette's
`BaseHTTPMiddleware` runs each request through extra tasks and streams, paid on every query.
"""

from __future__ import annotations

import collections
import hmac
import ipaddress
import math
import re
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Histogram

from lazyhippo.serve.limits import Limits
from lazyhippo.settings import Environment

MIN_KEY_CHARS = 16
MIN_KEY_BITS = 30  # (16 random hex digits estimate 33 or more)
TOKEN_HEADER = "x-lazyhippo-token"
PUBLIC = {"/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
WRITES = {"/api/kg/create", "/api/kg/upload",  # POST: they change data (export: it hands out whole tables)
          "/api/kg/delete", "/api/kg/merge", "/api/kg/export"}
UPLOAD = "/api/kg/upload"
CANCEL = re.compile(r"/api/runs/[^/]+/cancel")  # POST: ends a run


def key_bits(key: str) -> float:
    """A rough entropy estimate: the key's length times the Shannon entropy of its characters, or of the steps
    between neighbours when lower (a run like `1234567812345678` uses many characters but one step)."""
    def entropy(values: list) -> float:
        counts = collections.Counter(values)
        return -sum(c / len(values) * math.log2(c / len(values)) for c in counts.values()) if values else 0.0

    steps = [ord(b) - ord(a) for a, b in zip(key, key[1:])]
    return len(key) * min(entropy(list(key)), entropy(steps))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Grant:
    """What the caller of one request may do; `namespaces` None: every namespace."""

    write: bool
    namespaces: frozenset[str] | None = None

    def covers(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


@dataclass(frozen=True)
class Access:
    """The keys of a server (none: keyless loopback, guarded by `token`)."""

    keys: tuple[tuple[str, Grant], ...] = ()
    token: str | None = None

    @classmethod
    def for_host(cls, env: Environment, host: str) -> Access:
        """The keys from the environment; a keyless server must bind to loopback and gets a new token. A key
        shorter than 16 characters or without variety is refused (it would be guessed)."""
        keys = tuple((key, Grant(write, scope)) for key, write, scope in (
            (env.api_key, True, env.api_key_namespaces), (env.read_key, False, env.read_key_namespaces)) if key)
        for key, grant in keys:
            name = "LAZYHIPPO_API_KEY" if grant.write else "LAZYHIPPO_READ_KEY"
            if len(key) < MIN_KEY_CHARS or key_bits(key) < MIN_KEY_BITS:
                raise ValueError(f"{name} must be at least {MIN_KEY_CHARS} random characters (e.g. "
                                 "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`)")
        if not keys and not is_loopback(host):
            raise ValueError(f"binding to {host} needs an API key: set LAZYHIPPO_API_KEY (no key is needed on "
                             "loopback only)")
        return cls(keys, None if keys else secrets.token_urlsafe(24))

    def grant(self, headers: dict[bytes, bytes]) -> Grant | None:
        """The grant of the request's key or token (None: none given or wrong)."""
        given = headers.get(b"x-api-key", b"").decode("latin-1")
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not self.keys:
            token = headers.get(TOKEN_HEADER.encode(), b"").decode("latin-1") or given
            return Grant(write=bool(token) and hmac.compare_digest(token.encode(), self.token.encode()))
        found = None
        for key, grant in self.keys:  # every key compared: the time taken does not tell which one matched
            if given and hmac.compare_digest(given.encode(), key.encode()):
                found = grant
        return found


def _refuse(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("lazyhippo_requests", "HTTP requests", ["endpoint", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("lazyhippo_request_seconds", "HTTP request latency", ["endpoint", "route"],
                                 registry=self.registry,
                                 buckets=(.005, .01, .025, .05, .075, .1, .25, .5, 1, 2.5, 5, 10))


class Guard:
    """Host and Origin checks (keyless), the key or token, body limits: all before the body is read. The
    request's grant goes to the endpoints in `scope["state"]["grant"]` (namespace scopes are theirs to check)."""

    def __init__(self, app, access: Access, metrics: Metrics, limits: Limits):
        self.app, self.access, self.metrics, self.limits = app, access, metrics, limits

    def check(self, scope) -> JSONResponse | None:
        headers = dict(scope["headers"])
        path, method = scope["path"], scope["method"]
        if sum(name == b"host" for name, _ in scope["headers"]) > 1:
            return _refuse(400, "more than one Host header")
        if not self.access.keys:
            host = headers.get(b"host", b"").decode("latin-1")
            if not is_loopback(urlsplit(f"//{host}").hostname or ""):
                return _refuse(400, "this server answers loopback host names only (Host header)")
            origin = headers.get(b"origin", b"").decode("latin-1")
            if origin and urlsplit(origin).netloc != host:
                return _refuse(403, "cross-origin requests are refused")
        grant = self.access.grant(headers)
        scope["state"]["grant"] = grant
        write = method == "POST" and (path in WRITES or CANCEL.fullmatch(path) is not None)
        if path not in PUBLIC:
            if grant is None:
                return _refuse(401, "missing or wrong API key", **{"WWW-Authenticate": "Bearer"})
            if write and not grant.write:
                return _refuse(401 if not self.access.keys else 403,
                               f"this endpoint changes data: send the token printed at server start in the "
                               f"{TOKEN_HEADER} header" if not self.access.keys else "this key may only query")
        size = headers.get(b"content-length", b"").decode("latin-1") or None
        limit = self.limits.max_upload_bytes if path == UPLOAD else self.limits.max_body_bytes
        if method == "POST" and size is None:  # a chunked body could not be limited before reading it
            return _refuse(411, "a Content-Length header is required")
        if size is not None and (not size.isdigit() or int(size) > limit):
            return _refuse(413, f"request body over {limit} bytes")
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        scope.setdefault("state", {})
        status = [500]  # unless a response starts

        async def observed_send(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await (self.check(scope) or self.app)(scope, receive, observed_send)
        finally:
            route = scope.get("route")
            endpoint = route.path if route is not None else "unmatched"
            label = scope["state"].get("route", "")
            self.metrics.requests.labels(endpoint, label, str(status[0])).inc()
            self.metrics.latency.labels(endpoint, label).observe(time.perf_counter() - t0)
