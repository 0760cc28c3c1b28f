#!/usr/bin/env bash
# The whole test suite CI can run, in the .venv made by the README's test command:
# lint and format check; the core and dp-accounting adapter tests again against
# dp-accounting 0.6.x in a second venv (.venv-dpa06); then the whole pytest suite in
# .venv (fast tiers; slow suites need --runslow, see docs/verification.md).
# Arguments are passed to the last pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/test_dp_accounting_06.sh
exec .venv/bin/python -m pytest "$@"
