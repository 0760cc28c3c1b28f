#!/usr/bin/env bash
# Run the Opacus adapter tests (and the comparison tests that call Opacus'
# accountants) against Opacus 1.5.x.
#
# The main .venv has Opacus 1.6 (constraints/ci.txt); the `opacus` extra accepts
# opacus >= 1.5, so this script keeps a second, small venv with Opacus 1.5.x on the
# same CPU torch build, numpy, scipy, dp-accounting, pytest and hypothesis, pinned by
# constraints/opacus15.txt, and the project installed editable without its
# dependencies (so no TensorFlow).
#
# Usage (from anywhere):
#   scripts/test_opacus_15.sh                 # default selection, see below
#   scripts/test_opacus_15.sh PYTEST_ARGS...  # e.g. tests/adapters/opacus/test_adapter.py -x
# Environment:
#   OPACUS15_VENV  venv folder (default .venv-opacus15 in the repo root; git-ignored)
#   PYTHON         interpreter that creates the venv (default python3, must be >= 3.10)
#
# Default selection: the Opacus adapter tests (tests/adapters/opacus/, the randomised Opacus
# pipelines of tests/stories/, and the Opacus half of tests/adapters/test_glm_adapters.py), and the
# comparison and known-value tests that call Opacus' accountants (RDP, PRV) on Poisson
# pipelines and the built-in scenario. Opacus 1.5 has no accountant registry: the tests
# attach the accountant to the engine there (docs/opacus.md, "Opacus 1.5"), and the few
# that need the registry (make_private_with_epsilon with a last-iterate accountant, the
# example script) are skipped with a reason naming the Opacus version. On every core
# (pytest-xdist, at most 4 workers). Slow suites stay off unless --runslow is passed.
# Exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${OPACUS15_VENV:-.venv-opacus15}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "+ creating $venv with $python"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q -c constraints/opacus15.txt \
  torch opacus numpy scipy dp-accounting PLD_accounting pytest pytest-xdist hypothesis
"$venv/bin/python" -m pip install -q --no-deps -e .

version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("opacus"), m.version("torch"))')"
case "$version" in
  "1.5."*) echo "+ opacus, torch: $version in $venv" ;;
  *)
    echo "expected opacus 1.5.x in $venv, found opacus, torch: $version" >&2
    exit 1
    ;;
esac

if [ "$#" -eq 0 ]; then
  set -- tests/adapters/opacus tests/stories/test_opacus_randomised_pipelines.py tests/adapters/test_glm_adapters.py tests/core/compare/test_compare.py tests/core/bounds/test_known_values.py -q -rs \
    -k 'opacus or poisson or builtin_rows' -n auto --maxprocesses 4
fi
echo "+ $venv/bin/python -m pytest $*"
exec "$venv/bin/python" -m pytest "$@"
