r"""Soundness fuzzing: random instances of G1, G2, G3 meeting each bound's
assumptions; every applicable bound must be >= the certified lower end of the
exact divergence, at every checked order.

Full run (>= 1000 checks per bound; minutes)::

    python -m lastiter_plugins.verification.fuzz --checks-per-bound 1000 --json fuzz.json

The default test run uses a small fixed-seed subset (tests/test_verification.py);
``pytest --runslow`` runs the full one.

An instance "meets a bound's assumptions" exactly when
:func:`lastiter_plugins.applicable_bounds` says the bound applies to its
parameters: the draws below produce parameters that truthfully describe the
instance (M, m, lam, D, clipping), and the registry decides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np

import lastiter_plugins as lp
from lastiter_plugins.verification.exact import ExactDivergence, Instance, g1_params, g2_params, g3_params

#: Orders at which bounds are compared to the truth (integers: the SGM terms are exact there).
CHECK_ORDERS = np.array([1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0])
#: Relative slack for the comparison of two floating-point numbers (the exact side is already certified).
RELATIVE_SLACK = 1e-9

# Grids used while fuzzing G3 (the error terms they give are part of each record).
G3_FAST = {"max_nodes": 500, "fine_cells": 4000, "tolerance": 1e-3}
G3_FULL = {"max_nodes": 900, "fine_cells": 8000, "tolerance": 5e-4}


@dataclasses.dataclass(frozen=True)
class Check:
    """One bound on one instance, at every checked order."""

    instance: Instance
    bound: str
    orders: np.ndarray
    bound_values: np.ndarray
    exact: ExactDivergence

    @property
    def violations(self) -> np.ndarray:
        """Orders where the bound is below the certified lower end of the truth."""
        slack = RELATIVE_SLACK * np.maximum(1.0, np.abs(self.bound_values))
        return self.orders[self.bound_values < self.exact.lower - slack]

    @property
    def ratios(self) -> np.ndarray:
        """bound / exact (estimate); inf where the truth is 0."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.exact.estimate > 0, self.bound_values / self.exact.estimate, np.inf)

    def describe(self) -> str:
        lines = [f"{self.bound} on {self.instance.describe()}"]
        for a, b, lo, up in zip(self.orders, self.bound_values, self.exact.lower, self.exact.upper, strict=True):
            flag = "  <-- VIOLATION" if a in self.violations else ""
            lines.append(f"  alpha={a:g}: bound={b:.10g}  exact in [{lo:.10g}, {up:.10g}]{flag}")
        lines.append(f"  ({self.exact.detail})")
        return "\n".join(lines)


def check_instance(
    instance: Instance, orders: np.ndarray = CHECK_ORDERS, exact_options: dict | None = None
) -> list[Check]:
    """Compare every applicable bound (``best`` included) with the exact divergence."""
    apps = lp.applicable_bounds(**instance.params)
    ids = [bid for bid, app in apps.items() if app.applies]
    if not ids:
        return []
    exact = instance.exact(orders, **(exact_options or {}))
    return [Check(instance, bid, orders, lp.rdp(bid, orders, **instance.params), exact) for bid in ids]


