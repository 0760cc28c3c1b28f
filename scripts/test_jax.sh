#!/usr/bin/env bash
# Run the jax_privacy adapter tests (Keras 3 on JAX, and the JAX API) in their own venv.
#
# jax_privacy 2.0 needs Python >= 3.11, dp-accounting >= 0.6 and numpy 2, and TF Privacy 0.9 (the main .venv)
# pins dp-accounting 0.4.3 and numpy < 2: the two cannot share an environment. This script keeps a venv with the
# project installed editable with its `jax` extra (jax_privacy, jax, Keras 3.15, dp-accounting 0.6), pytest,
# pytest-xdist and hypothesis, pinned by constraints/jax.txt. CPU only (JAX_PLATFORMS=cpu), Keras on the JAX
# backend (KERAS_BACKEND=jax).
#
# Usage (from anywhere):
#   scripts/test_jax.sh                 # default selection, see below
#   scripts/test_jax.sh PYTEST_ARGS...  # e.g. tests/adapters/jax_privacy/test_keras.py -x
# Environment:
#   JAX_VENV  venv folder (default .venv-jax in the repo root; git-ignored)
#   PYTHON    interpreter that creates the venv (default python3; must be 3.11 or 3.12: both are tested,
#             scripts/test_environments.sh runs this script with each)
#
# Default selection: the jax_privacy adapter (tests/adapters/jax_privacy/: real Keras fits and JAX loops on CPU,
# the strategies, the calibration, jax_privacy's numbers in compare) and the one-number story's jax_privacy
# route, the packaging checks of the jax extra (constraints/jax.txt within its ranges, the example's imports within
# it), on every core (pytest-xdist, at most 4 workers, a file's tests on one worker). About 70 s of CPU.
# Exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${JAX_VENV:-.venv-jax}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "+ creating $venv with $python"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q -c constraints/jax.txt -e ".[jax]" pytest pytest-xdist hypothesis

version="$("$venv/bin/python" -c 'import sys, importlib.metadata as m; print(m.version("jax-privacy"), m.version("keras"), m.version("jax"), "python", sys.version.split()[0])')"
case "$version" in
  "2.0."*" 3.15."*) echo "+ jax-privacy, keras, jax: $version in $venv" ;;
  *)
    echo "expected jax-privacy 2.0.x and keras 3.15.x in $venv, found jax-privacy, keras, jax: $version" >&2
    exit 1
    ;;
esac

# LASTITER_REQUIRE_JAX_PRIVACY: the jax_privacy tests fail rather than skip when jax_privacy does not import
export KERAS_BACKEND=jax JAX_PLATFORMS=cpu LASTITER_REQUIRE_JAX_PRIVACY=1
if [ "$#" -eq 0 ]; then
  set -- tests/adapters/jax_privacy tests/stories/test_one_number.py tests/stories/test_packaging.py \
    -k 'not packaging.py or jax_privacy or constraints' -q -rs -n auto --maxprocesses 4 --dist loadfile
fi
echo "+ $venv/bin/python -m pytest $*"
exec "$venv/bin/python" -m pytest "$@"
