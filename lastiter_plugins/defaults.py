r"""Defaults and names shared by the core and the command line.

This module imports nothing, so ``lastiter --help`` reads them without loading the numerics
(numpy, scipy, dp-accounting); the registry, the scenarios and compare import them from here.
"""

from __future__ import annotations

#: The bound id that asks for the smallest epsilon of every applicable proven bound
#: (:func:`lastiter_plugins.evaluation.best_of`); the default ``--bound`` of every subcommand.
BEST = "best"

#: The target delta when neither ``--delta`` nor the scenario file gives one (every subcommand).
DEFAULT_DELTA = 1e-5

#: The output formats of ``lastiter compare`` (:func:`lastiter_plugins.compare.format_comparison`).
FORMATS = ("table", "markdown", "json", "csv")

#: The training libraries ``lastiter advise --host`` words its suggestions for (``none``: the core's terms).
HOSTS = ("none", "opacus", "keras", "jax")
