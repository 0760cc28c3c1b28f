"""The jax_privacy adapter's tests run Keras on the JAX backend, on CPU: set before any test module imports Keras
(Keras chooses its backend when it is first imported). Only where jax_privacy is installed (.venv-jax); the test
modules skip themselves elsewhere (six skips in the main .venv, tests/README.md). scripts/test_jax.sh sets
LASTITER_REQUIRE_JAX_PRIVACY=1: there jax_privacy must import, so a broken environment fails instead of skipping."""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("jax_privacy") is not None:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

if os.environ.get("LASTITER_REQUIRE_JAX_PRIVACY") == "1":
    import jax_privacy  # noqa: F401  (an ImportError here is the environment's fault, not a reason to skip)
