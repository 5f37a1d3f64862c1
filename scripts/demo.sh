#!/usr/bin/env bash
# First run: install, index the sample corpus through Dagster (embedded store, offline), ask a question.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lazyhippo index
.venv/bin/lazyhippo query "Who succeeded the founder of the Marlow Observatory as its director?"
