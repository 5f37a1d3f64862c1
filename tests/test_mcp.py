"""`lazyhippo mcp` driven by the official MCP SDK's own client over stdio (a real subprocess)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from lazyhippo.query import QueryOptions, retrieve

REPO = Path(__file__).resolve().parent.parent
SUCCESSOR_Q = "Who succeeded the founder of the Marlow Observatory as its director?"


def _payload(result) -> dict:
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def _session(home: Path, dagster_home: Path) -> dict:
    params = StdioServerParameters(command=sys.executable, args=["-c", "from lazyhippo_dagster.cli import app; app()", "mcp",
                                                                 "--home", str(home)],
                                   env={"PYTHONPATH": str(REPO), "DAGSTER_HOME": str(dagster_home),
                                        "HOME": os.environ.get("HOME", "/root")}, cwd=str(REPO))
    out: dict = {}
    async with Client(params, read_timeout_seconds=120) as client:
        out["tools"] = {t.name: t for t in (await client.list_tools()).tools}
        out["namespaces"] = _payload(await client.call_tool("lazyhippo_namespaces", {}))
        for mode in ("local", "global"):
            out[mode] = _payload(await client.call_tool("lazyhippo_retrieve", {"query": SUCCESSOR_Q, "limit": 8, "mode": mode}))
        out["multi_hop"] = _payload(await client.call_tool("lazyhippo_retrieve", {
            "query": SUCCESSOR_Q, "limit": 8, "mode": "local", "options": {"multi_hop": 1}}))
        out["old_route"] = await client.call_tool("lazyhippo_retrieve", {"query": SUCCESSOR_Q, "mode": "multi_hop"})
        out["bad_mode"] = await client.call_tool("lazyhippo_retrieve", {"query": SUCCESSOR_Q, "mode": "fastest"})
        out["bad_ns"] = await client.call_tool("lazyhippo_retrieve", {"query": SUCCESSOR_Q, "namespace": "nowhere"})
        out["empty"] = await client.call_tool("lazyhippo_retrieve", {"query": "  "})
    return out


def test_mcp_tools_over_stdio_with_the_sdk_client(sample_settings, tmp_path):
    out = asyncio.run(_session(Path(sample_settings.home), tmp_path / "dagster"))
    assert {"lazyhippo_retrieve", "lazyhippo_namespaces"} <= set(out["tools"])
    schema = out["tools"]["lazyhippo_retrieve"].input_schema
    assert {"query", "limit", "mode"} <= set(schema["properties"])
    assert out["namespaces"]["namespaces"][0]["name"] == "default" and out["namespaces"]["namespaces"][0]["chunks"] > 0
    for mode in ("local", "global", "multi_hop"):
        passages = out[mode]["passages"]
        assert 0 < len(passages) <= 8 and out[mode]["mode"] == ("local" if mode == "multi_hop" else mode)
        assert all(p["title"] and p["chunk_id"] and p["source"] and p["text"] for p in passages)
        scores = [p["score"] for p in passages]
        assert scores == sorted(scores, reverse=True)
    for mode, options in (("local", QueryOptions()), ("multi_hop", QueryOptions(multi_hop=1))):  # the engine's, served
        engine = retrieve(sample_settings, SUCCESSOR_Q, route="local", top_k=8, config=options.config())
        assert [p["chunk_id"] for p in out[mode]["passages"]] == [c.chunk_id for c in engine]
    assert out["multi_hop"]["passages"] != out["local"]["passages"]
    for key, needle in (("bad_mode", "fastest"), ("bad_ns", "unknown namespace 'nowhere'"), ("empty", "query is empty"),
                        ("old_route", "unknown mode 'multi_hop'")):
        assert out[key].is_error and needle in out[key].content[0].text


def test_task_modes_give_5_10_20_passages_each_with_its_entities(sample_settings):
    from lazyhippo.query import load_index
    from lazyhippo.serve.mcp import TASK_MODES, build_server
    from lazyhippo.serve.pool import IndexPool

    async def call(pool, **args) -> dict:
        async with Client(build_server(pool)) as client:
            return _payload(await client.call_tool("lazyhippo_retrieve", {"query": SUCCESSOR_Q, **args}))

    pool = IndexPool(sample_settings).start()
    try:
        out = {mode: asyncio.run(call(pool, mode=mode)) for mode in ("execution", "planning", "brainstorming", "local")}
        limited = asyncio.run(call(pool, mode="planning", limit=2))
    finally:
        pool.stop()
    assert TASK_MODES == {"execution": 5, "planning": 10, "brainstorming": 20}
    idx = load_index(sample_settings)
    for mode, count in TASK_MODES.items():
        engine = retrieve(sample_settings, SUCCESSOR_Q, route="auto", top_k=count)  # the route picked by the question
        assert out[mode]["mode"] == mode and out[mode]["route"] == "local"
        assert [p["chunk_id"] for p in out[mode]["passages"]] == [c.chunk_id for c in engine]
    assert len(out["execution"]["passages"]) == 5 and len(out["planning"]["passages"]) == 10
    assert len(out["brainstorming"]["passages"]) == len(retrieve(sample_settings, SUCCESSOR_Q, top_k=20)) > 10
    assert len(out["local"]["passages"]) == 8 and len(limited["passages"]) == 2
    for p in out["brainstorming"]["passages"]:  # the entities the passage mentions, most mentioned first
        row = idx.mentions.counts[idx.chunks.pos[p["chunk_id"]]]
        names = {idx.entities.names[e] for e in row.indices}
        assert p["entities"] and set(p["entities"]) <= names and len(p["entities"]) == min(10, len(names))
        counts = {idx.entities.names[e]: n for e, n in zip(row.indices, row.data)}
        assert [counts[n] for n in p["entities"]] == sorted((counts[n] for n in p["entities"]), reverse=True)
    assert "Tomas Reyes" in {e for p in out["execution"]["passages"] for e in p["entities"]}
