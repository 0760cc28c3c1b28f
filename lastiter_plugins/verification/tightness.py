r"""Tightness report: bound / exact for every applicable bound on a fixed grid of
ground-truth instances (G1, G2, G3), in Renyi form and in (epsilon, delta) form,
as markdown and a PNG.

Regenerate docs/tightness.md and docs/tightness.png with::

    python -m lastiter_plugins.verification.tightness --out docs

Renyi columns: ``bound / exact`` at orders 2, 8, 32, where ``exact`` is the
midpoint of the certified interval of :mod:`lastiter_plugins.lower_end.exact`
(its relative width is given, so every ratio is known to within that much).
(epsilon, delta) columns: the bound's epsilon at delta = 1e-5 (what
``lp.epsilon`` reports: an RDP curve converted, an f-DP profile inverted exactly)
next to the exact epsilon(1e-5) of the instance, i.e. the smallest epsilon with
``max(H_eps(P||Q), H_eps(Q||P)) <= 1e-5`` for the two laws of its last iterate,
from the certified privacy profile (midpoint of a certified interval). A ratio
of 1 means the bound is attained; a ratio below 1 (beyond the certified width)
would be a soundness violation (the report then says so in bold).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

import lastiter_plugins as lp
from lastiter_plugins.lower_end.exact import Instance, g1_params, g2_params, g3_params

REPORT_ORDERS = np.array([2.0, 8.0, 32.0])
PLOT_ORDER = 8.0
DELTA = 1e-5
G3_GRID = {"max_nodes": 1200, "fine_cells": 12000, "tolerance": 2e-4}


@dataclasses.dataclass(frozen=True)
class Panel:
    """One family/scheme with the steps varied along the x axis."""

    title: str
    family: str
    steps: tuple[int, ...]
    make: Callable[[int], dict]  # steps -> params dict
    x0: float = 0.0


def _g3(**kw):
    # b = 1, eta = 0.5, C = 1, z = 1: per-step noise s = 0.5, drift 0.5; D = 2 s
    return g3_params(diameter=1.0, batch_size=1, noise_multiplier=1.0, learning_rate=0.5, **kw)


def _g2(**kw):
    return g2_params(strong_convexity=0.1, learning_rate=1.0, noise_multiplier=1.0, **kw)


PANELS: tuple[Panel, ...] = (
    Panel("G1 cyclic (n=100, b=10, z=1)", "G1", (10, 20, 45, 80, 160, 320),
          lambda t: g1_params(dataset_size=100, batch_size=10, noise_multiplier=1.0, steps=t, sampling="cyclic")),
    Panel("G1 shuffle once (n=100, b=10, z=1)", "G1", (10, 25, 45, 85, 165, 325),
          lambda t: g1_params(dataset_size=100, batch_size=10, noise_multiplier=1.0, steps=t,
                              sampling="shuffle_once")),
    Panel("G1 poisson, add/remove (q=0.01, z=1)", "G1", (10, 100, 300, 1000, 3000),
          lambda t: g1_params(dataset_size=1000, batch_size=10, noise_multiplier=1.0, steps=t, sampling="poisson",
                              relation="add_or_remove_one")),
    Panel("G2 full batch (lam=0.1, eta=1, n=b=10, z=1)", "G2", (1, 4, 16, 64, 256),
          lambda t: _g2(dataset_size=10, batch_size=10, steps=t, sampling="cyclic")),
    Panel("G2 cyclic (lam=0.1, eta=1, n=100, b=10, z=1)", "G2", (10, 20, 45, 80, 160, 320),
          lambda t: _g2(dataset_size=100, batch_size=10, steps=t, sampling="cyclic")),
    Panel("G2 cyclic, short last batch (lam=0.1, eta=1, n=95, b=10, z=1)", "G2", (10, 20, 45, 80, 160, 320),
          lambda t: _g2(dataset_size=95, batch_size=10, steps=t, sampling="cyclic")),
    Panel("G2 shuffle once (lam=0.1, eta=1, n=100, b=10, z=1)", "G2", (10, 20, 45, 80, 160, 320),
          lambda t: _g2(dataset_size=100, batch_size=10, steps=t, sampling="shuffle_once")),
    Panel("G2 reshuffle (lam=0.1, eta=1, n=4, b=1, z=1)", "G2", (1, 2, 4, 8, 12, 16),
          lambda t: _g2(dataset_size=4, batch_size=1, steps=t, sampling="reshuffle")),
    Panel("G2 random batch (lam=0.5, eta=1, n=20, b=5, z=1)", "G2", (1, 2, 4, 6, 8, 10),
          lambda t: g2_params(strong_convexity=0.5, learning_rate=1.0, dataset_size=20, batch_size=5,
                              noise_multiplier=1.0, steps=t, sampling="random_batch")),
    Panel("G2 poisson, add/remove (l2 outside the clip, lam=0.5, eta=1, n=20, b=5)", "G2", (1, 2, 4, 6, 8, 10),
          lambda t: g2_params(strong_convexity=0.5, l2_outside_clip=True, learning_rate=1.0, dataset_size=20,
                              batch_size=5, noise_multiplier=1.0, steps=t, sampling="poisson",
                              relation="add_or_remove_one")),
    Panel("G2 poisson, replace-one (l2 outside the clip, lam=0.5, eta=1, n=20, b=5)", "G2", (1, 2, 4, 6, 8, 10),
          lambda t: g2_params(strong_convexity=0.5, l2_outside_clip=True, learning_rate=1.0, dataset_size=20,
                              batch_size=5, noise_multiplier=1.0, steps=t, sampling="poisson",
                              relation="replace_one")),
    Panel("G3 cyclic (D = 2s, n=4, b=1)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="cyclic")),
    Panel("G3 shuffle once (D = 2s, n=4, b=1)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="shuffle_once")),
    Panel("G3 reshuffle (D = 2s, n=4, b=1)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="reshuffle")),
    Panel("G3 random batch (D = 2s, q=1/4)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="random_batch")),
    Panel("G3 poisson, replace-one (D = 2s, q=1/4)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="poisson", relation="replace_one")),
    Panel("G3 poisson, add/remove (D = 2s, q=1/4)", "G3", (1, 2, 4, 8, 16, 32),
          lambda t: _g3(dataset_size=4, steps=t, sampling="poisson", relation="add_or_remove_one")),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Row:
    panel: str
    steps: int
    bound: str
    proven: bool
    ratios: np.ndarray  # bound / exact at REPORT_ORDERS
    plot_ratio: float  # at PLOT_ORDER
    exact: np.ndarray
    relative_width: float
    epsilon: float  # the bound's epsilon at DELTA
    exact_epsilon: tuple[float, float]  # certified interval for the instance's epsilon at DELTA
    below: bool  # bound < certified lower end somewhere (Renyi or epsilon)

    @property
    def epsilon_ratio(self) -> float:
        lo, up = self.exact_epsilon
        mid = 0.5 * (lo + up) if math.isfinite(up) else lo
        return self.epsilon / mid if mid > 0 else math.inf


def compute(panels=PANELS, progress: bool = False) -> list[Row]:
    """Every (panel, steps, applicable bound) ratio."""
    orders = np.unique(np.concatenate((REPORT_ORDERS, [PLOT_ORDER])))
    pick = np.searchsorted(orders, REPORT_ORDERS)
    rows = []
    for panel in panels:
        for t in panel.steps:
            params = panel.make(t)
            instance = Instance(panel.family, params, x0=panel.x0)
            options = G3_GRID if panel.family == "G3" else {"per_order": True}
            exact = instance.exact(orders, hockey_stick=True, **options)
            assert exact.hockey_stick is not None  # asked for
            exact_eps = exact.hockey_stick.epsilon(DELTA)
            est = exact.estimate
            width = float(np.max(exact.width / np.where(est > 0, est, 1.0)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for bid, app in lp.applicable_bounds(**params).items():
                    if not app.applies:
                        continue
                    try:
                        values = lp.rdp(bid, orders, **params)
                    except lp.NotApplicableError:  # a privacy loss distribution: an epsilon, no Renyi curve
                        values = np.full(orders.shape, np.nan)
                    eps = lp.epsilon(bid, DELTA, **params).epsilon
                    ratio = values / est
                    below = bool(np.any(values < exact.lower * (1 - 1e-9))) or eps < exact_eps[0] * (1 - 1e-9)
                    rows.append(
                        Row(panel.title, t, bid, bid not in lp.BOUNDS or lp.BOUNDS[bid].proof.proven, ratio[pick],
                            float(ratio[np.searchsorted(orders, PLOT_ORDER)]), est[pick], width, eps, exact_eps,
                            below)
                    )  # fmt: skip
            if progress:
                print(f"  {panel.title}: T={t} done", file=sys.stderr, flush=True)
    return rows


def _eps_interval(lo: float, up: float) -> str:
    if not math.isfinite(up):
        return f">= {lo:.4g}"
    mid = 0.5 * (lo + up)
    return f"{mid:.4g} +- {0.5 * (up - lo) / mid:.0e}" if mid > 0 else "0"


def to_markdown(rows: list[Row], seconds: float, command: str) -> str:
    head = [
        "# Tightness of the last-iterate bounds against exact divergences",
        "",
        f"Generated by `{command}` in {seconds:.0f} s (lastiter-plugins {lp.__version__}). Do not edit by hand.",
        "",
        "Each row: one ground-truth instance (docs/verification.md) and one bound that applies to it.",
        "",
        "* Renyi: `bound/exact` at orders 2, 8, 32, where `exact` is the midpoint of the certified interval for",
        "  the Renyi divergence of the last iterate (relative width in the column `width`: every ratio is exact",
        "  to within that). For an f-DP bound the Renyi curve is the one its profile implies.",
        f"* (epsilon, delta): `eps` is the bound's epsilon at delta = {DELTA:g} (as `lp.epsilon` reports it: an RDP",
        "  curve converted, an f-DP profile inverted exactly); `exact eps` is the exact epsilon of the instance at",
        "  the same delta, from the certified privacy profile (hockey-stick divergence) of the two laws of its",
        "  last iterate (midpoint +- relative half-width); `eps/exact` their ratio.",
        "",
        "1 = the bound is attained; below 1 = a soundness violation (bold). `composition` certifies every iterate;",
        "`best` is the smallest epsilon over the proven bounds (its Renyi columns are the per-order minimum); an",
        "unproven bound is marked and never enters `best`.",
        "",
    ]
    out = list(head)
    for panel in dict.fromkeys(r.panel for r in rows):
        out += [f"## {panel}", "",
                "| T | bound | a=2 | a=8 | a=32 | eps | eps/exact | exact D(2), D(8), D(32) | exact eps | width |",
                "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in (r for r in rows if r.panel == panel):
            cells = [("-" if math.isnan(x) else f"**{x:.3g}**" if r.below else f"{x:.3g}") for x in r.ratios]
            exact = ", ".join(f"{x:.3g}" for x in r.exact)
            name = r.bound if r.proven else f"{r.bound} (unproven)"
            eps_ratio = f"{r.epsilon_ratio:.3g}" if math.isfinite(r.epsilon_ratio) else "-"
            if r.below:
                eps_ratio = f"**{eps_ratio}**"
            out.append(
                f"| {r.steps} | {name} | {' | '.join(cells)} | {r.epsilon:.4g} | {eps_ratio} | {exact} | "
                f"{_eps_interval(*r.exact_epsilon)} | {r.relative_width:.1e} |"
            )
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
    n_rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(12, 3.2 * n_rows), squeeze=False)
    for ax, panel in zip(np.ravel(axes), panels, strict=False):
        sub = [r for r in rows if r.panel == panel and r.bound not in ("best", "kong-ribero-curvature-free")]
        ax.set_title(panel, fontsize=9)
        drawn = 0
        for bid in dict.fromkeys(r.bound for r in sub):
            # rows without a Renyi curve (the random-batch and Poisson mixtures) have no ratio to draw
            pts = sorted((r.steps, r.plot_ratio) for r in sub if r.bound == bid and r.plot_ratio > 0)
            if not pts:
                continue
            style = "--" if bid == "composition" else "-"
            label = bid if all(r.proven for r in sub if r.bound == bid) else f"{bid} (unproven)"
            ax.plot(*zip(*pts, strict=True), marker="o", label=label, linestyle=style)
            drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no Renyi curve here: see the epsilon columns", ha="center", transform=ax.transAxes)
            ax.axis("off")
            continue
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("steps T")
        ax.set_ylabel(f"bound / exact at order {PLOT_ORDER:g}")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for ax in np.ravel(axes)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("Last-iterate RDP bounds / exact divergence (1 = tight; kong-ribero-curvature-free off scale)")
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=100)
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
