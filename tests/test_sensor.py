"""The source sensor diffs documents against its cursor and names each change in its run key."""

from __future__ import annotations

import os
import shutil

import dagster as dg
import pytest

from lazyhippo.index import run_index
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo.stores.warehouse import connect
from lazyhippo_dagster.resources import LazyhippoResource
from lazyhippo_dagster.sensors import source_changed


class Ticks:
    """Evaluates the sensor tick after tick, carrying the cursor like the daemon does."""

    def __init__(self, settings: Settings):
        self.resource = LazyhippoResource(home=str(settings.home), source=settings.source, namespace=settings.namespace)
        self.cursor: str | None = None
        self.keys: list[str] = []
        self.instance = dg.DagsterInstance.ephemeral()

    def tick(self):
        """The run request, or the skip reason; partitions requested are added to the instance."""
        with dg.build_sensor_context(cursor=self.cursor, resources={"lazyhippo": self.resource},
                                     instance=self.instance) as ctx:
            out = source_changed(ctx)
        self.cursor = out.cursor
        for req in out.dynamic_partitions_requests or []:  # applied as the sensor daemon does
            self.instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        if out.run_requests:
            self.keys += [r.run_key for r in out.run_requests]
            return out.run_requests[0]
        return out.skip_reason

    def namespaces(self) -> list[str]:
        return list(self.instance.get_dynamic_partitions("namespaces"))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("sensor")
    shutil.copytree(SAMPLE_CORPUS, root / "c")
    settings = Settings(home=root / "h", source=str(root / "c"))
    run_index(settings)
    return settings


def test_an_unchanged_indexed_folder_requests_nothing(indexed):
    ticks = Ticks(indexed)
    first = ticks.tick()
    assert isinstance(first, dg.SkipReason) and "no change: 8 documents in 7 files" in first.skip_message
    assert not ticks.instance.get_dynamic_partitions("namespaces")
    os.utime(next((indexed.home.parent / "c").glob("*.txt")))  # a touch is no change of content
    assert isinstance(ticks.tick(), dg.SkipReason)


def test_add_delete_re_add_change_each_get_their_own_run_key(indexed, tmp_path):
    ticks = Ticks(indexed)
    assert isinstance(ticks.tick(), dg.SkipReason)
    new = indexed.home.parent / "c" / "harbour_light.txt"
    new.write_text("The Harbour Light stands above Eastbridge. Ada Fenwick painted it in 1901.\n")
    added = ticks.tick()
    assert isinstance(added, dg.RunRequest) and added.tags["lazyhippo/added"] == "1"
    assert "harbour_light.txt" in added.tags["lazyhippo/change"]
    # one index run of the namespace (its partition): the run reads again only what changed
    assert added.job_name == "index" and added.partition_key == "default" and added.tags["lazyhippo/namespace"] == "default"
    assert isinstance(ticks.tick(), dg.SkipReason)  # nothing twice
    new.unlink()
    removed = ticks.tick()
    assert isinstance(removed, dg.RunRequest) and removed.tags["lazyhippo/removed"] == "1"
    assert removed.job_name == "index" and removed.partition_key == "default"  # the run drops it
    new.write_text("The Harbour Light stands above Eastbridge. Ada Fenwick painted it in 1901.\n")
    again = ticks.tick()
    assert isinstance(again, dg.RunRequest) and again.tags["lazyhippo/added"] == "1"
    rows = indexed.home.parent / "c" / "river_sell.jsonl"
    rows.write_text(rows.read_text().replace("flows", "runs", 1))
    changed = ticks.tick()
    assert isinstance(changed, dg.RunRequest) and changed.tags["lazyhippo/changed"] == "1"
    assert changed.tags["lazyhippo/added"] == changed.tags["lazyhippo/removed"] == "0"
    assert "river_sell.jsonl" in changed.tags["lazyhippo/change"]
    assert len(ticks.keys) == len(set(ticks.keys)) == 4
    rows.write_text(rows.read_text().replace("runs", "flows", 1))
    new.unlink()


def test_a_new_namespace_requests_every_document(tmp_path):
    settings = Settings(home=tmp_path / "h", source=str(SAMPLE_CORPUS), namespace="fresh")
    ticks = Ticks(settings)
    out = ticks.tick()
    assert isinstance(out, dg.RunRequest) and out.tags["lazyhippo/added"] == "8" and out.job_name == "index"
    assert out.partition_key == "fresh" and ticks.namespaces() == ["fresh"]  # the namespace's partition is added


def test_the_run_key_names_the_change_not_the_folder(tmp_path):
    from lazyhippo.sources.changes import SourceChange, SourceState

    a = SourceChange(added={"d_1": "h1"}, files=("x.txt",))
    b = SourceChange(removed={"d_1": "h1"}, files=("x.txt",))
    state = SourceState(requested=3)
    assert state.run_key(a) != state.run_key(b) and state.run_key(a) != SourceState(requested=4).run_key(a)
    assert SourceState.decode(SourceState({}, 7).encode()).requested == 7
