"""`lazyhippo mcp`: an MCP server over stdio (the official `mcp` SDK) for agents, on the same warm indexes as
the HTTP API. Tools: `lazyhippo_retrieve(query, limit, mode)` returns cited passages with scores and their
entities; `lazyhippo_answer(question, history)` a cited answer that sees the conversation so far;
`lazyhippo_namespaces()` lists the knowledge bases; `lazyhippo_entity(name)` shows one entity; `lazyhippo_delete`,
`lazyhippo_merge` (runs like the HTTP API's, followed with `lazyhippo_run`) and `lazyhippo_export` keep a knowledge
base current. Nothing but the protocol goes to stdout; each line from the client is screened first (`screen`): a
malformed request gets a JSON-RPC error reply and the session goes on."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Literal, Optional

import anyio
import mcp_types as types
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from lazyhippo.logs import configure_logging
from lazyhippo.query import ROUTES, QueryOptions
from lazyhippo.query.entity import lookup_entity
from lazyhippo.serve import operations
from lazyhippo.serve.pool import IndexPool, UnknownNamespace
from lazyhippo.serve.runs import IndexRuns, QueueFull
from lazyhippo.settings import Settings, environment

MAX_LIMIT = 50
MAX_QUERY_CHARS = 2000
MAX_HISTORY = 10
RUN_WAIT_SECONDS = 600  # how long delete and merge wait for their run before returning its status so far
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


def checked_options(options: dict | None) -> dict:
    try:
        return QueryOptions.from_mapping(options).chosen()
    except (TypeError, ValueError) as exc:
        raise ToolError(str(exc))


def build_server(pool: IndexPool, runs: IndexRuns | None = None) -> MCPServer:
    """The tools over `pool`; `runs` executes deletes and merges (default: a queue of its own)."""
    runs = runs or IndexRuns(pool)
    server = MCPServer("lazyhippo", instructions="Retrieve cited passages from lazyhippo knowledge graphs. Use mode "
                       "execution (5 passages), planning (10) or brainstorming (20) by task, or a route: local for "
                       "questions about particular things, global for themes.")

    def unknown_namespace(namespace: str) -> ToolError:
        return ToolError(f"unknown namespace {namespace!r} (known: {', '.join(pool.namespaces()) or 'none'})")

    @server.tool()
    def lazyhippo_retrieve(query: str, limit: Optional[int] = None, mode: str = "local", namespace: str = "default",
                           chunk_selection: Selection = None, options: Optional[dict[str, Any]] = None) -> dict:
        """Passages answering `query`, best first, each with its score, citation (title, source, chunk id) and the
        entities it mentions. Modes by task: execution (5 passages), planning (10), brainstorming (20), the route
        chosen from the question; or a route (8 passages): local (entity graph PPR fused with BM25), global
        (community summaries). `limit` overrides the count; `chunk_selection` (graph | vector | weight) how the local
        route picks passages. `options`: further query options by name (rerank, rerank_top_n, max_related_chunks,
        group_neighbours, damping, communities, knn_threshold, hub_weight, lexical_weight, multi_hop, subquestions;
        docs/query-routes.md)."""
        query = _checked_query(query)
        choices = checked_options({**(options or {}),
                                   **({"chunk_selection": chunk_selection} if chunk_selection else {})})
        if mode not in ROUTES and mode not in TASK_MODES:
            raise ToolError(f"unknown mode {mode!r} (expected one of {', '.join([*TASK_MODES, *ROUTES])})")
        route, count = ("auto", TASK_MODES[mode]) if mode in TASK_MODES else (mode, 8)
        limit = count if limit is None else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise ToolError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
        try:
            found = pool.retrieve(namespace, query, route=route, top_k=limit, with_entities=True, with_support=True,
                                  choices=choices)
        except UnknownNamespace:
            raise unknown_namespace(namespace)
        notice = pool.notice(namespace)
        return {"query": query, "mode": mode, "route": found.route, "namespace": namespace,
                "answerable": found.answerable, "rerank": found.diagnostics["rerank"]["status"],
                **({"notice": notice} if notice else {}), "passages": [
            {"rank": i + 1, "score": round(c.score, 6), "title": c.title, "text": c.text, "chunk_id": c.chunk_id,
             "doc_id": c.doc_id, "source": c.source, "section": c.section, "page": c.page, "entities": entities}
            for i, (c, entities) in enumerate(zip(found.chunks, found.entities))]}

    @server.tool()
    def lazyhippo_answer(question: str, history: Optional[list[dict[str, str]]] = None, route: str = "auto",
                         namespace: str = "default", top_k: int = 8, options: Optional[dict[str, Any]] = None) -> dict:
        """A cited answer to `question` (the LLM's when the server has one, else extractive). `history`: the earlier
        turns of the conversation, oldest first, as {"role": "user" | "assistant", "content"}; the newest that fit
        the budget reach the LLM and make a follow-up question standalone. `options`: query options by name, as
        for lazyhippo_retrieve."""
        question = _checked_query(question)
        choices = checked_options(options)
        history = history or []
        if len(history) > MAX_HISTORY:
            raise ToolError(f"history has {len(history)} turns; the limit is {MAX_HISTORY}")
        if not 1 <= top_k <= MAX_LIMIT:
            raise ToolError(f"top_k must be between 1 and {MAX_LIMIT}, got {top_k}")
        try:
            result = pool.answer(namespace, question, route=route, top_k=top_k, history=history, choices=choices)
        except UnknownNamespace:
            raise unknown_namespace(namespace)
        except ValueError as exc:  # a malformed turn, an unknown route
            raise ToolError(str(exc))
        return {"question": question, "answer": result.answer, "answerable": result.answerable,
                "route": result.route, "citations": result.citations, "closest": result.closest,
                "history_turns": len(result.history), "rerank": result.diagnostics["rerank"]["status"],
                "usage": result.usage, "tokens": result.tokens}

    def indexed(namespace: str):
        if namespace not in pool.namespaces():
            raise unknown_namespace(namespace)
        return pool.settings.with_(namespace=namespace)

    def queued(namespace: str, command: tuple[str, ...], wait: bool) -> dict:
        try:
            run = runs.submit(None, namespace, None, command=command)
        except QueueFull as exc:
            raise ToolError(str(exc))
        return runs.wait(run, RUN_WAIT_SECONDS) if wait else runs.status(run)

    @server.tool()
    def lazyhippo_delete(documents: list[str], namespace: str = "default", wait: bool = True) -> dict:
        """Remove documents (doc_id or source path, as the passages' `doc_id` and `source` give them) and rebuild
        the graph without them. With `wait` (default) it returns once the run ended (status SUCCESS, FAILURE);
        otherwise at once, with the run id for `lazyhippo_run`."""
        try:
            command = operations.delete_command(indexed(namespace), documents)
        except ValueError as exc:
            raise ToolError(str(exc))
        return queued(namespace, command, wait)

    @server.tool()
    def lazyhippo_merge(sources: list[str], into: str, strategy: str = "concatenate", namespace: str = "default",
                        wait: bool = True) -> dict:
        """Fold entities (names or ids) into `into`, which is created when no entity has that name; kept across
        reindexing. `strategy` sets the target's description: concatenate, keep_first, keep_longest, or
        llm_summary (needs the server's LLM). `wait` as for lazyhippo_delete."""
        try:
            command = operations.merge_command(indexed(namespace), sources, into, strategy)
        except ValueError as exc:
            raise ToolError(str(exc))
        return queued(namespace, command, wait)

    @server.tool()
    def lazyhippo_run(run_id: str) -> dict:
        """A delete or merge run, as the home's Dagster instance records it: status (QUEUED, STARTED, SUCCESS once
        its index is served, FAILURE with the error, CANCELED), tags, documents removed."""
        run = runs.get(run_id)
        if run is None:
            raise ToolError(f"no run {run_id!r}")
        return runs.status(run)

    @server.tool()
    def lazyhippo_export(namespace: str = "default", format: str = "csv", tables: Optional[list[str]] = None,
                         include_vectors: bool = False) -> dict:
        """Write tables of a knowledge base (default: entities, relations, chunks) as csv, xlsx, md or parquet files
        into a new folder under the server's home (`exports/<namespace>/<time>`); returns each file and its rows."""
        settings = indexed(namespace)
        folder = operations.export_folder(settings)
        try:
            done = operations.export_files(settings, format, tables, include_vectors, folder)
        except ValueError as exc:
            raise ToolError(str(exc))
        return {"namespace": namespace, "folder": str(folder),
                "files": [{"table": e.table, "rows": e.rows, "path": str(e.path)} for e in done]}

    @server.tool()
    def lazyhippo_entity(name: str, namespace: str = "default", neighbours: int = 20, chunks: int = 10) -> dict:
        """One entity: description, type, PageRank, communities (finest level first), neighbours with their
        relation descriptions and weights, and the passages that mention it with citations. `match`: exact,
        fuzzy (one clear candidate), ambiguous (no entity; choose among `candidates`) or none."""
        if not 0 <= neighbours <= 200 or not 0 <= chunks <= 100:
            raise ToolError("neighbours must be 0-200 and chunks 0-100")
        if len(name) > 500:  # (text that is not valid Unicode never reaches a tool: see `screen`)
            raise ToolError("name must be at most 500 characters")
        try:
            return lookup_entity(indexed(namespace), name, neighbours, chunks).to_dict()
        except ValueError as exc:
            raise ToolError(str(exc))

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
    runs = IndexRuns(pool)
    try:
        anyio.run(_serve_stdio, build_server(pool, runs))
    finally:
        runs.stop()
        pool.stop()
