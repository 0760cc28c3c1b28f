"""Per-step overhead of the Opacus adapter in a real training loop.

The same model, data, shuffle-once loader (``poisson_sampling=False``) and
optimizer are trained with Opacus' RDP accountant and with a registered
last-iterate accountant (``bound="best"``); only the accountant differs. Two
numbers per model: the ratio of the median step times (sensitive to the load of
a shared machine), and the ratio computed from the accountants' own per-step
hook times (Opacus calls ``optimizer.step_hook`` once per step):
``(Opacus step - its hook + our hook) / Opacus step``. Goal: <= 1.01.

    python benchmarks/bench_opacus_overhead.py [--quick]

Needs the ``opacus`` extra and scikit-learn (the breast-cancer data). Writes the
``opacus_overhead`` section of benchmarks/results.json and re-renders
benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from _common import update_results


def step_overhead(steps: int = 300, repeats: int = 3, batch_size: int = 32, hidden: int = 0) -> dict[str, Any]:
    """Per-step time with the last-iterate accountant vs Opacus' RDP accountant (medians);
    ``hidden = 0``: logistic regression (the worst case: the accountant's fixed cost
    against a tiny step), else a 30-hidden-hidden-1 MLP."""
    import numpy as np
    import torch
    from opacus import PrivacyEngine
    from sklearn.datasets import load_breast_cancer
    from torch.utils.data import DataLoader, TensorDataset

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    torch.set_num_threads(1)
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    data = TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    n, lr = len(data), 0.1
    name = lastiter_opacus.register(
        "bench-last-iterate", bound="best", sampling="shuffle_once", dataset_size=n, learning_rate=lr,
        smoothness=0.25, force=True,
    )  # fmt: skip

    def loop(accountant: str) -> tuple[list[float], list[float]]:
        torch.manual_seed(0)
        if hidden:
            model = torch.nn.Sequential(
                torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                torch.nn.ReLU(), torch.nn.Linear(hidden, 1),
            )  # fmt: skip
        else:
            model = torch.nn.Linear(x.shape[1], 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        loader = DataLoader(data, batch_size=batch_size, sampler=lastiter_opacus.ShuffleOnceSampler(data, seed=0))
        engine = PrivacyEngine(accountant=accountant)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, loader = engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                poisson_sampling=False,
            )  # fmt: skip
        hook, hook_times = optimizer.step_hook, []

        def timed_hook(opt):
            start = time.perf_counter()
            hook(opt)
            hook_times.append(time.perf_counter() - start)

        optimizer.step_hook = timed_hook  # measure the accountant's own per-step work
        loss_fn = torch.nn.BCEWithLogitsLoss()
        times, done = [], 0
        warnings.simplefilter("ignore")  # torch's backward-hook notices, once per step
        while done < steps:
            for xb, yb in loader:
                if len(xb) == 0:
                    continue
                start = time.perf_counter()
                optimizer.zero_grad()
                loss_fn(model(xb).squeeze(-1), yb).backward()
                optimizer.step()
                times.append(time.perf_counter() - start)
                done += 1
                if done >= steps:
                    break
        return times, hook_times

    medians: dict[str, list[float]] = {"rdp": [], name: []}
    hooks: dict[str, list[float]] = {"rdp": [], name: []}
    for _ in range(repeats):
        for acc in ("rdp", name):  # alternating, so that a change of load hits both
            step_times, hook_times = loop(acc)
            medians[acc].append(float(np.median(step_times)))
            hooks[acc].append(float(np.median(hook_times)))
    rdp_s, ours_s = statistics.median(medians["rdp"]), statistics.median(medians[name])
    hook_rdp, hook_ours = statistics.median(hooks["rdp"]), statistics.median(hooks[name])
    return {
        "steps_per_run": steps,
        "repeats": repeats,
        "batch_size": batch_size,
        "model": f"MLP 30-{hidden}-{hidden}-1" if hidden else "logistic regression (31 parameters)",
        "median_step_s_opacus_rdp": rdp_s,
        "median_step_s_last_iterate": ours_s,
        "ratio": ours_s / rdp_s,
        "median_hook_s_opacus_rdp": hook_rdp,
        "median_hook_s_last_iterate": hook_ours,
        "hook_ratio_estimate": (rdp_s - hook_rdp + hook_ours) / rdp_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 steps per run")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    for hidden in (0, 256):
        try:
            rows.append(step_overhead(steps=100 if args.quick else 300, hidden=hidden))
        except Exception as exc:  # recorded in the results, not hidden
            rows.append({"error": f"{type(exc).__name__}: {exc}"})
        print(rows[-1], file=sys.stderr, flush=True)
    command = "python benchmarks/bench_opacus_overhead.py" + (" --quick" if args.quick else "")
    update_results("opacus_overhead", rows, command=command, seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
