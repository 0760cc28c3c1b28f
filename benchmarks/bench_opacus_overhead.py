"""Per-step overhead of the Opacus adapter in a real training loop, on CPU.

Two identical pipelines (same model, data, shuffle-once loader with
``poisson_sampling=False``, optimizer), one with Opacus' RDP accountant and one with a
registered last-iterate accountant (``bound="best"``), are trained in the same process,
their steps interleaved (A B, then B A, ...) so that a change of load or of clock hits
both alike. Per model:

* ``hook_share`` (the headline figure; goal <= 1% on Opacus' MNIST CNN): the adapter's own
  work in a step, timed inside the step, over the step time of the same run. The work is
  every hook the adapter runs: its ``step_hook`` (called by Opacus before the update: the
  per-step checks), its step post-hook (records the parameters' versions) and its forward
  hooks (count the examples entering the model; on the GLM route also the feature and loss
  checks); torch's dispatch to those hooks is left out;
* ``ratio``: median step time with the last-iterate accountant / with Opacus' RDP
  accountant (every step timed, nothing else);
* ``control_ratio``: the same measurement with Opacus' RDP accountant in both pipelines
  (an A/A run): how far from 1 two identical pipelines read on this machine, i.e. the
  resolution of ``ratio`` (about 2% on 2 shared cores). Both are repeated; their spread
  (min, max over the repeats) is recorded.

Models (generated data): Opacus' MNIST example CNN (examples/mnist.py: two conv and two
linear layers, 28x28x1 inputs, 26,010 parameters) at batch 64 and 256, the goal's model;
reported without a goal: a logistic regression with 31 parameters (the accountant's fixed
cost against a tiny step) and the certified GLM route (``model="glm"``, logistic loss) on
512-dimensional embeddings.

    python benchmarks/bench_opacus_overhead.py [--quick]

Needs the ``opacus`` extra. Runs on one thread (``torch.set_num_threads(1)``); about
5 minutes on 2 shared cores. Writes the ``opacus_overhead`` section of benchmarks/results.json
and re-renders benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from _common import update_results

LR = 0.1


@dataclasses.dataclass(frozen=True)
class Case:
    """One model of the benchmark: how to build it, its data and loss, and how long to time it."""

    name: str
    batch_size: int
    batches: int  # per epoch (n = batch_size * batches)
    epochs: int  # timed, per run (one more epoch first, untimed)
    build: Callable[[], Any]  # () -> torch module
    data: Callable[[int], Any]  # n -> TensorDataset
    loss: Callable[[], Any]  # () -> loss module
    register: dict  # register()'s keywords besides name, sampling, dataset_size, learning_rate
    goal: bool = False

    @property
    def dataset_size(self) -> int:
        return self.batch_size * self.batches


def _mnist_cnn() -> Any:
    """Opacus' examples/mnist.py SampleConvNet, as an nn.Sequential."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 8, 2, padding=3), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, 2), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, 10),
    )  # fmt: skip


def _images(n: int) -> Any:
    import torch
    from torch.utils.data import TensorDataset

    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(n, 1, 28, 28, generator=gen) - 0.1307) / 0.3081  # MNIST-like range
    return TensorDataset(x, torch.randint(0, 10, (n,), generator=gen))


def _vectors(d: int, unit: bool) -> Callable[[int], Any]:
    def data(n: int) -> Any:
        import torch
        from torch.utils.data import TensorDataset

        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, d, generator=gen)
        if unit:
            x = x / x.norm(dim=1, keepdim=True)
        return TensorDataset(x, (torch.rand(n, 1, generator=gen) < 0.5).float())

    return data


def _logistic() -> Any:
    import torch

    return torch.nn.Linear(30, 1)


def _glm() -> Any:
    import torch

    from lastiter_plugins.adapters.opacus import FeatureNormClip

    return torch.nn.Sequential(FeatureNormClip(1.0), torch.nn.Linear(512, 1))


def _cross_entropy() -> Any:
    import torch

    return torch.nn.CrossEntropyLoss()


def _bce() -> Any:
    import torch

    return torch.nn.BCEWithLogitsLoss()


def cases(quick: bool) -> list[Case]:
    e = 1 if quick else 3
    return [
        Case("Opacus MNIST CNN (26,010 parameters)", 64, 40, e, _mnist_cnn, _images, _cross_entropy,
             {"smoothness": 1.0}, goal=True),
        Case("Opacus MNIST CNN (26,010 parameters)", 256, 12, 2 * e, _mnist_cnn, _images, _cross_entropy,
             {"smoothness": 1.0}, goal=True),
        Case("logistic regression (31 parameters)", 32, 20, 4 * e, _logistic, _vectors(30, False), _bce,
             {"smoothness": 0.25}),
        Case("GLM route, logistic, 512-dim embeddings (513 parameters)", 64, 20, 4 * e, _glm, _vectors(512, True),
             _bce, {"model": "glm", "loss": "logistic", "feature_norm": 1.0}),
    ]  # fmt: skip


