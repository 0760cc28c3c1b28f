#!/usr/bin/env bash
# The whole test suite CI can run, in the .venv made by the README's test command:
# lint, format check, then pytest (fast tiers; slow suites need --runslow, see docs/verification.md).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
