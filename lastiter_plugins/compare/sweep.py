r"""Epsilon against epochs: the comparison swept over the run's length (the data of ``--plot``),
drawn by :mod:`lastiter_plugins.plot`."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lastiter_plugins import api, plot
from lastiter_plugins.compare.table import compare_rows
from lastiter_plugins.validation import validate_delta

DEFAULT_POINTS = 25
_NOT_DRAWN = ("opacus-gdp",)  # an approximation, not a bound: never drawn


def sweep_epochs(total_epochs: int, points: int = DEFAULT_POINTS) -> list[int]:
    """Integer epoch counts 1 .. total_epochs, at most ``points`` of them, evenly spread."""
    if total_epochs < 1:
        raise ValueError(f"total_epochs must be an integer >= 1. Found {total_epochs!r}.")
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ValueError(f"points must be an integer >= 2. Found {points!r}.")
    return sorted({int(e) for e in np.rint(np.linspace(1, total_epochs, min(points, total_epochs)))})


def _progress(items: Sequence[int], enabled: bool | None):
    """tqdm progress bar on stderr when it is a terminal (or when forced), else the plain items."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety: no tqdm, no bar
        return items
    return tqdm(items, desc="epsilon sweep", unit="point", file=sys.stderr, leave=False)


def epsilon_curves(
    params: Mapping[str, Any],
    delta: float,
    *,
    points: int = DEFAULT_POINTS,
    orders=None,
    progress: bool | None = None,
    unproven: Iterable[str] = (),
) -> tuple[np.ndarray, list[plot.Curve]]:
    """Epsilon of every row of the comparison at epochs 1 .. the scenario's length.

    The last point is the scenario itself (its exact number of steps, a partial
    last epoch included).

    Returns:
      (epochs, curves): epochs as floats (steps / steps per epoch), one
      :class:`Curve` per accountant that gave a number at the scenario's length.
    """
    delta = validate_delta(delta)
    config, assumptions = api.build(**params)
    per_epoch = config.steps_per_epoch
    steps = [e * per_epoch for e in sweep_epochs(config.epochs_started, points) if e * per_epoch < config.steps]
    steps.append(config.steps)
    table: dict[str, list[float]] = {}
    meta: dict[str, Any] = {}
    for i, t in enumerate(_progress(steps, progress)):
        for row in compare_rows(config.replace(steps=t), assumptions, delta, orders, unproven=unproven):
            column = table.setdefault(row.id, [math.nan] * len(steps))
            column[i] = math.nan if row.epsilon is None else row.epsilon
            meta[row.id] = row  # the last point (the scenario) decides validity and labels
    curves = []
    for row_id, values in table.items():
        row = meta[row_id]
        if row_id in _NOT_DRAWN or row.epsilon is None:
            continue
        curves.append(
            plot.Curve(row_id, row.relation, row.protects, row.valid, row.kind, np.array(values, dtype=float))
        )
    return np.array(steps, dtype=float) / per_epoch, curves


def write_plot(
    params: Mapping[str, Any],
    delta: float,
    path: str | Path,
    *,
    points: int = DEFAULT_POINTS,
    title: str | None = None,
    orders=None,
    progress: bool | None = None,
    unproven: Iterable[str] = (),
) -> Path:
    """Sweep the comparison over epochs and write the PNG (see :mod:`lastiter_plugins.plot`).

    Raises:
      PlotDependencyError: matplotlib is missing (an ImportError and a ValueError).
      ValueError: invalid parameters, or the folder of ``path`` does not exist.
    """
    plot.check_can_plot(path)  # fail before the (slow) sweep
    epochs, curves = epsilon_curves(params, delta, points=points, orders=orders, progress=progress, unproven=unproven)
    config, _ = api.build(**params)
    return plot.draw_epsilon_vs_epochs(epochs, curves, path, config=config, delta=delta, title=title)
