"""Per-step overhead of the Opacus adapter in a real training loop.

Two identical pipelines (same model, data, shuffle-once loader with
``poisson_sampling=False``, optimizer), one with Opacus' RDP accountant and one with a
registered last-iterate accountant (``bound="best"``), are trained in the same process,
their steps interleaved (A B, then B A, ...) so that a change of load or of clock hits
both alike. Per model:

* ``ratio``: median step time with the last-iterate accountant / with Opacus' RDP
  accountant (every step timed, nothing else; the headline figure; goal <= 1.01);
* ``control_ratio``: the same measurement with Opacus' RDP accountant in both pipelines
  (an A/A run): how far from 1 two identical pipelines read on this machine, i.e. the
  resolution of ``ratio``;
* in a third run, the adapter's own per-step work, timed inside the step: its ``step_hook`` (called by
  Opacus before the update), its step post-hook (records the parameters' versions) and
  its forward pre-hook (counts the examples entering the model), with
  ``ratio_from_hooks`` = (Opacus step - Opacus hook + the three) / Opacus step. It leaves
  out torch's cost of dispatching to the two hooks, which the step times include.

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


def _pipeline(accountant: str, data: Any, hidden: int, lr: float, batch_size: int) -> tuple:
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    torch.manual_seed(0)
    features = data.tensors[0].shape[1]
    if hidden:
        model = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )  # fmt: skip
    else:
        model = torch.nn.Linear(features, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(data, batch_size=batch_size, sampler=lastiter_opacus.ShuffleOnceSampler(data, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = PrivacyEngine(accountant=accountant).make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
            poisson_sampling=False,
        )  # fmt: skip
    return model, optimizer, loader


def _timed(hooks: dict, times: list) -> None:
    """Wrap each hook of ``hooks`` (a torch hook dict) to append its duration to ``times``."""
    for hook_id, hook in list(hooks.items()):

        def timed(*args: Any, _hook: Any = hook) -> Any:
            start = time.perf_counter()
            result = _hook(*args)
            times.append(time.perf_counter() - start)
            return result

        hooks[hook_id] = timed


def interleaved(
    accountants: tuple[str, str], *, epochs: int, hidden: int, time_hooks: bool, batch_size: int = 32
) -> dict[str, Any]:
    """Median step times of two pipelines trained step by step in turn (A B, B A, ...); with
    ``time_hooks``, the median time of each accountant's hooks (the timing then adds to the steps)."""
    import torch
    from sklearn.datasets import load_breast_cancer
    from torch.utils.data import TensorDataset

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # (denormal weights or activations in one pipeline only would skew the ratio)
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    data = TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    lr = 0.1
    pipes = [_pipeline(name, data, hidden, lr, batch_size) for name in accountants]
    loss_fn = torch.nn.BCEWithLogitsLoss()
    warnings.simplefilter("ignore")  # torch's backward-hook notices, once per step
    for model, optimizer, loader in pipes:  # one epoch first: the adapter registers its post-hook at the first step
        for xb, yb in loader:
            optimizer.zero_grad()
            loss_fn(model(xb).squeeze(-1), yb).backward()
            optimizer.step()
    hooks: list[dict[str, list[float]]] = []
    for model, optimizer, _ in pipes if time_hooks else ():
        times: dict[str, list[float]] = {"step_hook": [], "post_hook": [], "forward_pre_hook": []}
        hook = optimizer.step_hook

        def step_hook(optim: Any, _hook: Any = hook, _times: list = times["step_hook"]) -> None:
            start = time.perf_counter()
            _hook(optim)
            _times.append(time.perf_counter() - start)

        optimizer.step_hook = step_hook
        _timed(optimizer.original_optimizer._optimizer_step_post_hooks, times["post_hook"])
        _timed(model._forward_pre_hooks, times["forward_pre_hook"])
        hooks.append(times)
    steps: list[list[float]] = [[], []]
    for _ in range(epochs):
        batches = [iter(loader) for _, _, loader in pipes]
        for k in range(len(pipes[0][2])):
            for i in (0, 1) if k % 2 == 0 else (1, 0):
                model, optimizer, _ = pipes[i]
                xb, yb = next(batches[i])
                start = time.perf_counter()
                optimizer.zero_grad()
                loss_fn(model(xb).squeeze(-1), yb).backward()
                optimizer.step()
                steps[i].append(time.perf_counter() - start)
    return {
        "steps": len(steps[0]),
        "step_s": [statistics.median(s) for s in steps],
        "hook_s": [{k: statistics.median(v) if v else 0.0 for k, v in h.items()} for h in hooks] if hooks else None,
    }


def step_overhead(*, epochs: int, hidden: int, repeats: int) -> dict[str, Any]:
    from lastiter_plugins.adapters import opacus as lastiter_opacus

    name = lastiter_opacus.register(
        "bench-last-iterate", bound="best", sampling="shuffle_once", dataset_size=569, learning_rate=0.1,
        smoothness=0.25, force=True,
    )  # fmt: skip
    ratios, controls, runs, timed = [], [], [], []
    for _ in range(repeats):
        run = interleaved(("rdp", name), epochs=epochs, hidden=hidden, time_hooks=False)
        ratios.append(run["step_s"][1] / run["step_s"][0])
        runs.append(run)
        control = interleaved(("rdp", "rdp"), epochs=epochs, hidden=hidden, time_hooks=False)
        controls.append(control["step_s"][1] / control["step_s"][0])
        timed.append(interleaved(("rdp", name), epochs=epochs, hidden=hidden, time_hooks=True))
    rdp_step = statistics.median(r["step_s"][0] for r in runs)
    ours_step = statistics.median(r["step_s"][1] for r in runs)
    rdp_hook = statistics.median(r["hook_s"][0]["step_hook"] for r in timed)
    ours = {k: statistics.median(r["hook_s"][1][k] for r in timed) for k in timed[0]["hook_s"][1]}
    return {
        "model": f"MLP 30-{hidden}-{hidden}-1" if hidden else "logistic regression (31 parameters)",
        "batch_size": 32,
        "steps_per_run": runs[0]["steps"],
        "repeats": repeats,
        "median_step_s_opacus_rdp": rdp_step,
        "median_step_s_last_iterate": ours_step,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "control_ratio": statistics.median(controls),
        "control_ratios": controls,
        "median_hook_s_opacus_rdp": rdp_hook,
        "median_hook_s_last_iterate": ours["step_hook"],
        "median_post_hook_s_last_iterate": ours["post_hook"],
        "median_forward_pre_hook_s_last_iterate": ours["forward_pre_hook"],
        "ratio_from_hooks": (rdp_step - rdp_hook + sum(ours.values())) / rdp_step,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 epochs (360 steps) per run, 1 run per model")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    for hidden in (0, 256):
        try:
            rows.append(step_overhead(epochs=20 if args.quick else 100, hidden=hidden, repeats=1 if args.quick else 3))
        except Exception as exc:  # recorded in the results, not hidden
            rows.append({"error": f"{type(exc).__name__}: {exc}"})
        print(rows[-1], file=sys.stderr, flush=True)
    command = "python benchmarks/bench_opacus_overhead.py" + (" --quick" if args.quick else "")
    update_results("opacus_overhead", rows, command=command, seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
