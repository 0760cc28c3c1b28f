"""The suite's pytest hooks: the ``--runslow`` option and the skipping of ``slow`` tests.

Slow suites (full soundness fuzzing, long sweeps) are marked ``@pytest.mark.slow``
and run only with ``pytest --runslow``; randomised sweeps that run in both take their
size from :func:`tests.support.sweep_size` (smaller by default, the full size with
``--runslow``). The layout and the tiers: tests/README.md.
"""

from __future__ import annotations

import os

import pytest

from tests.support import RUNSLOW_ENV

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    # read by tests.support.sweep_size() when the test modules are imported (after this hook)
    os.environ[RUNSLOW_ENV] = "1" if config.getoption("--runslow") else "0"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow suite: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
