r"""Epsilon against epochs for every accountant of the comparison (``lastiter compare --plot``).

The sweep recomputes the whole table of :mod:`lastiter_plugins.compare` at a
few numbers of epochs (1 .. the scenario's), so every line is exactly what the
table would print for that length of training. Lines: every registry bound that
applies (solid), the valid standard accountants (solid), and the standard
accountants that are NOT valid for the pipeline (dashed, grey legend entry), so
the mistake of using them stays visible. Opacus' GDP approximation is left out
(it is not an upper bound). The legend names each line's neighbouring relation
and what it protects.

matplotlib (and tqdm for the progress bar) come with the ``plot`` extra:
``pip install 'lastiter-plugins[plot]'``. They are imported only when a plot is
drawn; the figure is rendered with the Agg canvas directly (no pyplot, no change
to the user's matplotlib backend).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lastiter_plugins import api
from lastiter_plugins.compare import FINAL_MODEL, compare_rows
from lastiter_plugins.conversion import validate_delta

DEFAULT_POINTS = 25
_LEFT_OUT = ("opacus-gdp",)  # an approximation, not a bound: never drawn
_OFF_SCALE_FACTOR = 5.0  # y axis ends this factor above the largest composition-type curve


class PlotDependencyError(ImportError, ValueError):
    """matplotlib is not installed (a ValueError too, so the CLI prints one line)."""


@dataclasses.dataclass(frozen=True)
class Curve:
    """Epsilon of one accountant at each epoch count of the sweep."""

    id: str
    relation: str
    protects: str
    valid: bool
    kind: str
    epsilon: np.ndarray  # NaN where the accountant gave no number


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
) -> tuple[np.ndarray, list[Curve]]:
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
        for row in compare_rows(config.replace(steps=t), assumptions, delta, orders):
            column = table.setdefault(row.id, [math.nan] * len(steps))
            column[i] = math.nan if row.epsilon is None else row.epsilon
            meta[row.id] = row  # the last point (the scenario) decides validity and labels
    curves = []
    for row_id, values in table.items():
        row = meta[row_id]
        if row_id in _LEFT_OUT or row.epsilon is None:
            continue
        curves.append(Curve(row_id, row.relation, row.protects, row.valid, row.kind, np.array(values, dtype=float)))
    return np.array(steps, dtype=float) / per_epoch, curves


def _merge_identical(curves: list[Curve]) -> list[tuple[list[str], Curve]]:
    """Curves in legend order (valid first, smallest final epsilon first); identical
    curves of the same relation and validity share one line (e.g. composition and
    dp-accounting's RDP, which compute the same number)."""

    def final(c: Curve) -> float:
        last = c.epsilon[-1]
        return float(last) if np.isfinite(last) else math.inf

    merged: list[tuple[list[str], Curve]] = []
    for curve in sorted(curves, key=lambda c: (not c.valid, final(c), c.id)):
        for ids, kept in merged:
            same = (kept.relation, kept.valid, kept.protects) == (curve.relation, curve.valid, curve.protects)
            if same and np.allclose(kept.epsilon, curve.epsilon, rtol=1e-9, atol=0.0, equal_nan=True):
                ids.append(curve.id)
                break
        else:
            merged.append(([curve.id], curve))
    return merged


MIN_MATPLOTLIB = (3, 7)  # legend placement "outside lower center"


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotDependencyError(
            "--plot needs matplotlib, which is not installed: pip install 'lastiter-plugins[plot]'."
        ) from exc
    version = tuple(int(p) for p in matplotlib.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_MATPLOTLIB:
        raise PlotDependencyError(
            f"--plot needs matplotlib >= {'.'.join(map(str, MIN_MATPLOTLIB))}. Found {matplotlib.__version__}: "
            "pip install -U 'lastiter-plugins[plot]' 'matplotlib>=3.7'."
        )
    return Figure, FigureCanvasAgg


def plot_epsilon_vs_epochs(
    params: Mapping[str, Any],
    delta: float,
    path: str | Path,
    *,
    points: int = DEFAULT_POINTS,
    title: str | None = None,
    orders=None,
    progress: bool | None = None,
) -> Path:
    """Write a PNG of epsilon (log scale) against epochs, one line per accountant.

    Args:
      params: the keyword-API parameters of the scenario (its length is the last point).
      delta: target delta.
      path: where to write the PNG (its folder must exist).
      points: at most this many epoch counts in the sweep.
      title: figure title (default: the sampling scheme).
      orders: Renyi orders (default: the library's grid).
      progress: show a tqdm bar (default: when stderr is a terminal).

    Returns:
      The path written.

    Raises:
      PlotDependencyError: matplotlib is missing (an ImportError and a ValueError).
      ValueError: invalid parameters, or the folder of ``path`` does not exist.
    """
    Figure, FigureCanvasAgg = _matplotlib()  # fail before the (slow) sweep
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"plot path must be in an existing folder. Found {str(path)!r}.")
    epochs, curves = epsilon_curves(params, delta, points=points, orders=orders, progress=progress)
    config, _ = api.build(**params)

    finite = np.concatenate([c.epsilon[np.isfinite(c.epsilon) & (c.epsilon > 0)] for c in curves] or [np.ones(1)])
    reference = [c.epsilon for c in curves if c.kind != "last-iterate bound"]
    reference_max = max((float(np.nanmax(r)) for r in reference if np.isfinite(r).any()), default=float(finite.max()))
    top = min(float(finite.max()) * 1.5, reference_max * _OFF_SCALE_FACTOR)
    bottom = float(finite.min()) / 1.5

    fig = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    valid_colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
    invalid_colors = ["#7f7f7f", "#bcbd22", "#c49c94", "#aec7e8", "#98df8a", "#ffbb78"]
    markers = "osD^v<>p"
    n_valid = n_invalid = 0
    for ids, curve in _merge_identical(curves):
        y = np.where(np.isfinite(curve.epsilon) & (curve.epsilon > 0), curve.epsilon, np.nan)
        scope = "final model" if curve.protects == FINAL_MODEL else "every iterate"
        label = f"{' = '.join(ids)} ({curve.relation}; {scope})"
        if np.isfinite(y).any() and np.nanmin(y) > top:
            label += f" [off scale: {np.nanmax(y):.3g}]"
        if curve.valid:
            style = {
                "color": valid_colors[n_valid % len(valid_colors)],
                "linestyle": "-" if curve.kind == "last-iterate bound" else "-.",
                "linewidth": 2.0,
                "marker": markers[n_valid % len(markers)],
                "markersize": 4,
            }
            n_valid += 1
        else:
            label = f"NOT VALID here: {label}"
            style = {"color": invalid_colors[n_invalid % len(invalid_colors)], "linestyle": ":", "linewidth": 2.0}
            n_invalid += 1
        ax.plot(epochs, y, label=label, **style)
    ax.set_yscale("log")
    ax.set_ylim(bottom, top)
    ax.set_xlim(0, float(epochs[-1]) * 1.02)
    ax.set_xlabel(f"epochs (passes of {config.steps_per_epoch} steps)")
    ax.set_ylabel(f"epsilon at delta = {delta:g} (log scale)")
    heading = title or f"sampling = {config.sampling.value}"
    ax.set_title(
        f"{heading}\nn={config.dataset_size}, b={config.batch_size}, z={config.noise_multiplier:g}, "
        f"sampling={config.sampling.value}, delta={delta:g}\n"
        "solid: last-iterate bounds (final model only); dash-dot: composition / standard accountants; "
        "dotted: NOT valid here",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    fig.savefig(path, dpi=120)
    return path
