r"""Tightness report: bound / exact divergence for every applicable bound on a
fixed grid of ground-truth instances (G1, G2, G3), as markdown and a PNG.

Regenerate docs/tightness.md and docs/tightness.png with::

    python -m lastiter_plugins.verification.tightness --out docs

``exact`` is the midpoint of the certified interval of
:mod:`lastiter_plugins.verification.exact`; the table also gives the interval's
relative width, so every ratio is known to within that much. A ratio of 1 means
the bound is attained; a ratio below 1 would be a soundness violation (the
report then says so in bold).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import lastiter_plugins as lp
from lastiter_plugins.verification.exact import Instance, g1_params, g2_params, g3_params

REPORT_ORDERS = np.array([2.0, 8.0, 32.0])
PLOT_ORDER = 8.0
G3_GRID = {"max_nodes": 1200, "fine_cells": 12000, "tolerance": 2e-4}


@dataclasses.dataclass(frozen=True)
class Panel:
    """One family/scheme with the steps varied along the x axis."""

    title: str
    family: str
    steps: tuple[int, ...]
    make: object  # steps -> params dict
    x0: float = 0.0


def _g3(**kw):
    # b = 1, eta = 0.5, C = 1, z = 1: per-step noise s = 0.5, drift 0.5; D = 2 s
    return g3_params(diameter=1.0, batch_size=1, noise_multiplier=1.0, learning_rate=0.5, **kw)


PANELS: tuple[Panel, ...] = (
    Panel("G1 cyclic (n=100, b=10, z=1)", "G1", (10, 20, 45, 80, 160, 320),
          lambda t: g1_params(dataset_size=100, batch_size=10, noise_multiplier=1.0, steps=t, sampling="cyclic")),
    Panel("G1 poisson, add/remove (q=0.01, z=1)", "G1", (10, 100, 300, 1000, 3000),
          lambda t: g1_params(dataset_size=1000, batch_size=10, noise_multiplier=1.0, steps=t, sampling="poisson",
                              relation="add_or_remove_one")),
    Panel("G2 cyclic (lam=0.1, eta=1, n=100, b=10, z=1)", "G2", (10, 20, 45, 80, 160, 320),
          lambda t: g2_params(strong_convexity=0.1, learning_rate=1.0, dataset_size=100, batch_size=10,
                              noise_multiplier=1.0, steps=t, sampling="cyclic")),
    Panel("G2 shuffle once (lam=0.1, eta=1, n=100, b=10, z=1)", "G2", (10, 20, 45, 80, 160, 320),
          lambda t: g2_params(strong_convexity=0.1, learning_rate=1.0, dataset_size=100, batch_size=10,
                              noise_multiplier=1.0, steps=t, sampling="shuffle_once")),
    Panel("G2 random batch (lam=0.5, eta=1, n=20, b=5, z=1)", "G2", (1, 2, 4, 6, 8, 10),
          lambda t: g2_params(strong_convexity=0.5, learning_rate=1.0, dataset_size=20, batch_size=5,
                              noise_multiplier=1.0, steps=t, sampling="random_batch")),
    Panel("G3 cyclic (D = 2s, n=4, b=1)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="cyclic")),
    Panel("G3 random batch (D = 2s, q=1/4)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="random_batch")),
    Panel("G3 poisson, add/remove (D = 2s, q=1/4)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="poisson", relation="add_or_remove_one")),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Row:
    panel: str
    steps: int
    bound: str
    ratios: np.ndarray  # bound / exact at REPORT_ORDERS
    plot_ratio: float  # at PLOT_ORDER
    exact: np.ndarray
    relative_width: float
    below: bool  # bound < certified lower end somewhere


def compute(panels=PANELS, progress: bool = False) -> list[Row]:
    """Every (panel, steps, applicable bound) ratio."""
    orders = np.unique(np.concatenate((REPORT_ORDERS, [PLOT_ORDER])))
    rows = []
    for panel in panels:
        for t in panel.steps:
            params = panel.make(t)
            instance = Instance(panel.family, params, x0=panel.x0)
            exact = instance.exact(orders, **(G3_GRID if panel.family == "G3" else {"per_order": True}))
            est = exact.estimate
            width = float(np.max(exact.width / np.where(est > 0, est, 1.0)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                apps = lp.applicable_bounds(**params)
                for bid, app in apps.items():
                    if not app.applies:
                        continue
                    values = lp.rdp(bid, orders, **params)
                    ratio = values / est
                    pick = np.searchsorted(orders, REPORT_ORDERS)
                    rows.append(
                        Row(panel.title, t, bid, ratio[pick], float(ratio[np.searchsorted(orders, PLOT_ORDER)]),
                            est[pick], width, bool(np.any(values < exact.lower * (1 - 1e-9))))
                    )  # fmt: skip
            if progress:
                print(f"  {panel.title}: T={t} done", file=sys.stderr)
    return rows


def to_markdown(rows: list[Row], seconds: float, command: str) -> str:
    head = [
        "# Tightness of the last-iterate bounds against exact divergences",
        "",
        f"Generated by `{command}` in {seconds:.0f} s (lastiter-plugins {lp.__version__}). Do not edit by hand.",
        "",
        "Each row: one ground-truth instance (docs/verification.md) and one bound that applies to it;",
        "`bound/exact` at Renyi orders 2, 8, 32, where `exact` is the midpoint of the certified interval",
        "for the divergence of the last iterate (its relative width is the last column: every ratio is",
        "exact to within that). 1 = the bound is attained; below 1 = a soundness violation (bold).",
        "`composition` certifies every iterate; `best` is the per-order minimum.",
        "",
    ]
    out = list(head)
    for panel in dict.fromkeys(r.panel for r in rows):
        out += [f"## {panel}", "", "| T | bound | a=2 | a=8 | a=32 | exact D(2), D(8), D(32) | width |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in (r for r in rows if r.panel == panel):
            cells = [(f"**{x:.3g}**" if r.below else f"{x:.3g}") for x in r.ratios]
            exact = ", ".join(f"{x:.3g}" for x in r.exact)
            out.append(f"| {r.steps} | {r.bound} | {' | '.join(cells)} | {exact} | {r.relative_width:.1e} |")
        out.append("")
    violations = [r for r in rows if r.below]
    out.append(f"Soundness violations in this grid: {len(violations)}.")
    return "\n".join(out) + "\n"


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(r.panel for r in rows))
    cols = 2
    fig, axes = plt.subplots(math.ceil(len(panels) / cols), cols, figsize=(12, 3.2 * math.ceil(len(panels) / cols)))
    for ax, panel in zip(np.ravel(axes), panels, strict=False):
        sub = [r for r in rows if r.panel == panel and r.bound not in ("best", "kong-ribero-curvature-free")]
        for bid in dict.fromkeys(r.bound for r in sub):
            pts = sorted((r.steps, r.plot_ratio) for r in sub if r.bound == bid)
            ax.plot(*zip(*pts, strict=True), marker="o", label=bid, linestyle="--" if bid == "composition" else "-")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("steps T")
        ax.set_ylabel(f"bound / exact at order {PLOT_ORDER:g}")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for ax in np.ravel(axes)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("Last-iterate RDP bounds / exact divergence (1 = tight; kong-ribero-curvature-free off scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write tightness.md and tightness.png.")
    parser.add_argument("--out", default="docs", help="output folder (default docs)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = compute(progress=True)
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m lastiter_plugins.verification.tightness --out docs"
    (out / "tightness.md").write_text(to_markdown(rows, seconds, command))
    plot(rows, out / "tightness.png")
    print(f"wrote {out / 'tightness.md'} and {out / 'tightness.png'} ({len(rows)} rows, {seconds:.0f} s)")
    return 1 if any(r.below for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
