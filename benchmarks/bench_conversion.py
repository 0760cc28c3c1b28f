"""RDP -> (epsilon, delta): how much the grid conversion loses, and what the exact one costs.

On the seeded configurations of tests/core/test_conversion.py (1000 linear curves
rho*alpha, rho log-uniform in [1e-6, 1e3], delta log-uniform in [1e-12, 1e-2]; 1000
non-linear curves, a fifth of them the sampled Gaussian composed T times), compares
with the continuous optimum of the same curve, computed independently there:
(a) the grid conversion on the default grid (``rdp_to_epsilon``) and (b) the new one
(``epsilon_of_linear_rdp`` for linear curves, ``refine_epsilon`` for the others).
Prints a markdown table. Run: ``.venv/bin/python benchmarks/bench_conversion.py``.
"""

from __future__ import annotations

import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_conversion import (  # the test's configurations and reference, not a copy
    curve_reference,
    linear_configurations,
    linear_reference,
    nonlinear_configurations,
)

from lastiter_plugins.conversion import (
    OrderGridWarning,
    epsilon_of_linear_rdp,
    rdp_to_epsilon,
    refine_epsilon,
)
from lastiter_plugins.validation import DEFAULT_ORDERS


def _gap(value: float, reference: float) -> float:
    return value / reference - 1.0 if reference > 0 else (0.0 if value == 0 else np.inf)


def _row(name: str, gaps: list[float], seconds: list[float], below: int, extra: str = "") -> str:
    g = np.asarray(gaps)
    return (
        f"| {name} | {len(g)} | {g.max():.2e} | {np.median(g):.2e} | "
        f"{below} | {1e6 * np.median(seconds):.0f} | {extra} |"
    )


def main() -> None:
    warnings.simplefilter("ignore", OrderGridWarning)
    rows = []

    grid_gaps, grid_t, new_gaps, new_t, below = [], [], [], [], 0
    for rho, delta in linear_configurations():
        ref = linear_reference(rho, delta)
        curve = rho * DEFAULT_ORDERS
        t0 = time.perf_counter()
        grid, _ = rdp_to_epsilon(DEFAULT_ORDERS, curve, delta)
        t1 = time.perf_counter()
        new, _ = epsilon_of_linear_rdp(rho, delta)
        t2 = time.perf_counter()
        grid_gaps.append(_gap(grid, ref))
        new_gaps.append(_gap(new, ref))
        grid_t.append(t1 - t0)
        new_t.append(t2 - t1)
        below += new < ref * (1 - 1e-12) - 1e-12
    rows.append(_row("linear, grid (old)", grid_gaps, grid_t, 0))
    rows.append(_row("linear, `epsilon_of_linear_rdp`", new_gaps, new_t, below, "no rdp calls"))

    by_family: dict[str, tuple[list, list, list, list, list]] = {}
    for curve, delta in nonlinear_configurations():
        family = "sampled Gaussian x T" if curve.name.startswith("sgm") else "other non-linear"
        stats = by_family.setdefault(family, ([], [], [], [], []))
        orders = curve.orders
        values = curve.rdp_at(orders)
        ref = curve_reference(curve, delta, hi=float(orders.max()))
        calls: list[int] = []

        def rdp_at(new_orders, curve=curve, calls=calls):
            calls.append(new_orders.size)
            return curve.rdp_at(new_orders)

        t0 = time.perf_counter()
        grid, _ = rdp_to_epsilon(orders, values, delta)
        t1 = time.perf_counter()
        new, _ = refine_epsilon(rdp_at, orders, values, delta)
        t2 = time.perf_counter()
        stats[0].append(_gap(grid, ref))
        stats[1].append(_gap(new, ref))
        stats[2].append(t1 - t0)
        stats[3].append(t2 - t1)
        stats[4].append((len(calls), sum(calls), new < ref * (1 - 1e-12) - 1e-12))
    for family, (g_gaps, n_gaps, g_t, n_t, work) in by_family.items():
        n_calls = np.array([w[0] for w in work])
        n_orders = np.array([w[1] for w in work])
        rows.append(_row(f"{family}, grid (old)", g_gaps, g_t, 0))
        rows.append(
            _row(
                f"{family}, `refine_epsilon`",
                n_gaps,
                n_t,
                sum(w[2] for w in work),
                f"rdp calls: mean {n_calls.mean():.2f}, max {n_calls.max()}; orders: mean {n_orders.mean():.1f}, "
                f"max {n_orders.max()}",
            )
        )

    print(f"RDP -> (epsilon, delta) against the continuous optimum; {platform.processor() or platform.machine()}")
    print()
    print("| curves, conversion | n | max rel. gap | median rel. gap | below optimum | median us | notes |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("gap = epsilon / continuous optimum - 1; 'below optimum' counts results under the independent reference")
    print("(must be 0); time per conversion excludes evaluating the curve (the refinement's rdp calls included).")


if __name__ == "__main__":
    main()
