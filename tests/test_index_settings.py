"""The community levels and structural KNN settings on every surface: LAZYHIPPO_* variables, the Dagster
resource, CLI options, the HTTP API; and structural KNN (FastRP) on Neo4j + GDS."""

from __future__ import annotations

import numpy as np
import pytest

from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.graphs import EmbeddedGraphStore
from tests.services_fixtures import namespaces, neo4j_store  # noqa: F401 - fixtures


def test_environment_sets_levels_and_structural_knn(monkeypatch):
    monkeypatch.setenv("LAZYHIPPO_COMMUNITY_RESOLUTIONS", "0.3,1.2")
    monkeypatch.setenv("LAZYHIPPO_GRAPH_STORE", "neo4j")
    monkeypatch.setenv("LAZYHIPPO_KNN_STRUCTURAL", "concat")
    monkeypatch.setenv("LAZYHIPPO_COMMUNITY_ALGORITHM", "louvain")
    s = Settings.from_env()
    assert s.community_resolutions == (0.3, 1.2) and s.knn_structural == "concat" and s.community_algorithm == "louvain"
    assert Settings().community_resolutions == (0.25, 0.5, 1.0) and Settings().knn_structural == "off"
    monkeypatch.setenv("LAZYHIPPO_KNN_STRUCTURAL", "sideways")
    with pytest.raises(ValueError, match="knn_structural 'sideways'"):
        Settings.from_env()
    store = EmbeddedGraphStore()  # the store a run opens says what it cannot do
    with pytest.raises(ValueError, match="needs graph_store 'neo4j'"):
        store.knn("ns", ["a", "b"], np.eye(2, dtype=np.float32), 1, 0.0, "replace")


def test_resource_config_reaches_the_settings(monkeypatch):
    from lazyhippo_dagster.resources import LazyhippoResource

    for var in ("LAZYHIPPO_COMMUNITY_RESOLUTIONS", "LAZYHIPPO_KNN_STRUCTURAL", "LAZYHIPPO_GRAPH_STORE"):
        monkeypatch.delenv(var, raising=False)
    s = LazyhippoResource(community_resolutions=[0.5, 1.0]).settings()
    assert s.community_resolutions == (0.5, 1.0) and s.knn_structural == "off"


