"""CPU time per step of the last-iterate accountant on Opacus' MNIST CNN, against plain Opacus.

Issue 29 ("Adapters v4"), item 7: on Opacus' MNIST example CNN (examples/mnist.py: two conv and two
linear layers, 28x28x1 inputs, 26,010 parameters) at batch 32, the last-iterate accountant
(``register(..., bound="best")``) must cost no more than plain Opacus (its RDP accountant) within
the A/A spread + 2%.

Three pipelines, identical but for the accountant (same model and initial weights, generated
MNIST-shaped data, loader, SGD, z = 1, C = 1), are built in one process:

* A: Opacus' RDP accountant;
* B: the registered last-iterate accountant;
* A': Opacus' RDP accountant again (the A/A control).

After one untimed epoch of each (hooks registered, caches warm), they are trained in rounds; each
round runs one block of ``--steps`` steps of each pipeline, the order of the three rotated through
all six permutations (A B A', then B A A', ...), and records each block's CPU time
(``time.process_time``: other processes' load on a shared machine does not inflate it; one torch
thread). Per round, ``ratio`` = B / A and ``control`` = A' / A. Reported: their medians over the
rounds (at least 7) with their range [min, max]. The target is met when the median ratio is at most
the control's upper end + 0.02. After the rounds, one more block of B times its step hook alone (the
accountant's per-step checks, called by Opacus before the update; ``process_time`` around Opacus'
``optimizer.step_hook``): its median per step and its share of the block's CPU time, a figure the
ratio cannot resolve on a loaded machine. The accountant's other work per step (its forward
pre-hook counting the examples, its step post-hook, the sampler's report of each batch) is not in it.

Rows: a shuffle-once order (``poisson_sampling=False``; B's loader draws it from the library's
``ShuffleOnceSampler``, which reports every batch it starts to the accountants of its permutation;
A's from a plain list of the same permutation, as a plain Opacus user would: that reporting is B's
cost) and Poisson sampling (Opacus' ``DPDataLoader``, the default of ``make_private`` and of
Opacus' example); each with plain SGD and with ``torch.optim.Adam`` (issue 37, item 5: the update
check then departs at the first step, and every later step skips it).

    python benchmarks/bench_opacus_overhead.py [--rounds 14] [--steps 150] [--optimizer sgd|adam] [--quick] [--profile]

``--quick``: 7 rounds of 10 steps, nothing written. ``--profile``: after the rounds, cProfile over
``--steps`` steps of B and of A, printing the functions of this library and the per-step time of
each (where B's cost goes). Needs the ``opacus``
extra; with the defaults about 2 minutes on 2 quiet cores, 4 to 5 under load.
Writes the ``opacus_overhead`` section of benchmarks/results.json and re-renders benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from _common import training_blocks, update_results

BATCH, BATCHES, LR, SLACK = 32, 50, 0.1, 0.02
MODEL = "Opacus MNIST CNN (26,010 parameters)"
SAMPLINGS = ("shuffle_once", "poisson")
OPTIMIZERS = ("sgd", "adam")


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


def _optimizer(kind: str, model: Any) -> Any:
    import torch

    return torch.optim.SGD(model.parameters(), lr=LR) if kind == "sgd" else torch.optim.Adam(model.parameters(), 1e-3)


def _pipeline(accountant: str, sampling: str, data: Any, kind: str = "sgd") -> Callable[[int], float]:
    """A private training pipeline; returns ``steps(k)``: run k steps, return their CPU time (s)."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    torch.manual_seed(0)
    model = _mnist_cnn()
    loss = torch.nn.CrossEntropyLoss()
    poisson = sampling == "poisson"
    sampler = None
    if not poisson:  # plain Opacus: the same order from a list (a ShuffleOnceSampler reports to the accountant)
        sampler = lastiter_opacus.ShuffleOnceSampler(data, seed=0)
        sampler = sampler if accountant != "rdp" else list(sampler.permutation)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = PrivacyEngine(accountant=accountant).make_private(
            module=model, optimizer=_optimizer(kind, model), data_loader=loader,
            noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=poisson, criterion=loss,
        )  # fmt: skip
    steps = training_blocks(model, optimizer, loader, loss)
    steps.optimizer = optimizer  # type: ignore[attr-defined]  # (for --profile)
    return steps


