"""`lazyhippo mcp`: an MCP server over stdio (the official `mcp` SDK) for agents, on the same warm indexes as
the HTTP API. Tools: `lazyhippo_retrieve(query, limit, mode)` returns cited passages with scores and their
entities; `lazyhippo_answer(question, history)` a cited answer that sees the conversation so far;
`lazyhippo_namespaces()` lists the knowledge bases. Nothing but the protocol goes to stdout; each line from the
client is screened first (`screen`): a malformed request gets a JSON-RPC error reply and the session goes on."""

from __future__ import annotations

import json
import os
import re
from typing import Literal, Optional

import anyio
import mcp_types as types
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from lazyhippo.logs import configure_logging
from lazyhippo.query import ROUTES
from lazyhippo.serve.pool import IndexPool, UnknownNamespace
from lazyhippo.settings import Settings, environment

MAX_LIMIT = 50
MAX_QUERY_CHARS = 2000
MAX_HISTORY = 10
# the agent's task, besides the route names: how many passages it wants (the auto route picks the route)
TASK_MODES = {"execution": 5, "planning": 10, "brainstorming": 20}
Selection = Optional[Literal["graph", "vector", "weight"]]


def _checked_query(query: str) -> str:
    query = query.strip()
    if not query:
        raise ToolError("query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    return query


def build_server(pool: IndexPool) -> MCPServer:
    server = MCPServer("lazyhippo", instructions="Retrieve cited passages from lazyhippo knowledge graphs. Use mode "
                       "execution (5 passages), planning (10) or brainstorming (20) by task, or a route: multi_hop or "
                       "local for questions that chain facts across documents, global for themes.")

    def unknown_namespace(namespace: str) -> ToolError:
        return ToolError(f"unknown namespace {namespace!r} (known: {', '.join(pool.namespaces()) or 'none'})")

    @server.tool()
    def lazyhippo_retrieve(query: str, limit: Optional[int] = None, mode: str = "local", namespace: str = "default",
                           chunk_selection: Selection = None) -> dict:
        """Passages answering `query`, best first, each with its score, citation (title, source, chunk id) and the
        entities it mentions. Modes by task: execution (5 passages), planning (10), brainstorming (20), the route
        chosen from the question; or a route (8 passages): local (entity graph PPR), multi_hop (breadth-first hops
        from the named entities, then PPR), global (community summaries), drift (per sub-question), hybrid (dense +
        BM25 + graph fused). `limit` overrides the count; `chunk_selection` (graph | vector | weight) how the local
        routes pick passages."""
        query = _checked_query(query)
        if mode not in ROUTES and mode not in TASK_MODES:
            raise ToolError(f"unknown mode {mode!r} (expected one of {', '.join([*TASK_MODES, *ROUTES])})")
        route, count = ("auto", TASK_MODES[mode]) if mode in TASK_MODES else (mode, 8)
        limit = count if limit is None else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise ToolError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
        try:
            found = pool.retrieve(namespace, query, route=route, top_k=limit, with_entities=True,
                                  choices={"chunk_selection": chunk_selection} if chunk_selection else None)
        except UnknownNamespace:
            raise unknown_namespace(namespace)
        notice = pool.notice(namespace)
        return {"query": query, "mode": mode, "route": found.route, "namespace": namespace,
                "rerank": found.diagnostics["rerank"]["status"], **({"notice": notice} if notice else {}), "passages": [
            {"rank": i + 1, "score": round(c.score, 6), "title": c.title, "text": c.text, "chunk_id": c.chunk_id,
             "doc_id": c.doc_id, "source": c.source, "section": c.section, "page": c.page, "entities": entities}
            for i, (c, entities) in enumerate(zip(found.chunks, found.entities))]}

    @server.tool()
    def lazyhippo_answer(question: str, history: Optional[list[dict[str, str]]] = None, route: str = "auto",
                         namespace: str = "default", top_k: int = 8) -> dict:
        """A cited answer to `question` (the LLM's when the server has one, else extractive). `history`: the earlier
        turns of the conversation, oldest first, as {"role": "user" | "assistant", "content"}; the newest that fit
        the budget reach the LLM and make a follow-up question standalone."""
        question = _checked_query(question)
        history = history or []
        if len(history) > MAX_HISTORY:
            raise ToolError(f"history has {len(history)} turns; the limit is {MAX_HISTORY}")
        if not 1 <= top_k <= MAX_LIMIT:
            raise ToolError(f"top_k must be between 1 and {MAX_LIMIT}, got {top_k}")
        try:
            result = pool.answer(namespace, question, route=route, top_k=top_k, history=history)
        except UnknownNamespace:
            raise unknown_namespace(namespace)
        except ValueError as exc:  # a malformed turn, an unknown route
            raise ToolError(str(exc))
        return {"question": question, "answer": result.answer, "route": result.route, "citations": result.citations,
                "history_turns": len(result.history), "rerank": result.diagnostics["rerank"]["status"],
                "usage": result.usage, "tokens": result.tokens}

    @server.tool()
    def lazyhippo_namespaces() -> dict:
        """The knowledge bases (namespaces) that can be searched, with their passage counts when loaded."""
        warm = pool.status()
        return {"namespaces": [{"name": ns, "chunks": warm.get(ns, {}).get("chunks")} for ns in pool.namespaces()]}

    return server


MAX_DEPTH = 64
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602


def _problem(message) -> tuple[int, str] | None:
    """Why a parsed message cannot be handed on: nested too deeply, or text with an unpaired surrogate (from a
    JSON escape; nothing downstream can encode it). Iterative: a deep message cannot exhaust the stack."""
    stack = [(message, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return INVALID_REQUEST, f"invalid request: nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in (*value.keys(), *value.values()))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str) and _SURROGATE.search(value):
            return INVALID_PARAMS, "invalid params: text is not valid Unicode (an unpaired surrogate)"
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def screen(line: bytes) -> tuple[str | None, dict | None]:
    """One line from the client: (the line for the SDK, None), or (None, the JSON-RPC error reply to send; None
    for a notification, which never gets one). The SDK drops a line it cannot parse without a reply, and a
    message it cannot encode ends the session: such lines stop here."""
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, _error(None, PARSE_ERROR, "parse error: not one JSON text in UTF-8 (or nested too deeply)")
    ident = message.get("id") if isinstance(message, dict) else None
    if not isinstance(ident, (str, int)) or isinstance(ident, bool):
        ident = None
    problem = _problem(message)
    if problem is None:
        try:
            types.jsonrpc_message_adapter.validate_python(message, by_name=False)
            return line.decode("utf-8"), None
        except ValidationError:
            problem = INVALID_REQUEST, "invalid request: not a JSON-RPC 2.0 message"
    notification = isinstance(message, dict) and "method" in message and "id" not in message
    return None, None if notification else _error(ident, *problem)


def _error(ident, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


class ScreenedStdin:
    """The SDK's stdin: the lines `screen` lets through; the others are answered on the session's write stream
    (set once the transport is up), so the session goes on."""

    def __init__(self, source):
        self.source = source
        self.replies = None
        self.ready = anyio.Event()

    async def __aiter__(self):
        async for line in self.source:
            if not line.strip():
                continue
            text, reply = screen(line)
            if text is not None:
                yield text
            elif reply is not None:
                await self.ready.wait()
                await self.replies.send(SessionMessage(types.JSONRPCError.model_validate(reply)))


async def _serve_stdio(server: MCPServer) -> None:
    stdin = ScreenedStdin(anyio.wrap_file(os.fdopen(os.dup(0), "rb")))
    async with stdio_server(stdin=stdin) as (read_stream, write_stream):
        stdin.replies = write_stream
        stdin.ready.set()
        lowlevel = server._lowlevel_server  # (the SDK runs stdio this way, with no screened stdin to give it)
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def run_stdio(settings: Settings) -> None:
    configure_logging(environment().verbose)  # stderr is the client's log: warnings only, unless verbose
    pool = IndexPool(settings).start()
    try:
        anyio.run(_serve_stdio, build_server(pool))
    finally:
        pool.stop()
