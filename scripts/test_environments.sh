#!/usr/bin/env bash
# The second step of .ci/run, after the README's test command (scripts/test.sh), in the
# same .venv: what is slow or needs environments of its own.
#   1. packaging (tests marked `packaging`: python -m build, twine check, the wheel with the
#      `opacus` extra installed next to an existing torch);
#   2. the core and dp-accounting adapter tests against dp-accounting 0.6.x in a second venv
#      (.venv-dpa06, pinned by constraints/dpa06.txt);
#   3. the Opacus adapter and comparison tests against Opacus 1.5.x in a third venv
#      (.venv-opacus15, pinned by constraints/opacus15.txt);
#   4. the jax_privacy adapter tests (Keras 3 on JAX, the JAX API; CPU) in a venv of their own, with Python 3.11
#      (.venv-jax) and with Python 3.12 (.venv-jax312), pinned by constraints/jax.txt (scripts/test_jax.sh; TF
#      Privacy's dp-accounting and numpy pins cannot share an environment with jax_privacy);
#   5. the randomised ground-truth and property sweeps at full size and the fixed-seed subset of the
#      soundness fuzzing (--runslow; each takes a minute or more of CPU, too long for the README's
#      command; the full soundness fuzzing, about 100 min of CPU, stays by hand: tests/README.md, tier 3).
# Every step runs even when an earlier one fails; the exit status is the first failing
# step's. A fixed selection that collects no test (pytest's 5) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/_steps.sh

step .venv/bin/python -m pytest -q -m packaging tests/stories/test_packaging.py
step env PIP_CONSTRAINT="$PWD/constraints/dpa06.txt" bash scripts/test_dp_accounting_06.sh
step bash scripts/test_opacus_15.sh
# An interpreter of version $1: python$1 where it runs (a pyenv shim on PATH fails when that version is not
# the active one), else pyenv's install of it; the bare name otherwise (the step then fails, naming it).
python_of() {
  if "python$1" --version >/dev/null 2>&1; then echo "python$1"; return; fi
  local found
  found="$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$1".*/bin/"python$1" 2>/dev/null | sort -V | tail -1)"
  echo "${found:-python$1}"
}
step env PYTHON="${PYTHON311:-$(python_of 3.11)}" JAX_VENV=.venv-jax bash scripts/test_jax.sh
step env PYTHON="${PYTHON312:-$(python_of 3.12)}" JAX_VENV=.venv-jax312 bash scripts/test_jax.sh
step .venv/bin/python -m pytest -q --runslow -n auto --maxprocesses 4 tests/core/verification/test_ground_truth.py \
  tests/core/test_properties.py tests/core/verification/test_verification.py::test_fuzz_subset_fast

if [ "${#failed[@]}" -ne 0 ]; then
  echo "test_environments.sh: steps that failed:" >&2
  printf '  %s\n' "${failed[@]}" >&2
fi
exit "$first_status"
