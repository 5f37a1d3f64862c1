"""`lazyhippo merge` folds entities into a target; recorded, so a reindex applies it again."""

from __future__ import annotations

import shutil

import pytest

from lazyhippo.index import run_index
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stages.lifecycle import merge_entities
from lazyhippo.stages.merge import UnknownEntityError
from lazyhippo.stores.graphs import EmbeddedGraphStore
from lazyhippo.stores.objects import LocalObjectStore
from lazyhippo.stores.warehouse import connect
from tests.services_fixtures import namespaces, neo4j_store  # noqa: F401 - fixtures

# a related pair (s, t) with a common neighbour n: merging s into t makes s-t a self-loop and s-n a duplicate of t-n
PAIR_SQL = """
    WITH r AS (SELECT source_id AS a, target_id AS b, weight FROM relations WHERE namespace = $ns
               UNION ALL SELECT target_id, source_id, weight FROM relations WHERE namespace = $ns)
    SELECT st.a AS s, st.b AS t, sn.b AS n, sn.weight AS w_sn, tn.weight AS w_tn
    FROM r st JOIN r sn ON sn.a = st.a JOIN r tn ON tn.a = st.b AND tn.b = sn.b
    WHERE sn.b NOT IN (st.a, st.b) ORDER BY st.a, st.b, sn.b LIMIT 1"""


def weight(con, ns: str, a: str, b: str) -> float | None:
    row = con.execute("SELECT weight FROM relations WHERE namespace = ? AND source_id = least(?, ?) AND target_id = greatest(?, ?)",
                      [ns, a, b, a, b]).fetchone()
    return row[0] if row else None


def indexed(tmp_path, namespace: str = "default", store=None) -> Settings:
    settings = Settings(home=tmp_path / "h", namespace=namespace, source=str(shutil.copytree(SAMPLE_CORPUS, tmp_path / "c")))
    run_index(settings, store)
    return settings


def test_merge_drops_self_loops_combines_duplicates_and_survives_a_reindex(tmp_path):
    settings = indexed(tmp_path)
    ns = settings.namespace
    with connect(settings) as con:
        s, t, n, w_sn, w_tn = con.execute(PAIR_SQL, {"ns": ns}).fetchone()
        s_name, t_name = (con.execute("SELECT name FROM entities WHERE entity_id = ?", [e]).fetchone()[0] for e in (s, t))
        s_chunks = {r[0] for r in con.execute("SELECT chunk_id FROM mentions WHERE entity_id = ?", [s]).fetchall()}
        merge_entities(settings, con, [s_name], t_name, "concatenate", EmbeddedGraphStore(), LocalObjectStore(settings.export_dir))

    def check():
        with connect(settings) as con:
            assert not con.execute("SELECT 1 FROM entities WHERE entity_id = ?", [s]).fetchall()
            assert not con.execute("SELECT 1 FROM embeddings WHERE item_id = ?", [s]).fetchall()
            assert not con.execute("SELECT 1 FROM relations WHERE ? IN (source_id, target_id) OR source_id = target_id", [s]).fetchall()
            assert weight(con, ns, t, n) == pytest.approx(w_sn + w_tn)
            assert s_chunks <= {r[0] for r in con.execute("SELECT chunk_id FROM mentions WHERE entity_id = ?", [t]).fetchall()}
            assert not con.execute("SELECT 1 FROM knn_edges WHERE ? IN (source_id, target_id)", [s]).fetchall()
            assert con.execute("SELECT 1 FROM entity_scores WHERE entity_id = ?", [t]).fetchall()

    check()
    run_index(settings)  # the extractions still name the source: the recorded merge folds it again
    check()


def test_strategies_choose_the_description(tmp_path):
    settings = indexed(tmp_path)
    with connect(settings) as con:
        s, t, *_ = con.execute(PAIR_SQL, {"ns": "default"}).fetchone()
        d_s, d_t = (con.execute("SELECT description FROM entities WHERE entity_id = ?", [e]).fetchone()[0] for e in (s, t))
        merge_entities(settings, con, [s], t, "keep_longest", EmbeddedGraphStore(), LocalObjectStore(settings.export_dir))
        assert con.execute("SELECT description FROM entities WHERE entity_id = ?", [t]).fetchone()[0] == max(
            [d_t, d_s], key=len)


def test_unknown_entity_and_bad_strategy_are_clear_errors_that_change_nothing(sample_settings):
    with connect(sample_settings) as con:
        with pytest.raises(UnknownEntityError, match="'Nobody Atall'"):
            merge_entities(sample_settings, con, ["Nobody Atall"], "Ada Fenwick", "concatenate", EmbeddedGraphStore(),
                           LocalObjectStore(sample_settings.export_dir))
        with pytest.raises(ValueError, match="--strategy 'biggest'"):
            merge_entities(sample_settings, con, ["Tomas Reyes"], "Ada Fenwick", "biggest", EmbeddedGraphStore(),
                           LocalObjectStore(sample_settings.export_dir))
        assert not con.execute("SELECT count(*) FROM entity_merges").fetchone()[0]


