"""Speed of one epsilon at T = 10^6 steps, every bound and ``best``, next to Opacus.

For each pipeline (cyclic, shuffle once, reshuffle, random batch: the issues' targets; also
full batch and Poisson), every bound that applies (the unproven one by name) and
``best``: the median time of ``lp.epsilon(bound, 1e-5, ...)`` on the default
order grid, "cold" (the library's caches cleared before each call: what the first
call in a process costs) and "warm" (repeated calls), next to Opacus'
``RDPAccountant.get_epsilon`` for the same T measured in the same run, right
before each pipeline (q = b/n = 0.01, z = 1; the ratio uses the cold time).

Targets (issues "Core v2" and "f-DP"): each f-DP bound < 5 ms at T = 10^6 (issue "schedule
mixtures": each new bound <= 50 ms);
``best`` no slower than Opacus' RDP accountant on cyclic and shuffle-once pipelines.

    python benchmarks/bench_core_speed.py [--repeats 9]

Writes the ``core_speed`` section of benchmarks/results.json and re-renders
benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

from _common import DELTA, in_process_median, opacus_rdp_epsilon, update_results

import lastiter_plugins as lp

T = 10**6
COMMON = dict(
    dataset_size=60_000,
    batch_size=600,
    noise_multiplier=1.0,
    learning_rate=0.5,
    steps=T,
    smoothness=1.0,
    strong_convexity=0.05,
    gradient_norms_within_clip=True,
    diameter=1.0,
)
PIPELINES = {
    "cyclic": dict(sampling="cyclic"),
    "shuffle_once": dict(sampling="shuffle_once"),
    "reshuffle": dict(sampling="reshuffle"),
    "random_batch": dict(sampling="random_batch"),
    "full batch (b = n)": dict(sampling="cyclic", batch_size=60_000),
    "poisson (add/remove)": dict(sampling="poisson", relation="add_or_remove_one", learning_rate=0.005),
}


def rows(repeats: int, log=print) -> list[dict]:
    from opacus.accountants import RDPAccountant  # noqa: F401  (imported before any timing)

    out = []
    for pipeline, changes in PIPELINES.items():
        params = {**COMMON, **changes}
        config, _ = lp.build(**params)
        opacus = opacus_rdp_epsilon(config.sampling_probability, config.noise_multiplier, T)
        opacus_s = in_process_median(opacus, repeats, cold=False)
        out.append({"pipeline": pipeline, "bound": "Opacus RDPAccountant", "kind": "rdp", "proof": "-",
                    "cold_ms": opacus_s * 1e3, "warm_ms": opacus_s * 1e3, "x_opacus": 1.0, "epsilon": opacus(),
                    "relation": "add_or_remove_one (Poisson)"})  # fmt: skip
        log(f"{pipeline}: Opacus RDPAccountant {opacus_s * 1e3:.2f} ms")
        applicable = [bid for bid, app in lp.applicable_bounds(**params).items() if app.applies]
        for bid in applicable:
            result = lp.epsilon(bid, DELTA, **params)
            cold = in_process_median(lambda b=bid, p=params: lp.epsilon(b, DELTA, **p), repeats, cold=True)
            warm = in_process_median(lambda b=bid, p=params: lp.epsilon(b, DELTA, **p), repeats, cold=False)
            spec = lp.BOUNDS.get(bid)
            out.append({
                "pipeline": pipeline, "bound": bid, "kind": spec.kind.value if spec else "best",
                "proof": str(result.proof), "cold_ms": cold * 1e3, "warm_ms": warm * 1e3,
                "x_opacus": cold / opacus_s, "epsilon": result.epsilon, "winner": result.winner,
                "relation": result.relation.value,
            })  # fmt: skip
            log(f"  {bid:34s} cold {cold * 1e3:8.2f} ms  warm {warm * 1e3:8.2f} ms  x{cold / opacus_s:6.3f}"
                f"  eps {result.epsilon:.4g}{' via ' + result.winner if bid == 'best' else ''}")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    data = rows(args.repeats)
    command = "python benchmarks/bench_core_speed.py" + (f" --repeats {args.repeats}" if args.repeats != 9 else "")
    update_results("core_speed", data, command=command, seconds=time.perf_counter() - start, steps=T,
                   repeats=args.repeats, delta=DELTA)  # fmt: skip


if __name__ == "__main__":
    main()
