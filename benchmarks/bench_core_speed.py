"""Core speed targets of the accountant (issue: core), in one run:

* epsilon for T = 10^6 steps on the default order grid for every bound
  (closed forms: goal <= 50 ms);
* ``best`` on a random-batch pipeline, where it includes ye-shokri-random,
  altschuler-talwar and the sampled-without-replacement composition (goal <= 200 ms);
* the ratio to Opacus' RDPAccountant.get_epsilon at the same T, same run.

"cold" clears the library's caches before each call (first call in a process);
"warm" is a repeated call. Medians over --repeats.

    python benchmarks/bench_core_speed.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings

import lastiter_plugins as lp
from lastiter_plugins.bounds import sgm

T = 10**6
COMMON = dict(
    dataset_size=60000,
    batch_size=600,
    noise_multiplier=1.0,
    learning_rate=0.5,
    steps=T,
    smoothness=1.0,
    strong_convexity=0.05,
    gradient_norms_within_clip=True,
    diameter=1.0,
)
# one pipeline per bound on which it applies
PIPELINES = {
    "kong-ribero-cyclic": dict(sampling="cyclic", strong_convexity=0.0, learning_rate=0.5),
    "kong-ribero-bounded": dict(sampling="random_batch"),
    "kong-ribero-curvature-free": dict(sampling="random_batch"),
    "altschuler-talwar": dict(sampling="random_batch"),
    "liang-bounded": dict(sampling="poisson", relation="add_or_remove_one", learning_rate=0.005),
    "liang-unbounded": dict(sampling="poisson", relation="add_or_remove_one"),
    "ye-shokri-cyclic": dict(sampling="cyclic"),
    "ye-shokri-shuffle": dict(sampling="shuffle_once"),
    "ye-shokri-random": dict(sampling="random_batch"),
    "ye-shokri-convex": dict(sampling="cyclic"),
    "ye-shokri-full-batch": dict(sampling="cyclic", batch_size=60000, learning_rate=0.5),
    "composition": dict(sampling="random_batch"),
    "best": dict(sampling="random_batch"),
}


def clear_caches() -> None:
    sgm._binomial_layout.cache_clear()
    sgm._wor_forward_differences.cache_clear()


def timed(fn, repeats: int, cold: bool) -> float:
    times = []
    for _ in range(repeats):
        if cold:
            clear_caches()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore", lp.OrderGridWarning)
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    opacus.history = [(1.0, 0.01, T)]
    opacus_time = timed(lambda: opacus.get_epsilon(1e-5), args.repeats, cold=False)
    print(f"T = {T:g}, default grid of {len(lp.DEFAULT_ORDERS)} orders, delta = 1e-5; {platform.processor()}")
    print(f"{'bound':28} {'sampling':13} {'cold ms':>8} {'warm ms':>8} {'x Opacus':>9}  epsilon")
    for bound, changes in PIPELINES.items():
        params = {**COMMON, **changes}
        result = lp.epsilon(bound, 1e-5, **params)
        cold = timed(lambda b=bound, p=params: lp.epsilon(b, 1e-5, **p), args.repeats, cold=True)
        warm = timed(lambda b=bound, p=params: lp.epsilon(b, 1e-5, **p), args.repeats, cold=False)
        print(
            f"{bound:28} {params['sampling']:13} {cold * 1e3:8.1f} {warm * 1e3:8.1f} {cold / opacus_time:9.2f}"
            f"  {result.epsilon:.4g}{' via ' + result.winner if bound == 'best' else ''}"
        )
    print(f"{'Opacus RDPAccountant':28} {'poisson':13} {'':8} {opacus_time * 1e3:8.1f} {1.0:9.2f}")


if __name__ == "__main__":
    main()
