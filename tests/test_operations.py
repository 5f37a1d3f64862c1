"""Delete, merge and export over HTTP and MCP: write keys scoped to the namespace, the checks before a run is
queued, and the runs themselves (the CLI's commands, so the Dagster `rebuild_graph` job)."""

from __future__ import annotations

import asyncio
import csv
import io
import zipfile

import pytest
from mcp.client import Client

from lazyhippo.serve.app import Access
from lazyhippo.serve.mcp import build_server
from lazyhippo.serve.middleware import Grant
from tests.test_mcp import _payload
from tests.test_serve import READ_KEY, TOKEN, WRITE_KEY, home, pool, post, running, wait_run  # noqa: F401 - fixtures

SCOPED_KEY = "scoped-write-key-0123456789"


def rows(archive: bytes, table: str) -> list[dict]:
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return list(csv.DictReader(io.StringIO(z.read(f"{table}.csv").decode())))


def test_writes_need_a_write_key_for_the_namespace(pool):  # noqa: F811
    access = Access(((WRITE_KEY, Grant(True)), (READ_KEY, Grant(False)), (SCOPED_KEY, Grant(True, frozenset({"other"})))))
    calls = {"/api/kg/delete": {"documents": ["visitor_form.txt"]},
             "/api/kg/merge": {"sources": ["Reyes"], "into": "Tomas Reyes"},
             "/api/kg/export": {"tables": ["entities"]}}
    with running(pool, access) as url:
        for path, body in calls.items():
            assert post(url + path, json=body).status_code == 401
            r = post(url + path, json=body, headers={"X-API-Key": READ_KEY})
            assert r.status_code == 403 and r.json() == {"error": "this key may only query"}
            r = post(url + path, json=body, headers={"X-API-Key": SCOPED_KEY})
            assert r.status_code == 403 and "namespace 'default'" in r.json()["error"]
        r = post(f"{url}/api/kg/export", json={"tables": ["entities"]}, headers={"X-API-Key": WRITE_KEY})
        assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
        assert "Tomas Reyes" in {row["name"] for row in rows(r.content, "entities")}


@pytest.mark.parametrize("path, body, status, needle", [
    ("/api/kg/delete", {"documents": ["nowhere.txt"]}, 400, "holds no document 'nowhere.txt'"),
    ("/api/kg/delete", {"documents": []}, 400, "documents is empty"),
    ("/api/kg/delete", {"documents": ["visitor_form.txt"], "namespace": "nope"}, 404, "unknown namespace 'nope'"),
    ("/api/kg/delete", {"documents": ["x"], "namespace": "../x"}, 400, "namespace"),
    ("/api/kg/merge", {"sources": ["Nobody Atall"], "into": "Ada Fenwick"}, 400, "no entity 'Nobody Atall'"),
    ("/api/kg/merge", {"sources": ["Reyes"], "into": "Tomas Reyes", "strategy": "biggest"}, 422, "strategy"),
    ("/api/kg/merge", {"sources": ["Reyes"], "into": "Tomas Reyes", "strategy": "llm_summary"}, 400, "needs an LLM"),
    ("/api/kg/merge", {"sources": ["Reyes"], "into": "  "}, 400, "into is empty"),
    ("/api/kg/delete", {"documents": ["visitor_form.txt\u0000"]}, 400, "NUL character"),
    ("/api/kg/export", {"format": "docx"}, 422, "format"),
    ("/api/kg/export", {"tables": ["secrets"]}, 422, "tables"),
    ("/api/kg/export", {"tables": []}, 400, "--tables (empty)"),
])
def test_bad_requests_are_refused_before_a_run(pool, monkeypatch, path, body, status, needle):  # noqa: F811
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with running(pool) as url:
        r = post(url + path, json=body, headers={"X-Lazyhippo-Token": TOKEN})
    assert r.status_code == status and needle in r.text, r.text
    assert pool.settings.llm == "none"


def test_delete_and_merge_run_over_http_and_the_served_index_changes(pool, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    token = {"X-Lazyhippo-Token": TOKEN}
    with running(pool) as url:
        r = post(f"{url}/api/kg/delete", json={"documents": ["visitor_form.txt"]}, headers=token)
        assert r.status_code == 202 and r.json()["operation"] == "delete" and r.json()["status"] == "QUEUED"
        status = wait_run(url, r.json()["run_id"])
        assert status["status"] == "SUCCESS", status
        assert status["documents"] == {"added": 0, "changed": 0, "removed": 1, "failed": 0}
        r = post(f"{url}/api/kg/merge", json={"sources": ["Tomas Reyes", "Reyes"], "into": "Director Reyes"},
                 headers=token)
        assert r.status_code == 202 and r.json()["operation"] == "merge"
        assert wait_run(url, r.json()["run_id"])["status"] == "SUCCESS"
        exported = post(f"{url}/api/kg/export", json={"tables": ["documents", "entities"]}, headers=token)
    assert "visitor_form.txt" not in {row["source"] for row in rows(exported.content, "documents")}
    names = {row["name"] for row in rows(exported.content, "entities")}
    assert "Director Reyes" in names and not names & {"Tomas Reyes", "Reyes"}


def test_mcp_merge_delete_and_export(pool, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))

    async def session() -> dict:
        out = {}
        async with Client(build_server(pool)) as client:
            out["tools"] = {t.name for t in (await client.list_tools()).tools}
            out["unknown"] = await client.call_tool("lazyhippo_delete", {"documents": ["nowhere.txt"]})
            out["no_llm"] = await client.call_tool("lazyhippo_merge", {"sources": ["Reyes"], "into": "Tomas Reyes",
                                                                       "strategy": "llm_summary"})
            out["bad_ns"] = await client.call_tool("lazyhippo_export", {"namespace": "nope"})
            out["merge"] = _payload(await client.call_tool("lazyhippo_merge", {"sources": ["Reyes"], "into": "Tomas Reyes"}))
            out["delete"] = _payload(await client.call_tool("lazyhippo_delete", {"documents": ["visitor_form.txt"],
                                                                                 "wait": False}))
            while out["delete"]["status"] not in ("SUCCESS", "FAILURE", "CANCELED"):
                await asyncio.sleep(0.5)
                out["delete"] = _payload(await client.call_tool("lazyhippo_run", {"run_id": out["delete"]["run_id"]}))
            out["export"] = _payload(await client.call_tool("lazyhippo_export", {"tables": ["entities", "documents"],
                                                                                 "format": "md"}))
        return out

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    out = asyncio.run(session())
    assert {"lazyhippo_delete", "lazyhippo_merge", "lazyhippo_run", "lazyhippo_export"} <= out["tools"]
    for key, needle in (("unknown", "'nowhere.txt'"), ("no_llm", "needs an LLM"), ("bad_ns", "unknown namespace 'nope'")):
        assert out[key].is_error and needle in out[key].content[0].text
    assert out["merge"]["status"] == "SUCCESS" and out["merge"]["operation"] == "merge", out["merge"]
    assert out["delete"]["status"] == "SUCCESS" and out["delete"]["documents"]["removed"] == 1, out["delete"]
    files = {f["table"]: f for f in out["export"]["files"]}
    assert out["export"]["folder"].startswith(str(pool.settings.home / "exports" / "default"))
    entities = open(files["entities"]["path"]).read()
    assert "| Tomas Reyes |" in entities and "| Reyes |" not in entities
    assert "visitor_form.txt" not in open(files["documents"]["path"]).read() and files["documents"]["rows"] == 7