@pytest.mark.services
def test_merge_on_neo4j_serves_the_merged_graph(tmp_path, neo4j_store, namespaces):  # noqa: F811
    ns = namespaces("merge")
    settings = indexed(tmp_path, ns, neo4j_store)
    with connect(settings) as con:
        s, t, n, *_ = con.execute(PAIR_SQL, {"ns": ns}).fetchone()
        out = merge_entities(settings, con, [s], t, "concatenate", neo4j_store, LocalObjectStore(settings.export_dir))
        want = {(a, b): w for a, b, w in con.execute(
            "SELECT source_id, target_id, weight FROM relations WHERE namespace = ?", [ns]).fetchall()}
    assert out["served"]["removed"] == 1
    got = {(r["a"], r["b"]): r["w"] for r in neo4j_store.query(
        "MATCH (a:Entity {namespace: $ns})-[r:RELATED_TO]->(b) RETURN a.id AS a, b.id AS b, r.weight AS w", {"ns": ns})}
    assert got == pytest.approx(want)
    assert not neo4j_store.query("MATCH (e:Entity {namespace: $ns, id: $s}) RETURN e", {"ns": ns, "s": s})


def test_cli_merge_rebuilds_through_dagster_and_names_unknown_entities(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    home, runner = str(tmp_path / "idx"), CliRunner()
    assert runner.invoke(app, ["index", "--home", home]).exit_code == 0
    before = json.loads(runner.invoke(app, ["status", "--home", home, "--json"]).stdout.strip().splitlines()[-1])
    bad = runner.invoke(app, ["merge", "Nobody Atall", "--into", "Ada Fenwick", "--home", home])
    assert bad.exit_code == 2 and "Nobody Atall" in bad.output
    out = runner.invoke(app, ["merge", "Tomas Reyes", "--into", "Ada Fenwick", "--strategy", "keep_first", "--home", home])
    assert out.exit_code == 0, out.output
    after = json.loads(runner.invoke(app, ["status", "--home", home, "--json"]).stdout.strip().splitlines()[-1])
    assert after["entities"] == before["entities"] - 1


def test_merge_into_a_new_name_creates_the_target_and_keeps_it_across_a_reindex(tmp_path):
    settings = indexed(tmp_path)
    with connect(settings) as con:
        out = merge_entities(settings, con, ["Tomas Reyes", "Reyes"], "Tomás Reyes (astronomer)", "concatenate",
                             EmbeddedGraphStore(), LocalObjectStore(settings.export_dir))
        assert out["merge"].created and out["merge"].target_name == "Tomás Reyes (astronomer)"

    def check():
        with connect(settings) as con:
            names = {r[0] for r in con.execute("SELECT name FROM entities WHERE namespace = 'default'").fetchall()}
            assert "Tomás Reyes (astronomer)" in names and not names & {"Tomas Reyes", "Reyes"}
            row = con.execute("SELECT e.type, e.description, e.mention_count, s.pagerank FROM entities e JOIN "
                              "entity_scores s USING (namespace, entity_id) WHERE e.name = 'Tomás Reyes (astronomer)'"
                              ).fetchone()
            assert row[0] and "instrument maker" in row[1] and "spectrograph" in row[1] and row[2] >= 3 and row[3] > 0
            assert con.execute("SELECT count(*) FROM embeddings e JOIN entities n ON n.entity_id = e.item_id "
                               "WHERE n.name = 'Tomás Reyes (astronomer)'").fetchone()[0] == 1

    check()
    run_index(settings)
    check()


def test_llm_summary_needs_an_llm_and_describes_the_target_from_every_merged_name(tmp_path):
    from types import SimpleNamespace

    from lazyhippo.stages.merge import summarize_merges

    settings = indexed(tmp_path)
    with connect(settings) as con:
        with pytest.raises(ValueError, match="llm_summary needs an LLM"):
            merge_entities(settings, con, ["Reyes"], "Tomas Reyes", "llm_summary", EmbeddedGraphStore(),
                           LocalObjectStore(settings.export_dir))
        assert not con.execute("SELECT count(*) FROM entity_merges").fetchone()[0]
        online = settings.with_(llm="openai")
        merge_entities(online, con, ["Ada Fenwick"], "Tomas Reyes", "llm_summary", EmbeddedGraphStore(),
                       LocalObjectStore(settings.export_dir))  # no LLM reached at rebuild: concatenated meanwhile
        prompts = []

        def complete(prompt, **_):
            prompts.append(prompt)
            return SimpleNamespace(text="Astronomers of the Marlow Observatory.")

        assert summarize_merges(online, con, SimpleNamespace(model="fake", complete=complete)) == 1
        assert "founded" in prompts[0] and "succeeded" in prompts[0]  # Ada Fenwick's and Tomas Reyes's descriptions
        assert con.execute("SELECT description FROM entities WHERE name = 'Tomas Reyes'").fetchone()[0] == \
            "Astronomers of the Marlow Observatory."