@pytest.mark.parametrize("recorded,expected", [(True, "parser"), (False, "none"), ("tags", "tags")])
def test_a_namespace_recorded_with_noun_phrases_on_or_off_resolves_to_their_source(tmp_path, recorded, expected):
    """A namespace indexed when noun phrases were on or off (a boolean) keeps indexing as it did: on was the
    parser's phrases; an unknown source is an error naming the setting."""
    import json

    from lazyhippo.stores.namespaces import record_namespace, resolve_settings

    record_namespace(Settings(home=tmp_path))
    path = next((tmp_path / "namespaces").glob("*.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "nlp_noun_phrases": recorded}))
    assert resolve_settings(tmp_path, None).nlp_noun_phrases == expected
    with pytest.raises(ValueError, match="nlp_noun_phrases 'chunks'"):
        Settings(nlp_noun_phrases="chunks")


def test_cli_options_are_checked_before_a_run(tmp_path):
    from lazyhippo_dagster.options import OptionError, check_index_options, resolutions_list

    common = dict(chunk_size=None, chunk_overlap=None, knn_top_k=None, knn_cutoff=None, community_algorithm=None,
                  object_store=None, extractor=None)
    with pytest.raises(OptionError, match="--community-resolutions"):
        check_index_options(SAMPLE_CORPUS, "default", graph_store=None, community_resolutions="1.0,0.5", **common)
    with pytest.raises(OptionError, match="--knn-structural concat needs --graph-store neo4j"):
        check_index_options(SAMPLE_CORPUS, "default", graph_store="embedded", knn_structural="concat", **common)
    with pytest.raises(OptionError, match="--knn-structural"):
        check_index_options(SAMPLE_CORPUS, "default", graph_store="neo4j", knn_structural="both", **common)
    check_index_options(SAMPLE_CORPUS, "default", graph_store="neo4j", knn_structural="replace",
                        community_resolutions="0.5,1", **common)
    assert resolutions_list("0.5, 1") == [0.5, 1.0] and resolutions_list(None) is None


def test_cli_index_takes_the_options(tmp_path):
    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app

    out = CliRunner().invoke(app, ["index", str(SAMPLE_CORPUS), "--home", str(tmp_path), "--community-resolutions", "x"])
    assert out.exit_code == 2 and "--community-resolutions" in out.output


def test_http_create_checks_the_index_settings(tmp_path):
    from fastapi.testclient import TestClient

    from lazyhippo.serve.app import Access, create_app
    from lazyhippo.serve.middleware import TOKEN_HEADER
    from lazyhippo.serve.pool import IndexPool

    pool = IndexPool(Settings(home=tmp_path))
    token = "a-per-start-token-of-the-server"
    client = TestClient(create_app(pool, Access(token=token), source_roots=(SAMPLE_CORPUS.parent,)),
                        base_url="http://127.0.0.1", headers={TOKEN_HEADER: token})
    r = client.post("/api/kg/create", json={"path": str(SAMPLE_CORPUS), "community_resolutions": [1.0, 0.5]})
    assert r.status_code == 400 and "community resolutions" in r.text
    r = client.post("/api/kg/create", json={"path": str(SAMPLE_CORPUS), "knn_structural": "replace"})
    assert r.status_code == 400 and "needs graph_store 'neo4j'" in r.text
    assert client.post("/api/kg/create", json={"path": str(SAMPLE_CORPUS), "knn_structural": "both"}).status_code in (400, 422)


@pytest.mark.services
def test_structural_knn_on_neo4j(tmp_path, neo4j_store, namespaces):  # noqa: F811
    """`concat`: each edge's score is the mean of the text cosine and the FastRP cosine (both halves unit
    length); `replace`: FastRP alone; the index run takes the mode from the settings."""
    from lazyhippo.index import run_index
    from lazyhippo.stores.warehouse import connect, read_vectors

    settings = Settings(home=tmp_path, namespace=namespaces("structural"), source=str(SAMPLE_CORPUS),
                        graph_store="neo4j", knn_structural="concat")
    run_index(settings, neo4j_store)
    ns = settings.namespace
    with connect(settings) as con:
        ids, vectors = read_vectors(con, ns, "entity")
        stored = {(a, b): s for a, b, s in con.execute("SELECT source_id, target_id, score FROM knn_edges "
                                                       "WHERE namespace = ?", [ns]).fetchall()}
    pos = {e: i for i, e in enumerate(ids)}
    text = np.asarray(vectors, dtype=np.float64)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    fast = neo4j_store.algorithms.fastrp(ns)
    struct = np.asarray([fast.get(e) or [0.0] * 64 for e in ids], dtype=np.float64)
    norms = np.linalg.norm(struct, axis=1, keepdims=True)
    struct = np.divide(struct, norms, out=np.zeros_like(struct), where=norms > 0)
    assert stored and np.count_nonzero(norms) > len(ids) // 2  # the related entities have structural vectors
    for (a, b), score in stored.items():
        i, j = pos[a], pos[b]
        assert score == pytest.approx((text[i] @ text[j] + struct[i] @ struct[j]) / 2, abs=1e-4)
    plain = {(e.source, e.target) for e in neo4j_store.knn(ns, ids, vectors, 10, 0.6)}
    assert plain != set(stored)  # the structural half changes the neighbours
    replaced = neo4j_store.knn(ns, ids, vectors, 10, 0.6, "replace")
    assert replaced and all(e.score == pytest.approx(struct[pos[e.source]] @ struct[pos[e.target]], abs=1e-4)
                            for e in replaced)
