r"""Drawing epsilon against epochs (``lastiter compare --plot``).

The curves come from :func:`lastiter_plugins.compare.epsilon_curves`, which
recomputes the whole comparison at a few numbers of epochs (1 .. the scenario's),
so every line is exactly what the table would print for that length of training;
this module only draws them. Lines: every registry bound that
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
from pathlib import Path

import numpy as np

from lastiter_plugins.config import TrainingConfig
from lastiter_plugins.registry import Protects

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


def check_can_plot(path: str | Path) -> Path:
    """Fail early (before a slow sweep): matplotlib importable, a format it writes, a file we can write.

    Returns:
      The path the figure will be written to: ``path``, with ``.png`` appended when it has no
      suffix (as matplotlib's ``savefig`` does).

    Raises:
      PlotDependencyError: matplotlib is missing (an ImportError and a ValueError).
      ValueError: ``path`` is empty, the suffix is not a format matplotlib writes, the folder of
        ``path`` does not exist, ``path`` is a folder, or it cannot be written (tried: the file is
        opened for appending, and removed again when it did not exist).
    """
    _, FigureCanvasAgg = _matplotlib()
    if not str(path).strip():
        raise ValueError(f"plot path must name a file, e.g. eps.png. Found {str(path)!r}.")
    path = Path(path)
    if not path.suffix:
        path = path.with_name(path.name.rstrip(".") + ".png")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise ValueError(
            f"plot path must end in .png (or another format matplotlib writes: {', '.join(sorted(formats))}). "
            f"Found {str(path)!r}."
        )
    if not path.parent.is_dir():
        raise ValueError(f"plot path must be in an existing folder. Found {str(path)!r}.")
    if path.is_dir():
        raise ValueError(f"plot path must be a file we can write. Found {str(path)!r}, a folder.")
    existed = path.exists()
    try:
        with path.open("ab"):  # appending changes nothing in a file that exists
            pass
    except OSError as exc:
        raise ValueError(f"plot path must be a file we can write. Found {str(path)!r}: {_os_error(exc)}.") from None
    if not existed:
        path.unlink(missing_ok=True)
    return path


def _os_error(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


#: One marker per line, never reused: filled shapes first, then open ones; beyond them,
#: numbered text markers (distinct for any number of lines).
MARKERS = ("o", "s", "D", "^", "v", "<", ">", "p", "h", "*", "X", "P", "d", "H", "8", "x", "+", "1", "2", "3", "4")


def marker(index: int) -> str:
    """The marker of the ``index``-th line of a plot (distinct for every index)."""
    return MARKERS[index] if index < len(MARKERS) else f"${index + 1}$"


def draw_epsilon_vs_epochs(
    epochs: np.ndarray,
    curves: list[Curve],
    path: str | Path,
    *,
    config: TrainingConfig,
    delta: float,
    title: str | None = None,
) -> Path:
    """Write a PNG of epsilon (log scale) against epochs, one line per accountant.

    Args:
      epochs: the x values (steps / steps per epoch).
      curves: one :class:`Curve` per accountant.
      path: where to write the PNG (its folder must exist).

    Raises:
      ValueError: ``path`` cannot be written (see :func:`check_can_plot`), checked before drawing
        and again when writing.
      config: the scenario's training configuration (for the axis labels and title).
      delta: target delta.
      title: figure title (default: the sampling scheme).

    Returns:
      The path written (``path``, with ``.png`` appended when it has no suffix).
    """
    path = check_can_plot(path)
    fig = figure_epsilon_vs_epochs(epochs, curves, config=config, delta=delta, title=title)
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:  # e.g. the disk filled, or the folder went away, during the sweep
        raise ValueError(f"plot path must be a file we can write. Found {str(path)!r}: {_os_error(exc)}.") from None
    return path


def figure_epsilon_vs_epochs(
    epochs: np.ndarray,
    curves: list[Curve],
    *,
    config: TrainingConfig,
    delta: float,
    title: str | None = None,
):
    """The matplotlib Figure :func:`draw_epsilon_vs_epochs` writes (one line per accountant,
    each with its own marker; identical curves share one line)."""
    Figure, FigureCanvasAgg = _matplotlib()

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
    n_valid = n_invalid = 0
    for index, (ids, curve) in enumerate(_merge_identical(curves)):
        y = np.where(np.isfinite(curve.epsilon) & (curve.epsilon > 0), curve.epsilon, np.nan)
        scope = "final model" if curve.protects == Protects.FINAL_MODEL.value else "every iterate"
        label = f"{' = '.join(ids)} ({curve.relation}; {scope})"
        if np.isfinite(y).any() and np.nanmin(y) > top:
            label += f" [off scale: {np.nanmax(y):.3g}]"
        if curve.valid:
            style = {
                "color": valid_colors[n_valid % len(valid_colors)],
                "linestyle": "-" if curve.kind == "last-iterate bound" else "-.",
                "linewidth": 2.0,
                "marker": marker(index),
                "markersize": 5,
            }
            n_valid += 1
        else:
            label = f"NOT VALID here: {label}"
            style = {
                "color": invalid_colors[n_invalid % len(invalid_colors)],
                "linestyle": ":",
                "linewidth": 2.0,
                "marker": marker(index),
                "markersize": 5,
                "fillstyle": "none",
            }
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
    return fig
