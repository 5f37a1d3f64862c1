#!/usr/bin/env bash
# The whole test suite: install, start Neo4j+GDS, MinIO and the LLM server, and PostgreSQL + Redis for the
# cluster test, on loopback; run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh install
bash scripts/services.sh start
bash scripts/services.sh install postgres redis
bash scripts/services.sh start postgres redis
export LAZYHIPPO_REQUIRE_SERVICES=1
export LAZYHIPPO_SERVICES_DIR="${LAZYHIPPO_SERVICES_DIR:-$PWD/.services}"  # for processes the tests start elsewhere
.venv/bin/python -m pytest -q "$@"
