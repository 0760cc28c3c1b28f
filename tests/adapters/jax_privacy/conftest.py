"""The jax_privacy adapter's tests run Keras on the JAX backend, on CPU: set before any test module imports Keras
(Keras chooses its backend when it is first imported). Only where jax_privacy is installed (.venv-jax); the test
modules skip themselves elsewhere."""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("jax_privacy") is not None:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
