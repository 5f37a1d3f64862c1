"""`lazyhippo mcp`: an MCP server over stdio (the official `mcp` SDK) for agents, on the same warm indexes as
the HTTP API. Tools: `lazyhippo_retrieve(query, limit, mode)` returns cited passages with scores;
`lazyhippo_namespaces()` lists the knowledge bases. Nothing but the protocol goes to stdout."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from lazyhippo.query import ROUTES
from lazyhippo.serve.pool import IndexPool, UnknownNamespace
from lazyhippo.settings import Settings

MAX_LIMIT = 50
MAX_QUERY_CHARS = 2000


def build_server(pool: IndexPool) -> MCPServer:
    server = MCPServer("lazyhippo", instructions="Retrieve cited passages from lazyhippo knowledge graphs. Use mode "
                       "multi_hop or local for questions that chain facts across documents, global for themes.")

    @server.tool()
    def lazyhippo_retrieve(query: str, limit: int = 8, mode: str = "local", namespace: str = "default") -> dict:
        """Passages answering `query`, best first, each with its score and citation (title, source, chunk id).
        Modes: local (entity graph PPR), multi_hop (breadth-first hops from the named entities, then PPR),
        global (community summaries), drift (per sub-question), hybrid (dense + BM25 + graph fused)."""
        query = query.strip()
        if not query:
            raise ToolError("query is empty")
        if REPLACED in query:  # see `_valid_text_stdin`
            raise ToolError("query holds text that is not valid Unicode (an unpaired surrogate or bytes that are "
                            "not UTF-8)")
        if len(query) > MAX_QUERY_CHARS:
            raise ToolError(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
        if not 1 <= limit <= MAX_LIMIT:
            raise ToolError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
        if mode not in ROUTES:
            raise ToolError(f"unknown mode {mode!r} (expected one of {', '.join(ROUTES)})")
        try:
            chunks = pool.retrieve(namespace, query, route=mode, top_k=limit)
        except UnknownNamespace:
            raise ToolError(f"unknown namespace {namespace!r} (known: {', '.join(pool.namespaces()) or 'none'})")
        notice = pool.notice(namespace)
        return {"query": query, "mode": mode, "namespace": namespace, **({"notice": notice} if notice else {}), "passages": [
            {"rank": i + 1, "score": round(c.score, 6), "title": c.title, "text": c.text, "chunk_id": c.chunk_id,
             "doc_id": c.doc_id, "source": c.source, "section": c.section, "page": c.page}
            for i, c in enumerate(chunks)]}

    @server.tool()
    def lazyhippo_namespaces() -> dict:
        """The knowledge bases (namespaces) that can be searched, with their passage counts when loaded."""
        warm = pool.status()
        return {"namespaces": [{"name": ns, "chunks": warm.get(ns, {}).get("chunks")} for ns in pool.namespaces()]}

    return server


REPLACED = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(line: bytes) -> bytes:
    """The JSON-RPC message with each unpaired surrogate escape (`"\\ud800"`) turned into U+FFFD: the SDK's
    parser rejects such a message whole, and the request it carried was never answered."""
    if b"\\ud" not in line.lower():
        return line
    try:
        message = json.loads(line)
    except ValueError:
        return line  # the SDK reports what is wrong with it

    def clean(value):
        if isinstance(value, str):
            return _SURROGATE.sub(REPLACED, value)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        return value

    return json.dumps(clean(message)).encode() + b"\n"


def _valid_text_stdin() -> None:
    """Put a pipe fed with `_valid_text` lines by a thread in place of stdin (the SDK then reads fd 0 as usual)."""
    source = os.fdopen(os.dup(0), "rb")
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    os.close(read_end)

    def pump() -> None:
        with source, os.fdopen(write_end, "wb", buffering=0) as sink:
            for line in source:
                sink.write(_valid_text(line))

    threading.Thread(target=pump, name="lazyhippo-mcp-stdin", daemon=True).start()


def run_stdio(settings: Settings) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    pool = IndexPool(settings).start()
    _valid_text_stdin()
    try:
        build_server(pool).run("stdio")
    finally:
        pool.stop()
