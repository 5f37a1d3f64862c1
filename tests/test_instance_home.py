"""Runs that know only their Dagster instance (the UI's, a sensor's, the daemon's) act on the instance's home, on
the namespaces it holds, with the settings each was indexed with."""

from __future__ import annotations

import dagster as dg
import pytest

from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.namespaces import UnknownNamespace, record_namespace, resolve_settings
from lazyhippo_dagster.resources import HOME_FILE, LazyhippoResource


def test_without_a_home_the_resource_acts_on_the_instance_home_and_refuses_a_namespace_it_does_not_hold(tmp_path):
    home = tmp_path / "kb"
    record_namespace(Settings(home=home, namespace="wiki", source=str(SAMPLE_CORPUS), chunk_size=128))
    record_namespace(Settings(home=home, namespace="notes", source=str(tmp_path / "notes.jsonl")))
    (home / "dagster").mkdir()
    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    resource = LazyhippoResource()
    wiki = resource.settings_for("wiki", instance)
    assert (wiki.home, wiki.source, wiki.chunk_size) == (home.resolve(), str(SAMPLE_CORPUS), 128)  # as indexed
    assert LazyhippoResource(chunk_size=64).settings_for("wiki", instance).chunk_size == 64  # config still wins
    with pytest.raises(UnknownNamespace, match=r"'ghost' is not indexed in .*it holds: notes, wiki"):
        resource.settings_for("ghost", instance)
    assert [s.namespace for s in resource.watched(instance)] == ["notes", "wiki"]
    elsewhere = tmp_path / "elsewhere"  # an instance folder that is not <home>/dagster names its home
    elsewhere.mkdir()
    (elsewhere / HOME_FILE).write_text(str(home))
    assert resource.settings_for("wiki", dg.DagsterInstance.from_config(str(elsewhere))).home == home.resolve()


def test_one_resolver_gives_explicit_choices_over_the_recorded_settings_over_the_environment(tmp_path, monkeypatch):
    """Every entry point resolves a run's settings the same way; what a re-index changed stays for later runs,
    and the run's mode is never recorded."""
    monkeypatch.setenv("LAZYHIPPO_COMMUNITY_ALGORITHM", "leiden")
    monkeypatch.setenv("LAZYHIPPO_CHUNK_SELECTION", "vector")
    home = tmp_path / "kb"
    assert resolve_settings(home, "wiki").community_algorithm == "leiden"  # not held yet: the environment
    record_namespace(Settings(home=home, namespace="wiki", community_algorithm="louvain", mode="add", knn_top_k=4))
    later = resolve_settings(home, "wiki")
    assert (later.community_algorithm, later.knn_top_k, later.mode) == ("louvain", 4, None)  # recorded over env
    assert resolve_settings(home, "wiki", community_algorithm="leiden", knn_top_k=None).community_algorithm == "leiden"
    assert resolve_settings(home, "wiki", knn_top_k=None).knn_top_k == 4  # an unset choice keeps the recorded
    resource = LazyhippoResource(home=str(home), namespace="wiki")  # the Dagster resource calls the same resolver
    assert resource.settings().community_algorithm == "louvain"
    assert LazyhippoResource(home=str(home), namespace="wiki", community_algorithm="leiden").settings().community_algorithm == "leiden"


def test_with_only_dagster_home_set_the_cli_and_the_engine_use_its_home(tmp_path, monkeypatch):
    monkeypatch.delenv("LAZYHIPPO_HOME", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "kb" / "dagster"))
    assert Settings.from_env().home == (tmp_path / "kb").resolve()
    monkeypatch.setenv("LAZYHIPPO_HOME", str(tmp_path / "other"))  # named explicitly: that one
    assert Settings.from_env().home == (tmp_path / "other").resolve()


def test_kind_tags_name_the_stores_the_runs_use(monkeypatch):
    from lazyhippo_dagster.assets._kinds import store_kinds

    monkeypatch.delenv("LAZYHIPPO_GRAPH_STORE", raising=False)
    monkeypatch.delenv("LAZYHIPPO_OBJECT_STORE", raising=False)
    assert store_kinds("duckdb", graph=True) == {"duckdb"} and store_kinds("parquet", objects=True) == {"parquet"}
    monkeypatch.setenv("LAZYHIPPO_GRAPH_STORE", "neo4j")
    monkeypatch.setenv("LAZYHIPPO_OBJECT_STORE", "minio")
    assert store_kinds("duckdb", graph=True) == {"duckdb", "neo4j"} and store_kinds("parquet", objects=True) == {"parquet", "minio"}
    assert store_kinds("duckdb") == {"duckdb"}  # an asset that writes neither store
