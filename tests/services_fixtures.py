"""Fixtures for the tests that need the Neo4j+GDS and MinIO servers (`lazyhippo services start`).

Import them into a test module (`from tests.services_fixtures import neo4j_store, minio_store, namespaces`).
An unreachable server skips with the reason, or fails with it when CI is set or LAZYHIPPO_REQUIRE_SERVICES=1.
Every test namespace is unique per test run and removed from Neo4j and MinIO afterwards.
"""

from __future__ import annotations

import os
import uuid

import pytest

_SESSION = uuid.uuid4().hex[:8]
_CREATED: list[str] = []   # namespaces handed out; the server fixtures remove them at the end of the run


def unavailable(reason: str) -> None:
    if os.environ.get("CI") or os.environ.get("LAZYHIPPO_REQUIRE_SERVICES") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def neo4j_store():
    from lazyhippo.stores.neo4j import Neo4jGraphStore

    try:  # no credentials (no services install) is "unavailable" too
        store = Neo4jGraphStore.from_env(connect_timeout=5)
    except Exception as exc:  # noqa: BLE001
        unavailable(f"Neo4j + GDS not usable: {exc}")
    try:
        store.verify()
    except Exception as exc:  # noqa: BLE001
        store.close()
        unavailable(f"Neo4j + GDS not usable: {exc}")
    yield store
    for ns in _CREATED:
        try:
            store.drop_namespace(ns)
        except Exception:  # noqa: BLE001 - cleanup only
            pass
    store.close()


@pytest.fixture(scope="session")
def minio_store():
    from lazyhippo.stores.minio import MinioObjectStore

    try:
        store = MinioObjectStore.from_env(bucket=os.environ.get("LAZYHIPPO_TEST_BUCKET", "lazyhippo-test"),
                                          timeout=5, retries=0)
        store.ensure_bucket()
    except Exception as exc:  # noqa: BLE001
        unavailable(f"MinIO not usable: {exc}")
    yield store
    for ns in _CREATED:
        try:
            store.delete_prefix(f"{ns}/")
        except Exception:  # noqa: BLE001 - cleanup only
            pass


@pytest.fixture(scope="session")
def namespaces():
    """`namespaces("label")` -> a fresh namespace, removed from Neo4j and MinIO when the test run ends."""

    def new(label: str = "ns") -> str:
        ns = f"test_{_SESSION}_{label}_{len(_CREATED)}"
        _CREATED.append(ns)
        return ns

    return new


LLM_BASE_URL = os.environ.get("LAZYHIPPO_TEST_LLM_BASE_URL",
                              f"http://127.0.0.1:{os.environ.get('LAZYHIPPO_LLM_PORT', '8088')}/v1")
LLM_MODEL = os.environ.get("LAZYHIPPO_LLM_ALIAS", "gemma-3-270m")


@pytest.fixture(scope="session")
def llm_server() -> tuple[str, str]:
    """(base URL, model) of the llama.cpp server that `scripts/services.sh start llm` runs on loopback."""
    from lazyhippo.models.llm import LLMConfig, LLMError, OpenAIChat

    client = OpenAIChat(LLMConfig(LLM_MODEL, base_url=LLM_BASE_URL, api_key="none", timeout=10, max_retries=0))
    try:
        client.check()
    except LLMError as exc:
        unavailable(f"LLM server not usable at {LLM_BASE_URL}: {exc}")
    return LLM_BASE_URL, LLM_MODEL
