"""Helpers the test modules share: the repository root, sweep sizes and parameter factories.

The factories build the keyword parameters of the public API (and the matching
command-line flags) that several test files use, so that a pipeline is described
once: ``pipeline(**overrides)``, ``strongly_convex(**overrides)``, ``cli_flags(params)``.
Test files import them (``from tests.support import pipeline``); each call returns a new dict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the repository root (README.md, docs/, examples/)
ROOT = Path(__file__).resolve().parents[1]

#: set by tests/conftest.py from ``--runslow`` before the test modules are imported
RUNSLOW_ENV = "LASTITER_TESTS_RUNSLOW"


def sweep_size(default: int, runslow: int) -> int:
    """How many random draws a sweep makes: ``default`` in the default run, ``runslow`` with --runslow."""
    return runslow if os.environ.get(RUNSLOW_ENV) == "1" else default


_PIPELINE = {"dataset_size": 1000, "batch_size": 10, "noise_multiplier": 1.0, "steps": 500, "sampling": "cyclic"}

_STRONGLY_CONVEX = {
    "steps": 2000,
    "learning_rate": 0.1,
    "smoothness": 1.0,
    "strong_convexity": 0.1,
    "gradient_norms_within_clip": True,
}


def pipeline(**overrides: Any) -> dict[str, Any]:
    """A small valid pipeline with no loss assumptions: n = 1000, b = 10, z = 1, T = 500, cyclic
    (only composition and the curvature-free bound apply), with ``overrides`` applied."""
    return {**_PIPELINE, **overrides}


def strongly_convex(**overrides: Any) -> dict[str, Any]:
    """:func:`pipeline` with T = 2000 and lam = 0.1-strongly convex, M = 1-smooth losses, eta = 0.1,
    every per-example gradient within the clip: the Ye & Shokri and shifted-interpolation bounds apply
    (with a scheme they cover), with ``overrides`` applied."""
    return {**_PIPELINE, **_STRONGLY_CONVEX, **overrides}


def cli_flags(params: Mapping[str, Any]) -> list[str]:
    """The ``lastiter`` flags describing the keyword parameters ``params`` (None values omitted,
    True booleans as bare flags, False ones omitted)."""
    argv: list[str] = []
    for key, value in params.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def quiet_single_threaded(tf: Any) -> None:
    """TensorFlow for the tests: errors only in its log, one thread each way. Thread counts can be set only
    before TensorFlow starts; a later call finds them set by an earlier test module and leaves them."""
    tf.get_logger().setLevel("ERROR")
    try:
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    except RuntimeError:  # already initialised by another test module
        pass


def imported_modules(path: Path) -> list[str]:
    """Every module a Python file imports, function-level imports included: ``import a.b`` gives ``a.b``,
    ``from a import b`` gives ``a`` and ``a.b``."""
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names
