"""Shared by the jax_privacy adapter tests: the reason they skip without jax_privacy, and small data."""

from __future__ import annotations

import numpy as np

#: Each test module starts with ``pytest.importorskip("jax_privacy", reason=NEEDS_JAX_PRIVACY)``.
NEEDS_JAX_PRIVACY = "needs jax_privacy 2.0 (the jax extra: scripts/test_jax.sh, .venv-jax)"
DELTA = 1e-5


def regression_data(n: int, dim: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype("float32")
    return x, (x @ np.arange(1, dim + 1, dtype="float32") + rng.normal(size=n).astype("float32"))[:, None]


def logistic_data(n: int, dim: int = 4, seed: int = 0, feature_norm: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    from lastiter_plugins.feature_clip import clip_features

    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, dim)) * 2.0).astype("float32")
    y = (x[:, 0] > 0).astype("float32")[:, None]
    return clip_features(x, feature_norm), y
