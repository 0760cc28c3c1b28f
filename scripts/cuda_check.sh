#!/usr/bin/env bash
# On a machine with a CUDA GPU (not part of CI, which has none): the Opacus examples, which train on the GPU
# when there is one, and the Opacus adapter's tests with their models and batches on the GPU
# (LASTITER_TEST_DEVICE=cuda), which runs the adapter's per-step checks on CUDA parameters and gradients.
# Needs this package installed (`pip install -e .`, or `pip install --no-deps --target DIR .` with DIR on
# PYTHONPATH) and torch with CUDA, opacus, dp-accounting, scikit-learn, hypothesis and pytest importable; run from
# the repository root (pytest runs with -P: the installed package, not the checkout's directory, is imported).
# Prints what it ran on; exits non-zero at the first failure. Arguments go to pytest.
set -euo pipefail
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import numpy, opacus, torch
assert torch.cuda.is_available(), "no CUDA device: nothing to check"
print(f"torch {torch.__version__}, opacus {opacus.__version__}, numpy {numpy.__version__}, {torch.cuda.get_device_name(0)}")
PY
python3 examples/opacus_logistic_regression.py --epochs 3
python3 examples/opacus_softmax_regression.py --epochs 3
LASTITER_TEST_DEVICE=cuda python3 -P -m pytest -q -p no:cacheprovider tests/adapters/opacus/test_adapter.py "$@"
