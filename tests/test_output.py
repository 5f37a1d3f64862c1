"""What a user sees: a normal CLI run prints progress and results only; `--verbose` adds the libraries'
notices and logs. Real subprocesses, as a terminal runs them (warnings and log handlers are per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lazyhippo.models.bert import GRAPH_VERSION
from lazyhippo.models.embedders import _encoder, model_cache_dir

QUESTION = "Who succeeded the founder of the Marlow Observatory as its director?"


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "LAZYHIPPO_VERBOSE", "PYTHONWARNINGS")}
    return {**env, "DAGSTER_HOME": str(tmp_path / "dagster"), **extra}


def _cli(tmp_path: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "lazyhippo_dagster.cli", *args], capture_output=True, text=True,
                         env=_env(tmp_path), cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if "Warning" in line or "DEBUG" in line or "INFO" in line
            or not line.strip()]


def test_index_and_query_print_progress_and_results_only(tmp_path):
    home = str(tmp_path / "home")
    index = _cli(tmp_path, "index", "--home", home)
    query = _cli(tmp_path, "query", QUESTION, "--home", home)
    assert "extractions.extract_documents done" in index and "Tomas Reyes" in query
    assert _noise(index) == [] and _noise(query) == []
    verbose = _cli(tmp_path, "--verbose", "query", QUESTION, "--home", home)
    assert "Tomas Reyes" in verbose
    assert any(line.startswith(("DEBUG ", "INFO ")) for line in verbose.splitlines())
    # the notices are there, on request (Dagster's, raised where the index run loads the definitions)
    assert any("Warning" in line for line in _noise(_cli(tmp_path, "--verbose", "index", "--home", home)))


QUANTIZE = """
import sys
from pathlib import Path
from lazyhippo.models.bert import quantize
quantize(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_quantization_advice_shows_only_when_verbose(tmp_path):
    _encoder()  # builds (once per machine) the fp32 graph the int8 one is quantized from
    graph = model_cache_dir() / f"all-minilm-l6-v2.{GRAPH_VERSION}.onnx"
    runs = {verbose: subprocess.run([sys.executable, "-c", QUANTIZE, str(graph), str(tmp_path / f"{verbose}.onnx")],
                                    capture_output=True, text=True, env=_env(tmp_path, LAZYHIPPO_VERBOSE=verbose))
            for verbose in ("", "1")}
    assert all(r.returncode == 0 for r in runs.values())
    assert runs[""].stderr == ""
    assert "pre-processing" in runs["1"].stderr


LEXICAL = """
import sys
from lazyhippo.logs import configure_logging
configure_logging(sys.argv[1] == "1")
from lazyhippo.query.lexical import Lexical
Lexical.build(["the marlow observatory", "tomas reyes"])
"""


def test_library_debug_records_show_only_when_verbose(tmp_path):
    """bm25s sets its own logger to DEBUG on import; the MCP server and the CLI log through one handler whose
    level is the verbosity, so its index-building lines stay off stderr (the MCP client's log)."""
    runs = {v: subprocess.run([sys.executable, "-c", LEXICAL, v], capture_output=True, text=True, env=_env(tmp_path))
            for v in ("0", "1")}
    assert runs["0"].returncode == 0 and runs["0"].stderr == ""
    assert "DEBUG bm25s: Building index" in runs["1"].stderr
