"""One set of query options on every surface: the engine's QueryOptions behind `lazyhippo query`, HTTP, MCP and
the Dagster query job's config; each option checked with an error naming it."""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp.client import Client
from typer.testing import CliRunner

from lazyhippo.query import QueryOptions, answer_question, load_index, retrieve
from lazyhippo.serve.mcp import build_server
from lazyhippo_dagster.cli import app
from tests.test_mcp import _payload
from tests.test_serve import SUCCESSOR_Q, home, pool, post, running  # noqa: F401 - fixtures

# options that move this question's context on the sample corpus, each on a route that reads it
MOVES = [("local", {"damping": 0.85}), ("local", {"multi_hop": 1}), ("local", {"lexical_weight": 2.0}),
         ("global", {"communities": 1})]


def context_ids(data: dict) -> list[str]:
    return [c["chunk_id"] for c in data["context"]]


def engine(settings, route: str, options: dict | None = None) -> list[str]:
    config = QueryOptions.from_mapping(options).config()
    return [c.chunk_id for c in answer_question(settings, SUCCESSOR_Q, route=route, llm=None, config=config).context]


def test_an_option_over_http_ranks_as_on_the_cli(pool, sample_settings, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    runner = CliRunner()
    with running(pool) as url:
        for route, options in MOVES:
            over_http = context_ids(post(f"{url}/api/query", json={"question": SUCCESSOR_Q, "route": route,
                                                                   **options}).json())
            flags = [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", str(v))]
            out = runner.invoke(app, ["query", SUCCESSOR_Q, "--route", route, "--json", "--home",
                                      str(sample_settings.home), *flags])
            assert out.exit_code == 0, out.output
            on_cli = context_ids(json.loads(out.stdout))
            assert over_http == on_cli == engine(sample_settings, route, options)
            assert over_http != engine(sample_settings, route), (route, options)  # the option did something
        fixed = post(f"{url}/api/kg/qa", json={"question": SUCCESSOR_Q, "communities": 1}).json()
        assert context_ids(fixed) == engine(sample_settings, "global", {"communities": 1})


@pytest.mark.parametrize("options, needle", [({"damping": 1.0}, "damping"), ({"communities": 0}, "communities"),
                                             ({"knn_threshold": 1.5}, "knn_threshold"), ({"hub_weight": -1}, "hub_weight"),
                                             ({"group_neighbours": "often"}, "group_neighbours"),
                                             ({"chunk_selection": "random"}, "chunk_selection"),
                                             ({"multi_hop": 4}, "multi_hop"), ({"lexical_weight": -1}, "lexical_weight"),
                                             ({"subquestions": "often"}, "subquestions")])
def test_a_bad_option_is_refused_naming_it(pool, options, needle):  # noqa: F811
    with pytest.raises(ValueError, match=f"query option {needle}"):
        QueryOptions.from_mapping(options)
    with running(pool) as url:
        r = post(f"{url}/api/query", json={"question": SUCCESSOR_Q, **options})
    assert r.status_code == 422 and needle in r.text


def test_cli_and_mcp_refuse_bad_options(pool, sample_settings):  # noqa: F811
    out = CliRunner().invoke(app, ["query", SUCCESSOR_Q, "--damping", "1.5", "--home", str(sample_settings.home)])
    assert out.exit_code == 2 and "query option damping 1.5" in out.output
    out = CliRunner().invoke(app, ["chat", "--communities", "0", "--home", str(sample_settings.home)], input="\n")
    assert out.exit_code == 2 and "query option communities 0" in out.output

    async def session():
        async with Client(build_server(pool)) as client:
            bad = await client.call_tool("lazyhippo_retrieve", {"query": SUCCESSOR_Q, "options": {"dampng": 0.6}})
            good = _payload(await client.call_tool("lazyhippo_retrieve", {"query": SUCCESSOR_Q, "mode": "local",
                                                                          "options": {"damping": 0.85}}))
            answer = _payload(await client.call_tool("lazyhippo_answer", {"question": SUCCESSOR_Q, "route": "global",
                                                                          "options": {"communities": 1}}))
            return bad, good, answer

    bad, good, answer = asyncio.run(session())
    assert bad.is_error and "unknown query option(s) dampng" in bad.content[0].text
    config = QueryOptions(damping=0.85).config()
    assert [p["chunk_id"] for p in good["passages"]] == [
        c.chunk_id for c in retrieve(sample_settings, SUCCESSOR_Q, route="local", top_k=8, config=config)]
    expected = answer_question(sample_settings, SUCCESSOR_Q, route="global", llm=None,
                               config=QueryOptions(communities=1).config())
    assert answer["citations"] == expected.to_dict()["citations"]


def test_another_knn_threshold_walks_another_graph_sharing_the_rest(pool, sample_settings):  # noqa: F811
    warm = pool.get("default")
    _, config, index = pool._chosen(warm, {"knn_threshold": 0.0})
    assert config.graph.synonym_min_score == 0.0 and index is not warm.index
    assert index.graph.edges > warm.index.graph.edges  # every KNN edge joins the walk
    assert index.chunks is warm.index.chunks and index.entities is warm.index.entities  # only the graph is new
    assert pool._chosen(warm, {"knn_threshold": 0.0})[2] is index  # built once
    assert pool._chosen(warm, None)[2] is warm.index
    assert load_index(sample_settings).graph.params.synonym_min_score == 0.90
