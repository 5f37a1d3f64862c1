"""Looking at one entity from the engine, the CLI, HTTP and MCP: the same view, loose names resolved or listed."""

from __future__ import annotations

import asyncio
import json

from mcp.client import Client
from typer.testing import CliRunner

from lazyhippo.query.entity import lookup_entity
from lazyhippo.serve.mcp import build_server
from lazyhippo_dagster.cli import app
from tests.test_mcp import _payload
from tests.test_serve import READ_KEY, WRITE_KEY, get, home, keyed, pool, running  # noqa: F401 - fixtures


def test_the_view_holds_description_communities_neighbours_and_cited_passages(sample_settings):
    found = lookup_entity(sample_settings, "Tomas Reyes")
    e = found.entity
    assert found.match == "exact" and e.name == "Tomas Reyes" and e.type and "instrument maker" in e.description
    assert e.pagerank > 0 and e.mentions >= 3
    assert [c["level"] for c in e.communities] == [2, 1, 0]  # finest first, up to the coarsest level
    assert all(c["title"] for c in e.communities)
    ada = next(n for n in e.neighbours if n["name"] == "Ada Fenwick")
    assert ada["relation"] == "related" and "succeeded her as director" in ada["description"] and ada["weight"] > 0
    assert e.chunks[0]["source"] == "tomas_reyes.txt" and e.chunks[0]["title"] == "Tomas Reyes"
    assert all(c["chunk_id"] and "Reyes" in c["text"] for c in e.chunks)


def test_loose_names_are_resolved_when_clear_and_listed_when_not(sample_settings):
    fuzzy = lookup_entity(sample_settings, "thomas reyes")
    assert fuzzy.match == "fuzzy" and fuzzy.entity.name == "Tomas Reyes"
    assert lookup_entity(sample_settings, "Mount Kell").entity.name == "Mount Keel"
    ambiguous = lookup_entity(sample_settings, "Corran")
    assert ambiguous.match == "ambiguous" and ambiguous.entity is None
    assert {"Corran Shipping Company", "Margaret Corran"} <= {c.name for c in ambiguous.candidates}
    assert lookup_entity(sample_settings, "Zyxwv Qpon").match == "none"
    by_id = lookup_entity(sample_settings, lookup_entity(sample_settings, "Ada Fenwick").entity.entity_id)
    assert by_id.match == "exact" and by_id.entity.name == "Ada Fenwick"


def test_cli_entity(sample_settings):
    runner, home_ = CliRunner(), str(sample_settings.home)
    out = runner.invoke(app, ["entity", "thomas reyes", "--home", home_])
    assert out.exit_code == 0 and "Tomas Reyes" in out.stdout and "succeeded her" in out.stdout
    data = json.loads(runner.invoke(app, ["entity", "Tomas Reyes", "--home", home_, "--json"]).stdout)
    assert data == lookup_entity(sample_settings, "Tomas Reyes").to_dict()
    listed = runner.invoke(app, ["entity", "Corran", "--home", home_])
    assert listed.exit_code == 0 and "Margaret Corran" in listed.stdout and "could be any of" in listed.stdout
    missing = runner.invoke(app, ["entity", "Zyxwv Qpon", "--home", home_])
    assert missing.exit_code == 1 and "no entity like 'Zyxwv Qpon'" in missing.output


def test_http_entity_for_any_key_of_the_namespace(pool):  # noqa: F811
    with running(pool, keyed(read_scope=frozenset({"default"}))) as url:
        assert get(f"{url}/api/kg/entity", params={"name": "Tomas Reyes"}).status_code == 401
        r = get(f"{url}/api/kg/entity", params={"name": "thomas reyes"}, headers={"X-API-Key": READ_KEY})
        assert r.status_code == 200 and r.json()["match"] == "fuzzy"
        assert r.json() == lookup_entity(pool.settings, "thomas reyes").to_dict()
        r = get(f"{url}/api/kg/entity", params={"name": "Corran"}, headers={"X-API-Key": WRITE_KEY})
        assert r.json()["match"] == "ambiguous" and len(r.json()["candidates"]) >= 3
        r = get(f"{url}/api/kg/entity", params={"name": "Zyxwv Qpon"}, headers={"X-API-Key": READ_KEY})
        assert r.status_code == 404 and r.json() == {"error": "no entity like 'Zyxwv Qpon' in namespace 'default'"}
        r = get(f"{url}/api/kg/entity", params={"name": "Ada", "namespace": "other"}, headers={"X-API-Key": READ_KEY})
        assert r.status_code == 403
        r = get(f"{url}/api/kg/entity", params={"name": "Ada", "namespace": "other"}, headers={"X-API-Key": WRITE_KEY})
        assert r.status_code == 404 and "unknown namespace 'other'" in r.text
        assert get(f"{url}/api/kg/entity", params={"name": ""}, headers={"X-API-Key": READ_KEY}).status_code == 422


def test_mcp_entity(pool):  # noqa: F811
    async def session():
        async with Client(build_server(pool)) as client:
            return (_payload(await client.call_tool("lazyhippo_entity", {"name": "Ada Fenwick", "chunks": 2})),
                    await client.call_tool("lazyhippo_entity", {"name": "Ada", "namespace": "nope"}))

    found, bad = asyncio.run(session())
    assert found == lookup_entity(pool.settings, "Ada Fenwick", chunks=2).to_dict() and len(found["entity"]["chunks"]) == 2
    assert bad.is_error and "unknown namespace 'nope'" in bad.content[0].text
