r"""Random allocation on the anchor setting (issue 39, item 4): the rows against PLD_accounting's own calls, their
cost cold, and at T = 10^6.

Anchor: n = 60000, b = 1500 (t = 40 steps per epoch), delta = 1e-5; add-or-remove at noise 1.5 (the anchor's
per-step Gaussian, as its Poisson column), replace-one at z = 3. For each epoch count:

* the row's epsilon (``lp.epsilon``), PLD_accounting's upper bound (``gaussian_allocation_pld``, the E-epoch call,
  FFT route, loss interval 0.01, ``BoundType.DOMINATES``) and the ratio; its lower bound (``IS_DOMINATED``, the
  geometric route, one allocation at interval 0.01, composed E times by dp-accounting without tail truncation:
  below the exact epsilon); Poisson's PLD at the same rate;
* the CPU time (``time.process_time``, imports included) and peak memory (``ru_maxrss``) of ``best`` in a fresh
  interpreter (cold: nothing cached, nothing imported), the median of three.

Targets (issue 39, item 4): the row at most 1% above PLD_accounting's upper bound and not below its lower bound;
``best`` at most 2 s of CPU cold at E 50-200, at most 10 s and 300 MiB at T = 10^6 (E = 25000).

Run: ``.venv/bin/python benchmarks/bench_random_allocation.py`` (about 5 minutes; rewrites its section of
results.json and results.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

from _common import update_results

import lastiter_plugins as lp
from lastiter_plugins.bounds import random_allocation as ra

ROOT = Path(__file__).resolve().parent.parent
ANCHOR = dict(dataset_size=60000, batch_size=1500, sampling="random_allocation")
DELTA = 1e-5
EPOCHS = (50, 100, 200)
LONG_EPOCHS = 25000  # T = 10^6

_COLD = r"""
import json, resource, sys, time
start = time.process_time()
import lastiter_plugins as lp
result = lp.epsilon("best", {delta}, **json.loads(sys.argv[1]))
print(json.dumps(dict(cpu_s=time.process_time() - start, epsilon=result.epsilon, winner=result.winner,
                      rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def cold(params: dict, repeats: int = 3) -> dict:
    """best in fresh interpreters: the median CPU time and the largest peak memory."""
    runs = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _COLD.format(delta=DELTA), json.dumps(params)],
            capture_output=True, text=True, check=True, env=env, timeout=600,
        )  # fmt: skip
        runs.append(json.loads(out.stdout))
    return dict(
        cpu_s=statistics.median(r["cpu_s"] for r in runs),
        rss_mib=max(r["rss_mib"] for r in runs),
        epsilon=runs[0]["epsilon"],
        winner=runs[0]["winner"],
        repeats=repeats,
    )


def theirs(z: float, epochs: int) -> tuple[float, float]:
    """PLD_accounting's own upper bound (the E-epoch call at interval 0.01) and its lower bound (one allocation,
    geometric route, composed by dp-accounting without truncation)."""
    lib = ra._pld_accounting()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        upper = lib.gaussian_allocation_pld(
            params=lib.PrivacyParams(sigma=z, num_steps=40, num_selected=1, num_epochs=epochs),
            config=lib.AllocationSchemeConfig(loss_discretization=0.01, convolution_method=lib.ConvolutionMethod.FFT),
            bound_type=lib.BoundType.DOMINATES,
        ).get_epsilon_for_delta(DELTA)
    lower = ra.allocation_lower_pld(z, 40, 0.01).self_compose(epochs, tail_mass_truncation=0.0)
    return float(upper), float(lower.get_epsilon_for_delta(DELTA))


def main() -> None:
    began = time.time()
    rows = []
    for relation, z in (("add_or_remove_one", 1.5), ("replace_one", 3.0)):
        for epochs in EPOCHS:
            params = {**ANCHOR, "noise_multiplier": z, "epochs": epochs, "relation": relation}
            row = dict(relation=relation, noise_multiplier=z, epochs=epochs, **cold(params))
            poisson = {**params, "sampling": "poisson"}
            row["poisson"] = lp.epsilon("best", DELTA, **poisson).epsilon
            if relation == "add_or_remove_one":
                upper, lower = theirs(z, epochs)
                row.update(pld_accounting_upper=upper, pld_accounting_lower=lower, ratio=row["epsilon"] / upper)
            rows.append(row)
            print(row, flush=True)
    long_params = {**ANCHOR, "noise_multiplier": 1.5, "epochs": LONG_EPOCHS, "relation": "add_or_remove_one"}
    rows.append(dict(relation="add_or_remove_one", noise_multiplier=1.5, epochs=LONG_EPOCHS, **cold(long_params, 1)))
    print(rows[-1], flush=True)
    update_results(
        "random_allocation",
        rows,
        command="python benchmarks/bench_random_allocation.py",
        seconds=time.time() - began,
    )


if __name__ == "__main__":
    main()
