"""A MinIO bucket prefix as the source: the sensor diffs objects by (key, size, etag) with the same
run-key rules as the folder sensor, and an index run reads the prefix through a mirror. Real MinIO on loopback."""

from __future__ import annotations

import dagster as dg
import pytest

from lazyhippo.index import run_index
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.sources.bucket import bucket_source, mirror_dir
from lazyhippo.stores.warehouse import connect
from tests.services_fixtures import minio_store, namespaces  # noqa: F401 - fixtures
from tests.test_sensor import Ticks


def test_bucket_source_urls_name_bucket_and_prefix():
    assert bucket_source("/data/papers") is None
    assert bucket_source("s3://docs/team/papers/") == ("docs", "team/papers/")
    assert bucket_source("s3://docs") == ("docs", "")
    with pytest.raises(ValueError, match="names no bucket"):
        bucket_source("s3:///papers")


@pytest.fixture
def bucket(minio_store, namespaces, tmp_path):  # noqa: F811
    """The sample corpus uploaded under a fresh prefix, and settings whose source is that prefix."""
    prefix = f"{namespaces('bucket')}/source/"
    for path in sorted(SAMPLE_CORPUS.iterdir()):
        if path.is_file():
            minio_store.put(prefix + path.name, path.read_bytes())
    settings = Settings(home=tmp_path / "h", source=f"s3://{minio_store.bucket}/{prefix}")
    return minio_store, prefix, settings


def doc_sources(settings: Settings) -> set[str]:
    with connect(settings) as con:
        return {r[0] for r in con.execute("SELECT source FROM documents WHERE namespace = ?", [settings.namespace]).fetchall()}


@pytest.mark.services
def test_index_reads_the_prefix_like_the_folder(bucket, tmp_path):
    store, prefix, settings = bucket
    run_index(settings)
    folder = Settings(home=tmp_path / "folder", source=str(SAMPLE_CORPUS))
    run_index(folder)
    assert doc_sources(settings) == doc_sources(folder) and doc_sources(settings)
    store.delete(prefix + "tomas_reyes.txt")
    run_index(settings)
    assert "tomas_reyes.txt" not in doc_sources(settings)
    assert not (mirror_dir(settings) / "tomas_reyes.txt").exists()


@pytest.mark.services
def test_sensor_on_a_bucket_prefix_adds_changes_removes_and_never_repeats_a_run_key(bucket):
    store, prefix, settings = bucket
    ticks = Ticks(settings)
    first = ticks.tick()  # nothing indexed yet: every document is new
    assert isinstance(first, dg.RunRequest) and first.tags["lazyhippo/added"] == "8"
    assert ticks.instance.get_dynamic_partitions("namespaces") == [settings.namespace]
    run_index(settings)
    assert isinstance(ticks.tick(), dg.SkipReason)  # indexed and unchanged: nothing requested

    note = prefix + "harbour_note.md"
    store.put(note, b"# Harbour note\n\nThe Eastbridge harbour reopened in spring.\n")
    added = ticks.tick()
    assert added.tags["lazyhippo/added"] == "1" and "harbour_note.md" in added.tags["lazyhippo/change"]
    store.put(note, b"# Harbour note\n\nThe Eastbridge harbour reopened in autumn.\n")
    changed = ticks.tick()
    assert changed.tags["lazyhippo/changed"] == "1" and ticks.namespaces() == [settings.namespace]
    store.delete(note)
    removed = ticks.tick()
    assert removed.tags["lazyhippo/removed"] == "1" and ticks.namespaces() == [settings.namespace]
    store.put(note, b"# Harbour note\n\nThe Eastbridge harbour reopened in spring.\n")  # same content as first added
    again = ticks.tick()
    assert again.tags["lazyhippo/added"] == "1" and ticks.namespaces() == [settings.namespace]
    assert isinstance(ticks.tick(), dg.SkipReason)
    assert len(ticks.keys) == len(set(ticks.keys)) == 5  # the re-add is a new change, never a dropped duplicate
