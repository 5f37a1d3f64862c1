"""Bounds on HTTP connections, applied by the protocol before any request reaches the application (so before
the key check): request line and headers at most `max_header_bytes` and `max_headers` (431 beyond), headers
within `header_seconds` of the connection opening or of the request's first byte, a body within
`body_seconds` of its headers, an idle keep-alive connection closed after `idle_seconds`, and at most
`max_connections` open at once (503 beyond).

uvicorn's httptools protocol (its fastest) has no header limit and no read timeout: a 64 MB header was read
whole, and a silent connection stayed open. This subclass counts the bytes it hands to the parser while a
request's head is incomplete and never feeds more than the limit, and arms a timer per phase; uvicorn's own
`timeout_keep_alive` closes idle connections. (Its `limit_concurrency` answers 503 only once a request's headers
arrived: silent connections would still pile up, so the cap is checked here when a connection opens.)
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from lazyhippo.serve.limits import Limits


HEAD_LATE = "request line and headers not received within {:g} s"
LINGER_SECONDS = 1.0


class _Refused(Exception):
    """Raised in a parser callback to stop parsing; the status and message are kept on the protocol."""


class BoundedHttpProtocol(HttpToolsProtocol):
    limits: Limits = Limits()

    def connection_made(self, transport) -> None:
        over = len(self.connections) >= self.limits.max_connections
        self._head: int | None = 0        # bytes of the current request's head so far (None: head complete)
        self._headers = 0
        self._refusal: tuple[int, str] | None = None
        self._timer = None
        self._refused = False             # answered with an error: what still comes is read and dropped
        super().connection_made(transport)
        if over:
            self._refuse(503, f"over {self.limits.max_connections} open connections; retry later")
            return
        self._arm(self.limits.header_seconds, HEAD_LATE)  # a connection that never sends a request is closed too

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    # ------------------------------------------------------------ limits on the head

    def data_received(self, data: bytes) -> None:
        """Feed the parser at most one byte past the head limit while a head is incomplete."""
        if self._refused:
            return
        while data and not self.transport.is_closing() and not self._refused:
            if self._head is None:
                super().data_received(data)
                return
            room = self.limits.max_header_bytes + 1 - self._head
            piece, data = data[:room], data[room:]
            self._head += len(piece)
            super().data_received(piece)
            if self._head is not None and self._head > self.limits.max_header_bytes and not self._refused:
                self._refuse(431, f"request line and headers over {self.limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers = 0
        if self._timer is None:  # the first byte after a keep-alive response: the head has its own time
            self._arm(self.limits.header_seconds, HEAD_LATE)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        if self._headers > self.limits.max_headers:
            self._refusal = (431, f"over {self.limits.max_headers} request headers")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head = None
        self._disarm()
        self._arm(self.limits.body_seconds, "request body not received within {:g} s")
        if not self.url.startswith((b"/", b"*")):  # absolute form: its authority is the host (RFC 9112 3.2.2)
            authority = urlsplit(self.url.decode("latin-1")).netloc.encode("latin-1")
            self.headers[:] = [(k, v) for k, v in self.headers if k != b"host"] + [(b"host", authority)]
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._head = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._disarm()  # uvicorn arms its keep-alive timer next
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error, with the status a refused callback chose."""
        status, message = self._refusal or (400, "invalid HTTP request")
        self._refuse(status, message)

    # ------------------------------------------------------------ timers and refusals

    def _arm(self, seconds: float, message: str) -> None:
        self._timer = self.loop.call_later(seconds, self._expired, message.format(seconds))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, message: str) -> None:
        """A silent connection is closed; one that started a request gets a 408 when no response began."""
        self._timer = None
        if self.transport.is_closing() or self._refused:
            return
        cycle = self.cycle  # in a head: the previous request's; in a body: this one's
        answered = cycle is not None and (not cycle.response_complete if self._head is not None else cycle.response_started)
        if self._head != 0 and not answered:
            self._refuse(408, message)
        else:
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer and close. The close lingers a moment, reading and dropping what the client still sends:
        closing with unread data resets the connection, and the reset can destroy the answer in flight."""
        self._disarm()
        self._refused = True
        body = json.dumps({"error": message}).encode()
        self.transport.write(b"".join([STATUS_LINE[status], b"content-type: application/json\r\n",
                                       b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the application sees the client gone
            self.cycle.message_event.set()


def server_config(app, host: str, port: int, limits: Limits, **options) -> uvicorn.Config:
    """The uvicorn configuration of `lazyhippo serve` (and of the tests' servers): the bounded protocol."""
    protocol = type("BoundedHttpProtocol", (BoundedHttpProtocol,), {"limits": limits})
    return uvicorn.Config(app, host=host, port=port, http=protocol, timeout_keep_alive=limits.idle_seconds, **options)
