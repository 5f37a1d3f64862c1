"""Settings filled once (defaults < environment < explicit), credentials without constants, and a non-editable
install that finds its package data."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lazyhippo.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def test_settings_from_env_then_overrides(monkeypatch, tmp_path):
    for var in ("LAZYHIPPO_NAMESPACE", "LAZYHIPPO_LLM", "OPENAI_BASE_URL", "OPENAI_API_KEY", "LAZYHIPPO_GRAPH_STORE"):
        monkeypatch.delenv(var, raising=False)
    assert Settings.from_env().llm == "none" and Settings.from_env().graph_store == "embedded"
    monkeypatch.setenv("LAZYHIPPO_NAMESPACE", "from_env")
    monkeypatch.setenv("LAZYHIPPO_GRAPH_STORE", "neo4j")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    s = Settings.from_env(home=tmp_path, chunk_size=None)
    assert (s.namespace, s.graph_store, s.llm, s.home, s.chunk_size) == ("from_env", "neo4j", "openai", tmp_path, 256)
    assert Settings.from_env(namespace="explicit").namespace == "explicit"
    with pytest.raises(TypeError, match="unknown settings: colour"):
        Settings().with_(colour="blue")


def test_the_sensor_watches_the_source_the_job_indexes(tmp_path):
    import dagster as dg

    from lazyhippo_dagster.resources import LazyhippoResource
    from lazyhippo_dagster.sensors import source_changed

    (tmp_path / "a.md").write_text("# A\n\nAda Fenwick founded the observatory.\n")
    # the resource has a run lifecycle (the index run's writer lock), so its context is opened with `with`
    with dg.build_sensor_context(resources={"lazyhippo": LazyhippoResource(source=str(tmp_path))},
                                 instance=dg.DagsterInstance.ephemeral()) as context:
        request = source_changed(context).run_requests[0]
    assert isinstance(request, dg.RunRequest) and request.run_key
    with dg.build_sensor_context(resources={"lazyhippo": LazyhippoResource(source=str(tmp_path / "none"))},
                                 instance=dg.DagsterInstance.ephemeral()) as missing:
        assert "does not exist" in source_changed(missing).skip_reason.skip_message


def test_credentials_come_from_the_environment_or_the_services_file(monkeypatch, tmp_path):
    from lazyhippo.settings import MissingCredentials, credential
    from lazyhippo.stores.neo4j import Neo4jConnection

    monkeypatch.delenv("NEO4J_PASSWORD", raising=False)
    monkeypatch.setenv("LAZYHIPPO_SERVICES_DIR", str(tmp_path))
    with pytest.raises(MissingCredentials, match="NEO4J_PASSWORD is not set.*services.sh install"):
        Neo4jConnection.from_env()
    (tmp_path / "credentials.env").write_text("NEO4J_PASSWORD=from-file-secret\nMINIO_ROOT_USER=u\n")
    conn = Neo4jConnection.from_env()
    assert conn.password == "from-file-secret" and "from-file-secret" not in repr(conn)
    monkeypatch.setenv("NEO4J_PASSWORD", "from-env-secret")
    assert Neo4jConnection.from_env().password == "from-env-secret"
    assert credential("MINIO_ACCESS_KEY", "MINIO_ROOT_USER") == "u"


def test_no_password_constant_in_the_code():
    """The services script's old loopback defaults, or any literal password, are gone from code."""
    for path in [*REPO.glob("lazyhippo/**/*.py"), *REPO.glob("resources/*.py"), *REPO.glob("pipelines/*.py"),
                 REPO / "scripts" / "services.sh"]:
        text = path.read_text()
        assert "lazyhippo-dev" not in text, path


def test_non_editable_install_finds_its_package_data(tmp_path):
    """`pip install .` (no editable link to the checkout) ships the SQL models and prompts, and the pipelines
    import without the repository on the path."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", ".services", ".lazyhippo*", "tests",
                                                             "__pycache__", "*.egg-info", "build", "tmp*"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(src)], check=True, capture_output=True, timeout=600)
    shutil.rmtree(src)  # nothing may still point into the source tree
    probe = "\n".join([
        "import types, lazyhippo, lazyhippo_dagster.definitions, lazyhippo.sql",
        "from lazyhippo.settings import Settings",
        "from lazyhippo.stores.warehouse import connect",
        "from lazyhippo.models.extractors import LlmExtractor",
        f"with connect(Settings().with_(home={str(tmp_path / 'home')!r})) as con:",
        "    assert con.execute('SELECT count(*) FROM documents').fetchone() == (0,)",
        "assert LlmExtractor(types.SimpleNamespace(model='m')).template",
        "assert lazyhippo.sql.__file__.startswith(lazyhippo.__file__.rsplit('/lazyhippo/', 1)[0])",
        "from lazyhippo_dagster.bench_ui import QUERIES",
        "assert 'query RunLogsQuery' in QUERIES.read_text()",
        "print(lazyhippo.__file__)"])
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(site))
    # the installed CLI, run from another folder, indexes its packaged sample corpus and answers with a citation
    cli = [sys.executable, "-m", "lazyhippo_dagster.cli"]
    home = str(tmp_path / "kb")
    out = subprocess.run([*cli, "index", "--home", home], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    out = subprocess.run([*cli, "query", "Who succeeded the founder of the Marlow Observatory as its director?",
                          "--home", home], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Tomas Reyes" in out.stdout and re.search(r"\[\d+\] Tomas Reyes", out.stdout), \
        out.stdout[-2000:] + out.stderr[-2000:]


def test_the_setup_install_prints_no_warning(tmp_path):
    """The README's first command prints progress and results only: setup.sh's editable install of the
    package says nothing."""
    setup = (REPO / "scripts" / "setup.sh").read_text().splitlines()
    line = next(x for x in setup if "pip install -q -e" in x)
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", ".services", ".lazyhippo*", "tests",
                                                             "__pycache__", "*.egg-info", "build", "tmp*"))
    offline = f"--no-deps --no-build-isolation --no-index --ignore-installed --prefix {tmp_path / 'prefix'} -e"
    cmd = line.replace(".venv/bin/python", sys.executable).replace("-e", offline, 1)
    out = subprocess.run(["bash", "-c", cmd], cwd=src, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout[-2000:] + out.stderr[-2000:]


def test_store_kinds_are_a_typed_choice():
    from pydantic import ValidationError

    from lazyhippo_dagster.resources import GraphStoreResource, ObjectStoreResource

    assert GraphStoreResource(kind="neo4j").resolved_kind == "neo4j"
    with pytest.raises(ValidationError, match="embedded"):
        GraphStoreResource(kind="neo5j")
    with pytest.raises(ValidationError, match="minio"):
        ObjectStoreResource(kind="s3")
