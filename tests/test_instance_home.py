"""Runs that know only their Dagster instance (the UI's, a sensor's, the daemon's) act on the instance's home, on
the namespaces it holds, with the settings each was indexed with; partition keys name their documents."""

from __future__ import annotations

import dagster as dg
import pytest

from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.sources.files import doc_id_for
from lazyhippo.stores.namespaces import UnknownNamespace, record_namespace
from lazyhippo_dagster.assets._partitions import NAME_MAX, document_name, key_doc_ids, single_jsonl
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


@pytest.mark.parametrize("source, single, name", [
    ("notes/harbor_lights.txt", False, "notes/harbor_lights.txt"),
    ("rows.jsonl#q-17", False, "rows.jsonl#q-17"),
    ("rows.jsonl#q-17", True, "q-17"),  # the source is that one file: the row id alone
    ("odd...name.txt", False, None),   # Dagster refuses "..."
    ("tab\tname.txt", False, None),
    ("x" * 300 + ".txt", False, None),
    ("looks~0123456789abcdef", False, None),  # would read as hashed: hashed for real
])
def test_a_partition_key_names_its_document_and_leads_back_to_it(tmp_path, source, single, name):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    settings = Settings(namespace="kb", source=str(rows if single else tmp_path))
    assert single_jsonl(settings) == ("rows.jsonl" if single else None)
    got = document_name(source, single_jsonl(settings))
    if name is not None:
        assert got == name
    else:  # cleaned and cut, made unique by the doc_id's hash
        assert got.endswith("~" + doc_id_for(source)[2:]) and "..." not in got and "\t" not in got
        assert len(got) <= NAME_MAX + 17
    key = f"kb/{got}"
    assert key_doc_ids([key], settings) == {key: doc_id_for(source)}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("documents", [key])  # a key Dagster accepts


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