def _pipeline(case: Case, accountant: str, data: Any) -> tuple:
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    torch.manual_seed(0)
    model = case.build()
    loss = case.loss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(data, batch_size=case.batch_size, sampler=lastiter_opacus.ShuffleOnceSampler(data, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = PrivacyEngine(accountant=accountant).make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
            poisson_sampling=False, criterion=loss,
        )  # fmt: skip
    return model, optimizer, loader, loss


def _ours(hook: Any) -> bool:
    """Whether a hook function belongs to this library (not to Opacus or torch)."""
    return str(getattr(hook, "__module__", "")).startswith("lastiter_plugins")


def _timed(hooks: dict, times: list) -> None:
    """Wrap each of the library's hooks in ``hooks`` (a torch hook dict) to add its duration to ``times[-1]``."""
    for hook_id, hook in list(hooks.items()):
        if not _ours(hook):
            continue

        def timed(*args: Any, _hook: Any = hook, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = _hook(*args, **kwargs)
            times[-1] += time.perf_counter() - start
            return result

        hooks[hook_id] = timed


def _time_hooks(model: Any, optimizer: Any, loss: Any) -> dict[str, list[float]]:
    """Time the accountant's hooks of one pipeline: per step, the step hook, the step post-hooks and the
    forward hooks of every module (the model's and the loss module's)."""
    times: dict[str, list[float]] = {"step_hook": [0.0], "post_hook": [0.0], "forward_hooks": [0.0]}
    hook = optimizer.step_hook

    def step_hook(optim: Any, _hook: Any = hook) -> None:
        start = time.perf_counter()
        _hook(optim)
        times["step_hook"][-1] += time.perf_counter() - start

    optimizer.step_hook = step_hook
    _timed(optimizer.original_optimizer._optimizer_step_post_hooks, times["post_hook"])
    for module in [*model.modules(), loss]:
        _timed(module._forward_pre_hooks, times["forward_hooks"])
        _timed(module._forward_hooks, times["forward_hooks"])
    return times


def interleaved(case: Case, accountants: tuple[str, str], *, time_hooks: bool) -> dict[str, Any]:
    """Median step times of two pipelines trained step by step in turn (A B, B A, ...); with
    ``time_hooks``, the median per-step time of the second pipeline's hooks (the timing then adds to its steps)."""
    import torch

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # (denormal weights or activations in one pipeline only would skew the ratio)
    data = case.data(case.dataset_size)
    pipes = [_pipeline(case, name, data) for name in accountants]
    warnings.simplefilter("ignore")  # torch's backward-hook notices, once per step

    def step(model: Any, optimizer: Any, loss: Any, xb: Any, yb: Any) -> None:
        optimizer.zero_grad()
        loss(model(xb), yb).backward()
        optimizer.step()

    # one epoch first: the adapter registers its post-hook at the first step
    for model, optimizer, loader, loss in pipes:
        for xb, yb in loader:
            step(model, optimizer, loss, xb, yb)
    hooks = _time_hooks(pipes[1][0], pipes[1][1], pipes[1][3]) if time_hooks else None
    steps: list[list[float]] = [[], []]
    for _ in range(case.epochs):
        batches = [iter(loader) for _, _, loader, _ in pipes]
        for k in range(case.batches):
            for i in (0, 1) if k % 2 == 0 else (1, 0):
                model, optimizer, _, loss = pipes[i]
                xb, yb = next(batches[i])
                start = time.perf_counter()
                step(model, optimizer, loss, xb, yb)
                steps[i].append(time.perf_counter() - start)
            if hooks is not None:
                for times in hooks.values():
                    times.append(0.0)
    for _, optimizer, _, _ in pipes:
        optimizer.zero_grad()
    return {
        "steps": len(steps[0]),
        "step_s": [statistics.median(s) for s in steps],
        "hook_s": None if hooks is None else {k: statistics.median(v[:-1]) for k, v in hooks.items()},
    }


def _spread(values: list[float]) -> list[float]:
    return [min(values), max(values)]


def step_overhead(case: Case, *, repeats: int) -> dict[str, Any]:
    from lastiter_plugins.adapters import opacus as lastiter_opacus

    name = lastiter_opacus.register(
        "bench-last-iterate", bound="best", sampling="shuffle_once", dataset_size=case.dataset_size,
        learning_rate=LR, force=True, **case.register,
    )  # fmt: skip
    ratios, controls, runs, shares, timed = [], [], [], [], []
    for _ in range(repeats):
        run = interleaved(case, ("rdp", name), time_hooks=False)
        ratios.append(run["step_s"][1] / run["step_s"][0])
        runs.append(run)
        control = interleaved(case, ("rdp", "rdp"), time_hooks=False)
        controls.append(control["step_s"][1] / control["step_s"][0])
        run = interleaved(case, ("rdp", name), time_hooks=True)
        shares.append(sum(run["hook_s"].values()) / run["step_s"][1])
        timed.append(run)
    hooks = {k: statistics.median(r["hook_s"][k] for r in timed) for k in timed[0]["hook_s"]}
    return {
        "model": case.name,
        "batch_size": case.batch_size,
        "goal": "hook_share <= 0.01" if case.goal else None,
        "steps_per_run": runs[0]["steps"],
        "repeats": repeats,
        "median_step_s_opacus_rdp": statistics.median(r["step_s"][0] for r in runs),
        "median_step_s_last_iterate": statistics.median(r["step_s"][1] for r in runs),
        "hook_share": statistics.median(shares),
        "hook_shares": shares,
        "median_hook_s": hooks,
        "ratio": statistics.median(ratios),
        "ratio_spread": _spread(ratios),
        "control_ratio": statistics.median(controls),
        "control_spread": _spread(controls),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a third of the steps, 1 repeat per model")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each of the three measurements per model")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    for case in cases(args.quick):
        try:
            rows.append(step_overhead(case, repeats=1 if args.quick else args.repeats))
        except Exception as exc:  # recorded in the results, not hidden
            rows.append({"model": case.name, "batch_size": case.batch_size, "error": f"{type(exc).__name__}: {exc}"})
        print(rows[-1], file=sys.stderr, flush=True)
    command = "python benchmarks/bench_opacus_overhead.py" + (" --quick" if args.quick else "")
    update_results("opacus_overhead", rows, command=command, seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
