"""Time of one epsilon for T in {10^3, 10^5, 10^6, 10^7}: every bound, and the
accountants users already have (Opacus RDP / PRV, dp-accounting RDP / PLD); noise
calibration at T = 10^4.

    python benchmarks/bench_epsilon.py                 # everything (~ 10 minutes)
    python benchmarks/bench_epsilon.py --quick         # T in {1e3, 1e5} only, 3 repeats

Every repeat runs in a freshly forked process (libraries imported, caches cold),
so that a repeat costs what a first call costs, and is killed after 180 s; times
are medians over the repeats. Writes the ``epsilon`` and ``calibration``
sections of benchmarks/results.json and re-renders benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _common import DELTA, forked_median, opacus_rdp_epsilon, update_results

import lastiter_plugins as lp

STEPS = (10**3, 10**5, 10**6, 10**7)

# one configuration per bound where it applies (n = 60000, b = 600: l = 100, q = 0.01)
_BASE = dict(dataset_size=60_000, batch_size=600, noise_multiplier=1.0, learning_rate=0.1, smoothness=1.0)
_SC = dict(_BASE, strong_convexity=0.05, gradient_norms_within_clip=True, learning_rate=0.5)  # strongly convex
CONFIGS: dict[str, dict[str, Any]] = {
    "kong-ribero-cyclic": dict(_BASE, sampling="cyclic"),
    "kong-ribero-bounded": dict(_BASE, sampling="random_batch", diameter=1.0),
    "kong-ribero-curvature-free": dict(_BASE, sampling="random_batch"),
    "altschuler-talwar": dict(_BASE, sampling="random_batch", diameter=1.0, gradient_norms_within_clip=True),
    "bounded-domain-random": dict(_BASE, sampling="random_batch", diameter=1.0, gradient_norms_within_clip=True),
    "liang-bounded": dict(_BASE, sampling="poisson", relation="add_or_remove_one", diameter=1.0),
    "liang-unbounded": dict(_BASE, sampling="poisson", relation="add_or_remove_one"),
    "ye-shokri-cyclic": dict(_SC, sampling="cyclic"),
    "ye-shokri-shuffle": dict(_SC, sampling="shuffle_once"),
    "ye-shokri-random": dict(_SC, sampling="random_batch"),
    "ye-shokri-convex": dict(_BASE, sampling="cyclic", gradient_norms_within_clip=True),
    "ye-shokri-full-batch": dict(_SC, dataset_size=600, sampling="cyclic", strong_convexity=0.0),
    "shifted-interpolation-full-batch": dict(_SC, dataset_size=600, sampling="cyclic"),
    "shifted-interpolation-cyclic": dict(_SC, sampling="cyclic"),
    "shifted-interpolation-shuffle": dict(_SC, sampling="shuffle_once"),
    "composition (random_batch)": dict(_BASE, sampling="random_batch"),
    "composition (poisson)": dict(_BASE, sampling="poisson", relation="add_or_remove_one"),
    "best (cyclic)": dict(_SC, sampling="cyclic"),
    "best (shuffle_once)": dict(_SC, sampling="shuffle_once"),
    "best (random_batch)": dict(_SC, sampling="random_batch", diameter=1.0),
}  # fmt: skip


def _bound_epsilon(bound: str, params: dict[str, Any], steps: int) -> Callable[[], float]:
    name = bound.split(" ")[0]
    return lambda: lp.epsilon(name, DELTA, steps=steps, **params).epsilon


def _opacus_prv(q: float, z: float, steps: int) -> Callable[[], float]:
    def run():
        from opacus.accountants import PRVAccountant

        acc = PRVAccountant()
        acc.history = [(z, q, steps)]
        return acc.get_epsilon(DELTA)

    return run


def _dpa(kind: str, q: float, z: float, steps: int) -> Callable[[], float]:
    def run():
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
        )
        acc = rdp_privacy_accountant.RdpAccountant() if kind == "rdp" else pld_privacy_accountant.PLDAccountant()
        acc.compose(event)
        return acc.get_epsilon(DELTA)

    return run


def epsilon_rows(steps=STEPS, repeats: int = 5, log=print, skip_after_s: float = 30.0) -> list[dict]:
    """One row per (accountant, T): median time of one epsilon and its value. An
    accountant whose previous (smaller) T took more than ``skip_after_s`` is not
    run at the larger T (recorded as skipped)."""
    # imported before forking, so that no timing includes an import
    import opacus.accountants  # noqa: F401
    from dp_accounting.pld import pld_privacy_accountant  # noqa: F401
    from dp_accounting.rdp import rdp_privacy_accountant  # noqa: F401

    q, z = 0.01, 1.0
    jobs: list[tuple[str, str, int, Callable[[], float]]] = []
    for t in steps:
        for bound, params in CONFIGS.items():
            jobs.append((bound, "lastiter", t, _bound_epsilon(bound, params, t)))
        jobs.append(("Opacus RDPAccountant", "host", t, opacus_rdp_epsilon(q, z, t)))
        jobs.append(("Opacus PRVAccountant", "host", t, _opacus_prv(q, z, t)))
        jobs.append(("dp-accounting RdpAccountant", "host", t, _dpa("rdp", q, z, t)))
        jobs.append(("dp-accounting PLDAccountant", "host", t, _dpa("pld", q, z, t)))
    rows, previous = [], {}
    for name, kind, t, fn in jobs:
        if previous.get(name, 0.0) > skip_after_s:
            why = f"the previous T took {previous[name]:.0f} s" if math.isfinite(previous[name]) else "timed out"
            rows.append({"accountant": name, "kind": kind, "steps": t, "repeats": 0, "error": f"skipped: {why}"})
            continue
        row = {"accountant": name, "kind": kind, "steps": t, **forked_median(fn, repeats=repeats)}
        previous[name] = row.get("median_s", math.inf)
        rows.append(row)
        log(f"{name} T={t}: {row.get('median_s', float('nan')):.4g} s {row.get('error', '')}")
    return rows


def calibration_rows(repeats: int = 3) -> list[dict]:
    """Median time of calibrate_noise to epsilon = 1 at delta = 1e-5, T = 10^4."""
    rows = []
    for bound in ("ye-shokri-shuffle", "shifted-interpolation-shuffle", "kong-ribero-cyclic", "altschuler-talwar",
                  "bounded-domain-random", "composition (random_batch)", "best (shuffle_once)"):  # fmt: skip
        params = {k: v for k, v in CONFIGS[bound].items() if k != "noise_multiplier"}
        name = bound.split(" ")[0]
        timing = forked_median(
            lambda n=name, p=params: lp.calibrate_noise(n, 1.0, DELTA, steps=10**4, **p).noise_multiplier,
            repeats=repeats,
        )
        rows.append({"bound": bound, "steps": 10**4, "target_epsilon": 1.0, **timing})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="T in {1e3, 1e5}, fewer repeats")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    command = "python benchmarks/bench_epsilon.py" + (" --quick" if args.quick else "")
    start = time.perf_counter()
    rows = epsilon_rows((10**3, 10**5) if args.quick else STEPS, repeats=3 if args.quick else 5, log=log)
    update_results("epsilon", rows, command=command, seconds=time.perf_counter() - start, delta=DELTA,
                   sampling_probability=0.01, noise_multiplier=1.0)  # fmt: skip
    start = time.perf_counter()
    update_results("calibration", calibration_rows(), command=command, seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
