"""What the servers accept: size limits of requests and the checks of free text, shared by the HTTP API and MCP."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * 1024
    max_upload_bytes: int = 50 * 1024 * 1024
    max_question_chars: int = 2000
    max_budget: int = 32000
    max_top_k: int = 50
    max_history: int = 10
    max_pending_runs: int = 4        # index runs waiting for their turn; more are refused (429)
    query_seconds: float = 120.0     # longest an engine may take over one query before it is replaced
    # connections (lazyhippo.serve.connections), enforced before a request reaches the key check
    max_header_bytes: int = 16 * 1024  # request line and headers together
    max_headers: int = 100
    header_seconds: float = 10.0     # to send the request line and headers
    body_seconds: float = 60.0       # to send the body, once the headers are in
    idle_seconds: float = 5.0        # a keep-alive connection without a new request is closed
    max_connections: int = 256       # open at once; more are answered 503 and closed


def text_problem(name: str, value: str) -> str | None:
    """Why `value` cannot be processed as text (a lone surrogate from a JSON escape cannot be encoded), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{name} is not valid Unicode text (unpaired surrogate at character {exc.start})"
    return None