# ------------------------------------------------------------------ random draws


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _batching(rng: np.random.Generator, *, max_n: int, full_batch_prob: float, divisible_prob: float):
    """(n, b) with sometimes b = n and sometimes b | n."""
    b = int(rng.integers(1, 9))
    u = rng.uniform()
    if u < full_batch_prob:
        return b, b
    if u < full_batch_prob + divisible_prob:
        return b * int(rng.integers(2, max(3, max_n // b))), b
    return int(rng.integers(b, max_n + 1)), b


def draw_g1(rng: np.random.Generator, sampling: str, relation: str = "replace_one") -> Instance:
    """Linear losses. Fixed batches: any T up to 6 passes; sampled: T <= 400."""
    n, b = _batching(rng, max_n=60, full_batch_prob=0.15, divisible_prob=0.3)
    per_epoch = math.ceil(n / b)
    steps = (
        int(rng.integers(1, 6 * per_epoch + 2))
        if sampling in ("cyclic", "shuffle_once", "reshuffle")
        else int(rng.integers(1, 401))
    )
    params = g1_params(
        dataset_size=n,
        batch_size=b,
        noise_multiplier=_log_uniform(rng, 0.3, 5.0),
        steps=steps,
        learning_rate=_log_uniform(rng, 1e-3, 1.0),
        clip_norm=_log_uniform(rng, 0.1, 10.0),
        sampling=sampling,
        relation=relation,
    )
    return Instance("G1", params)


def draw_g2(rng: np.random.Generator, sampling: str) -> Instance:
    """Strongly convex quadratics; eta = u / lam with u in (0, 1] (u = 1: rho = 0, Kong-Ribero only)."""
    n, b = _batching(rng, max_n=60, full_batch_prob=0.1, divisible_prob=0.5)
    per_epoch = math.ceil(n / b)
    lam = _log_uniform(rng, 1e-3, 2.0)
    u = 1.0 if rng.uniform() < 0.05 else float(rng.uniform(0.01, 0.99))
    if sampling == "random_batch":
        steps = int(rng.integers(1, 9))
        if n == b:
            n = 2 * b  # ye-shokri-random needs l >= 2; q < 1 keeps the enumeration meaningful
    else:
        steps = int(rng.integers(1, 6 * per_epoch + 2))
    params = g2_params(
        strong_convexity=lam,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=_log_uniform(rng, 0.3, 5.0),
        steps=steps,
        learning_rate=u / lam,
        clip_norm=_log_uniform(rng, 0.1, 10.0),
        sampling=sampling,
    )
    return Instance("G2", params)


def draw_g3(rng: np.random.Generator, sampling: str, relation: str = "replace_one", max_steps: int = 10) -> Instance:
    """Projected walk with D / s in [0.2, 5], s = eta z C / b the per-step noise."""
    b = int(rng.integers(1, 6))
    l_max = 5 if sampling in ("shuffle_once", "reshuffle") else 8
    n = b * int(rng.integers(1, l_max + 1)) if rng.uniform() < 0.5 else int(rng.integers(b, b * l_max + 1))
    z = _log_uniform(rng, 0.5, 4.0)
    lr = _log_uniform(rng, 1e-2, 1.0)
    c = _log_uniform(rng, 0.1, 10.0)
    s = lr * z * c / b
    diameter = _log_uniform(rng, 0.2, 5.0) * s
    steps = int(rng.integers(1, max_steps + 1))
    params = g3_params(
        diameter=diameter,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=z,
        steps=steps,
        learning_rate=lr,
        clip_norm=c,
        sampling=sampling,
        relation=relation,
    )
    x0 = float(rng.uniform(-0.5, 0.5)) * diameter if rng.uniform() < 0.5 else 0.0
    return Instance("G3", params, x0=x0)


Drawer = Callable[[np.random.Generator], Instance]

#: Instance families on which each bound can apply (the registry still decides per draw).
TARGETS: dict[str, list[tuple[str, Drawer]]] = {
    "kong-ribero-cyclic": [
        ("G1 cyclic", lambda r: draw_g1(r, "cyclic")),
        ("G1 shuffle_once", lambda r: draw_g1(r, "shuffle_once")),
        ("G2 cyclic", lambda r: draw_g2(r, "cyclic")),
        ("G2 shuffle_once", lambda r: draw_g2(r, "shuffle_once")),
        ("G3 cyclic", lambda r: draw_g3(r, "cyclic")),
        ("G3 shuffle_once", lambda r: draw_g3(r, "shuffle_once")),
    ],
    "kong-ribero-bounded": [
        ("G3 cyclic", lambda r: draw_g3(r, "cyclic")),
        ("G3 shuffle_once", lambda r: draw_g3(r, "shuffle_once")),
        ("G3 reshuffle", lambda r: draw_g3(r, "reshuffle")),
        ("G3 random_batch", lambda r: draw_g3(r, "random_batch")),
    ],
    "kong-ribero-curvature-free": [
        ("G1 cyclic", lambda r: draw_g1(r, "cyclic")),
        ("G1 reshuffle", lambda r: draw_g1(r, "reshuffle")),
        ("G1 random_batch", lambda r: draw_g1(r, "random_batch")),
        ("G3 random_batch", lambda r: draw_g3(r, "random_batch")),
    ],
    "altschuler-talwar": [
        ("G3 random_batch", lambda r: draw_g3(r, "random_batch")),
        ("G3 poisson", lambda r: draw_g3(r, "poisson")),
    ],
    "liang-bounded": [("G3 poisson add/remove", lambda r: draw_g3(r, "poisson", "add_or_remove_one"))],
    "liang-unbounded": [
        ("G1 poisson add/remove", lambda r: draw_g1(r, "poisson", "add_or_remove_one")),
        ("G3 poisson add/remove", lambda r: draw_g3(r, "poisson", "add_or_remove_one")),
    ],
    "ye-shokri-cyclic": [
        ("G2 cyclic", lambda r: draw_g2(r, "cyclic")),
        ("G2 shuffle_once", lambda r: draw_g2(r, "shuffle_once")),
    ],
    "ye-shokri-shuffle": [("G2 shuffle_once", lambda r: draw_g2(r, "shuffle_once"))],
    "ye-shokri-random": [("G2 random_batch", lambda r: draw_g2(r, "random_batch"))],
    "ye-shokri-convex": [
        ("G1 cyclic", lambda r: draw_g1(r, "cyclic")),
        ("G1 shuffle_once", lambda r: draw_g1(r, "shuffle_once")),
        ("G2 cyclic", lambda r: draw_g2(r, "cyclic")),
        ("G3 cyclic", lambda r: draw_g3(r, "cyclic")),
        ("G3 shuffle_once", lambda r: draw_g3(r, "shuffle_once")),
    ],
    "ye-shokri-full-batch": [
        ("G1 cyclic", lambda r: draw_g1(r, "cyclic")),
        ("G1 random_batch", lambda r: draw_g1(r, "random_batch")),
        ("G2 cyclic", lambda r: draw_g2(r, "cyclic")),
    ],
    "composition": [
        ("G1 cyclic", lambda r: draw_g1(r, "cyclic")),
        ("G1 reshuffle", lambda r: draw_g1(r, "reshuffle")),
        ("G1 random_batch", lambda r: draw_g1(r, "random_batch")),
        ("G1 poisson add/remove", lambda r: draw_g1(r, "poisson", "add_or_remove_one")),
        ("G2 shuffle_once", lambda r: draw_g2(r, "shuffle_once")),
        ("G3 reshuffle", lambda r: draw_g3(r, "reshuffle")),
        ("G3 poisson add/remove", lambda r: draw_g3(r, "poisson", "add_or_remove_one")),
    ],
}


@dataclasses.dataclass
class FuzzReport:
    """Counts, violations and the smallest ratio per bound."""

    checks: dict[str, int] = dataclasses.field(default_factory=dict)
    min_ratio: dict[str, float] = dataclasses.field(default_factory=dict)
    violations: list[Check] = dataclasses.field(default_factory=list)
    instances: int = 0
    max_exact_width: float = 0.0
    seconds: float = 0.0

    def add(self, check: Check) -> None:
        self.checks[check.bound] = self.checks.get(check.bound, 0) + 1
        finite = check.ratios[np.isfinite(check.ratios)]
        if finite.size:
            self.min_ratio[check.bound] = min(self.min_ratio.get(check.bound, math.inf), float(finite.min()))
        width = check.exact.width[np.isfinite(check.exact.width)]
        if width.size:
            self.max_exact_width = max(self.max_exact_width, float(width.max()))
        if check.violations.size:
            self.violations.append(check)

    def to_dict(self) -> dict:
        return {
            "instances": self.instances,
            "checks_per_bound": dict(sorted(self.checks.items())),
            "min_ratio_bound_over_exact": dict(sorted(self.min_ratio.items())),
            "max_certified_interval_width": self.max_exact_width,
            "violations": [v.describe() for v in self.violations],
            "seconds": round(self.seconds, 1),
        }

    def summary(self) -> str:
        lines = [f"{self.instances} instances, {sum(self.checks.values())} checks, {self.seconds:.0f} s"]
        for bid in sorted(self.checks):
            ratio = self.min_ratio.get(bid, math.inf)
            lines.append(f"  {bid:28s} checks={self.checks[bid]:5d}  min bound/exact={ratio:.4g}")
        lines.append(f"  violations: {len(self.violations)}")
        lines.extend(v.describe() for v in self.violations)
        return "\n".join(lines)


def fuzz(
    bounds: Iterable[str] | None = None,
    *,
    checks_per_bound: int = 50,
    seed: int = 0,
    orders: np.ndarray = CHECK_ORDERS,
    g3_options: dict | None = None,
    max_instances: int | None = None,
    progress: bool = False,
) -> FuzzReport:
    """Draw instances for each bound until it has been checked ``checks_per_bound``
    times (every other bound that applies to a drawn instance is checked too)."""
    rng = np.random.default_rng(seed)
    report = FuzzReport()
    start = time.perf_counter()
    wanted = list(TARGETS) if bounds is None else list(bounds)
    options = {"G3": dict(G3_FAST if g3_options is None else g3_options)}
    budget = max_instances if max_instances is not None else 50 * checks_per_bound * len(wanted)
    for bid in wanted:
        families = TARGETS[bid]
        k = 0
        while report.checks.get(bid, 0) < checks_per_bound and report.instances < budget:
            _, draw = families[k % len(families)]
            k += 1
            instance = draw(rng)
            for check in check_instance(instance, orders, options.get(instance.family)):
                report.add(check)
            report.instances += 1
            if progress and report.instances % 50 == 0:
                print(
                    f"[{time.perf_counter() - start:.0f}s] {report.instances} instances; {bid}: "
                    f"{report.checks.get(bid, 0)}",
                    file=sys.stderr,
                )
    report.seconds = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks-per-bound", type=int, default=1000)
    parser.add_argument("--bound", action="append", help="only these bounds (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--full-grid", action="store_true", help="finer G3 grids (slower, tighter intervals)")
    args = parser.parse_args(argv)
    report = fuzz(
        args.bound,
        checks_per_bound=args.checks_per_bound,
        seed=args.seed,
        g3_options=G3_FULL if args.full_grid else None,
        progress=True,
    )
    print(report.summary())
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report.to_dict(), fh, indent=2)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
