#!/usr/bin/env bash
# The whole test suite: install, start Neo4j+GDS and MinIO on loopback, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh install
bash scripts/services.sh start
export LAZYHIPPO_REQUIRE_SERVICES=1
.venv/bin/python -m pytest -q "$@"
