#!/usr/bin/env bash
# The README's test command runs this, in the .venv it made (installed with the exact
# versions of constraints/ci.txt):
#   1. lint and format check (ruff), type check (mypy over the package and the adapters, [tool.mypy]
#      in pyproject.toml);
#   2. the whole pytest suite in .venv, except what builds and installs the distribution
#      (tests marked `packaging`), on every core: pytest-xdist's `-n auto` (at most 4 workers: each
#      imports torch and TensorFlow), a file's tests on one worker (`--dist loadfile`: what a test
#      module sets up once, TensorFlow's one-thread configuration included, is set up once per file).
#      `-n 0` among the arguments runs it in one process. Slow suites need --runslow
#      (docs/verification.md). The layout and the tiers: tests/README.md.
# What is slow and needs environments of its own (the packaging tests, dp-accounting 0.6,
# Opacus 1.5) is scripts/test_environments.sh, the second step of .ci/run.
# Arguments are passed to pytest. Every step runs even when an earlier one fails; the exit
# status is the first failing step's, else pytest's (so pytest's 5, "no tests collected",
# reaches .ci/run).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/_steps.sh

step .venv/bin/ruff check .
step .venv/bin/ruff format --check .
step .venv/bin/python -m mypy

parallel=(-n auto --maxprocesses 4 --dist loadfile)
echo "+ .venv/bin/python -m pytest -m 'not packaging' ${parallel[*]} $*"
.venv/bin/python -m pytest -m "not packaging" "${parallel[@]}" "$@"
status=$?

if [ "${#failed[@]}" -ne 0 ]; then
  echo "test.sh: steps that failed before the main suite:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit "$first_status"
fi
exit "$status"
