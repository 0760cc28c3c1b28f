#!/usr/bin/env bash
# Run the core tests and the dp-accounting adapter tests against dp-accounting 0.6.x.
#
# The main .venv has dp-accounting 0.4.3 (pinned by TF Privacy 0.9); this
# script keeps a second, small venv with the newest 0.6.x release, numpy,
# scipy, pytest and hypothesis, and the project installed editable without its
# dependencies (so no torch or TensorFlow).
#
# Usage (from anywhere):
#   scripts/test_dp_accounting_06.sh                 # default selection, see below
#   scripts/test_dp_accounting_06.sh PYTEST_ARGS...  # e.g. tests/adapters/dp_accounting/test_adapter.py -x
# Environment:
#   DPA06_VENV  venv folder (default .venv-dpa06 in the repo root; git-ignored)
#   PYTHON      interpreter that creates the venv (default python3, must be >= 3.10)
#
# Default selection: the tests whose results depend on dp-accounting's version: the
# dp-accounting adapter and its shared contract tests, the baselines pinned to
# dp-accounting (known values, Liang's sampled Gaussian, the PLD baseline rows and the
# entry points that report them, the random-allocation rows), the conversion (dp-accounting's formula) and the
# profiles (checked against its PLD), on every core (pytest-xdist, at most 4 workers). The rest of the core does not
# import dp-accounting and runs once, in .venv. Slow suites stay off unless --runslow
# is passed. Exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${DPA06_VENV:-.venv-dpa06}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "+ creating $venv with $python"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q "dp-accounting>=0.6,<0.7" numpy scipy pytest pytest-xdist hypothesis "typing_extensions>=4.7,<5" \
  "PLD_accounting>=2.0,<3"
"$venv/bin/python" -m pip install -q --no-deps -e .

version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("dp-accounting"))')"
case "$version" in
  0.6.*) echo "+ dp-accounting $version in $venv" ;;
  *)
    echo "expected dp-accounting 0.6.x in $venv, found $version" >&2
    exit 1
    ;;
esac

if [ "$#" -eq 0 ]; then
  set -- -q -n auto --maxprocesses 4 tests/adapters/dp_accounting/test_adapter.py tests/core/bounds/test_known_values.py tests/core/bounds/test_liang.py \
    tests/core/test_conversion.py tests/core/test_profiles.py tests/core/test_baselines.py tests/stories/test_one_best.py tests/core/bounds/test_sgm.py \
    tests/core/test_random_allocation_pld.py
fi
echo "+ $venv/bin/python -m pytest $*"
exec "$venv/bin/python" -m pytest "$@"
