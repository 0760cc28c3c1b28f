#!/usr/bin/env bash
# The whole test suite CI can run, in the .venv made by the README's test command
# (installed with the exact versions of constraints/ci.txt):
#   1. lint and format check (ruff);
#   2. the core and dp-accounting adapter tests against dp-accounting 0.6.x in a
#      second venv (.venv-dpa06, pinned by constraints/dpa06.txt);
#   3. the Opacus adapter and comparison tests against Opacus 1.5.x in a third venv
#      (.venv-opacus15, pinned by constraints/opacus15.txt);
#   4. the whole pytest suite in .venv (fast tiers, packaging included: build, metadata
#      check, wheel into an existing torch; slow suites need --runslow, see
#      docs/verification.md).
# Arguments are passed to the last pytest run. Every step runs even when an earlier
# one fails; the exit status is the first failing step's, else the last pytest's
# (so pytest's 5, "no tests collected", reaches .ci/run).
set -uo pipefail
cd "$(dirname "$0")/.."

failed=()
first_status=0
step() {
  echo "+ $*"
  "$@"
  local status=$?
  if [ "$status" -ne 0 ]; then
    echo "test.sh: FAILED (exit $status): $*" >&2
    failed+=("$* (exit $status)")
    # a fixed selection that collects nothing (pytest's 5) is a defect here: fail
    [ "$first_status" -ne 0 ] || { [ "$status" -eq 5 ] && first_status=1 || first_status=$status; }
  fi
}

step .venv/bin/ruff check .
step .venv/bin/ruff format --check .
step env PIP_CONSTRAINT="$PWD/constraints/dpa06.txt" bash scripts/test_dp_accounting_06.sh
step bash scripts/test_opacus_15.sh

echo "+ .venv/bin/python -m pytest $*"
.venv/bin/python -m pytest "$@"
status=$?

if [ "${#failed[@]}" -ne 0 ]; then
  echo "test.sh: steps that failed before the main suite:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit "$first_status"
fi
exit "$status"
