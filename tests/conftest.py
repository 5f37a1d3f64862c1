from __future__ import annotations

import os
from pathlib import Path

import pytest

from lazyhippo.index import run_index
from lazyhippo.serve.runs import use_run_records
from lazyhippo.settings import SAMPLE_CORPUS, Settings
from lazyhippo_dagster.served_runs import ServedRuns

use_run_records(ServedRuns)  # as `lazyhippo serve` and `lazyhippo mcp` do: the servers' runs are Dagster runs

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "2wikimultihopqa"
# the servers' credentials (scripts/services.sh), also for the processes tests start in other folders
os.environ.setdefault("LAZYHIPPO_SERVICES_DIR", str(Path(__file__).resolve().parent.parent / ".services"))
# `lazyhippo query` in a test's subprocess leaves no warm query daemon behind (tests/test_query_daemon.py starts its own)
os.environ.setdefault("LAZYHIPPO_QUERY_DAEMON", "0")


@pytest.fixture(scope="session")
def sample_settings(tmp_path_factory) -> Settings:
    """The sample corpus indexed once per test run on the embedded default (library path, no Dagster)."""
    settings = Settings(home=tmp_path_factory.mktemp("sample_index"), source=str(SAMPLE_CORPUS))
    run_index(settings)
    return settings


@pytest.fixture(scope="session")
def wiki_dataset() -> Path:
    if not (SHARED / "corpus.jsonl").exists():
        pytest.skip(f"shared 2WikiMultiHopQA dataset not found at {SHARED} (only present beside the project checkout)")
    return SHARED