def measure(sampling: str, *, rounds: int, steps: int, profile: bool, kind: str = "sgd") -> dict[str, Any]:
    import torch

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # denormal weights in one pipeline only would skew the ratio
    name = lastiter_opacus.register(
        f"bench-last-iterate-{sampling}", bound="best", sampling=sampling, dataset_size=BATCH * BATCHES,
        learning_rate=LR, smoothness=1.0, force=True,
    )  # fmt: skip
    data = _images(BATCH * BATCHES)
    arms = {"A": _pipeline("rdp", sampling, data, kind), "B": _pipeline(name, sampling, data, kind)}
    arms["A'"] = _pipeline("rdp", sampling, data, kind)
    for run in arms.values():
        run(BATCHES)  # one epoch first: the adapter registers its hooks at the first step
    orders = list(itertools.permutations(arms))
    blocks: dict[str, list[float]] = {arm: [] for arm in arms}
    ratios, controls = [], []
    for r in range(rounds):
        times = {arm: arms[arm](steps) for arm in orders[r % len(orders)]}
        for arm, t in times.items():
            blocks[arm].append(t / steps)
        ratios.append(times["B"] / times["A"])
        controls.append(times["A'"] / times["A"])
        print(f"  round {r + 1}: ratio {ratios[-1]:.4f}, A/A {controls[-1]:.4f}", file=sys.stderr, flush=True)
    ratio, control = statistics.median(ratios), statistics.median(controls)
    hook_s, hook_share = _step_hook(arms["B"], steps)
    row = {
        "model": MODEL,
        "batch_size": BATCH,
        "sampling": sampling,
        "optimizer": kind,
        "rounds": rounds,
        "steps_per_block": steps,
        "step_ms": {arm: statistics.median(v) * 1e3 for arm, v in blocks.items()},
        "ratio": ratio,
        "ratio_spread": [min(ratios), max(ratios)],
        "control_ratio": control,
        "control_spread": [min(controls), max(controls)],
        "added_us": (statistics.median(blocks["B"]) - statistics.median(blocks["A"])) * 1e6,
        "step_hook_us": hook_s * 1e6,
        "step_hook_share": hook_share,
        "goal": f"ratio <= control's upper end + {SLACK:g}",
        "met": ratio <= max(controls) + SLACK,
    }
    if profile:
        _profile(arms, steps)
    return row


def _step_hook(run: Callable[[int], float], steps: int) -> tuple[float, float]:
    """B's step hook (the accountant's per-step checks, which Opacus calls before the update), timed by
    ``time.process_time`` around Opacus' ``optimizer.step_hook`` over ``steps`` steps: its median per
    step (s) and its share of those steps' CPU time."""
    optimizer = run.optimizer  # type: ignore[attr-defined]
    hook, spent = optimizer.step_hook, []

    def timed(optim: Any) -> None:
        start = time.process_time()
        hook(optim)
        spent.append(time.process_time() - start)

    optimizer.step_hook = timed
    total = run(steps)
    optimizer.step_hook = hook
    return statistics.median(spent), sum(spent) / total


def _profile(arms: dict[str, Callable[[int], float]], steps: int) -> None:
    """cProfile over ``steps`` steps of B and of A: this library's functions, per step (us; cProfile
    inflates small calls)."""
    import cProfile
    import pstats

    for arm in ("B", "A"):
        profiler = cProfile.Profile(time.process_time)
        profiler.runcall(arms[arm], steps)
        stats = pstats.Stats(profiler)
        total = stats.total_tt / steps * 1e6
        print(f"  profile {arm}: {total:.0f} us per step (profiled)", file=sys.stderr)
        rows = [
            (ct / steps * 1e6, tt / steps * 1e6, nc // steps, f"{path.split('lastiter_plugins/')[-1]}:{line} {fn}")
            for (path, line, fn), (_, nc, tt, ct, _) in stats.stats.items()
            if "lastiter_plugins" in path
        ]
        for cum, own, calls, where in sorted(rows, reverse=True)[:25]:
            print(f"    {cum:9.1f} cum {own:8.1f} own {calls:4d}x  {where}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=14, help="rounds of three blocks (at least 7)")
    parser.add_argument("--steps", type=int, default=150, help="steps per block")
    parser.add_argument("--sampling", choices=SAMPLINGS, action="append", help="default: both")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, action="append", help="default: both")
    parser.add_argument("--quick", action="store_true", help="7 rounds of 10 steps, nothing written")
    parser.add_argument("--profile", action="store_true", help="cProfile B and A after the rounds")
    args = parser.parse_args(argv)
    rounds, steps = (7, 10) if args.quick else (args.rounds, args.steps)
    if rounds < 7:
        parser.error("--rounds must be at least 7 (the median of at least 7 blocks)")
    warnings.simplefilter("ignore")  # torch's backward-hook notices, once per step
    start = time.perf_counter()
    rows = []
    for kind, sampling in itertools.product(args.optimizer or OPTIMIZERS, args.sampling or SAMPLINGS):
        print(f"{MODEL}, batch {BATCH}, {sampling}, {kind}:", file=sys.stderr, flush=True)
        row = measure(sampling, rounds=rounds, steps=steps, profile=args.profile, kind=kind)
        rows.append(row)
        print(
            f"  ratio {row['ratio']:.4f} {row['ratio_spread']}, A/A {row['control_ratio']:.4f} "
            f"{row['control_spread']}, step {row['step_ms']['A']:.2f} ms, added {row['added_us']:+.0f} us, B's step "
            f"hook {row['step_hook_us']:.0f} us ({row['step_hook_share']:.2%}); "
            f"target {'met' if row['met'] else 'NOT met'}",
            flush=True,
        )
    if not args.quick:
        command = f"python benchmarks/bench_opacus_overhead.py --rounds {rounds} --steps {steps}"
        command += "".join(f" --sampling {s}" for s in args.sampling or ())
        command += "".join(f" --optimizer {o}" for o in args.optimizer or ())
        update_results("opacus_overhead", rows, command=command, seconds=time.perf_counter() - start, threads=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
