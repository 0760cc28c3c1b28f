"""Utility at fixed privacy: test accuracy of DP linear models whose noise is calibrated by three accountants.

    python benchmarks/bench_utility.py                  # writes docs/utility.md (results block) and docs/utility.png
    python benchmarks/bench_utility.py --seeds 1 --epochs 5 --no-write   # a quick look, prints the table only

For each dataset (scikit-learn's breast cancer: binary logistic regression; digits:
softmax regression, 10 classes), each target epsilon in {1, 3} at delta = 1e-5, each
method below and each number of epochs in a small grid, the noise multiplier is
calibrated to the target, then the same model (``FeatureNormClip(1)`` + one
``nn.Linear``) is trained with Opacus (same learning rate, clip norm, weight decay and
batch size) for 3 seeds, and the test accuracy is recorded:

* ``opacus-rdp``: Opacus' RDP accountant with a Poisson loader (``poisson_sampling=True``),
  what most users run; add-or-remove-one neighbours, every iterate.
* ``composition``: the valid standard accountant for a shuffling loader
  (``DataLoader(shuffle=True)``): lastiter's ``composition`` with ``sampling="reshuffle"``;
  replace-one neighbours, every iterate.
* ``last-iterate``: lastiter's ``best`` on a shuffle-once loader (``ShuffleOnceSampler``),
  with the constants derived from the model (``register(..., model="glm")``); replace-one
  neighbours, final model only.

Methods ``composition`` and ``last-iterate`` train under the registered accountant, which
derives the constants from the model and checks every step; the epsilon it reports at the
end is asserted to be <= the target. The non-private model is the same model trained with
plain SGD (same learning rate, weight decay and epochs, no clipping, no noise).

The data split is fixed (seed 0); the seeds vary the initialisation, the noise, the
Poisson batches and the permutations (a fixed ``ShuffleOnceSampler`` seed makes the run
reproducible; in a real run the permutation must be secret). The "best epochs" column
picks, per method, the grid value with the highest mean test accuracy, on the test
split: that selection is not privately accounted (it is the usual practice it shows).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.accountants.utils import get_noise_multiplier
from sklearn.datasets import load_breast_cancer, load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lastiter_plugins as lp
from lastiter_plugins.adapters import opacus as lastiter_opacus
from lastiter_plugins.glm import certify_linear_model

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5
TARGETS = (1.0, 3.0)
METHODS = ("opacus-rdp", "composition", "last-iterate")
FEATURE_NORM = 1.0
COMMAND = "python benchmarks/bench_utility.py"


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    loss: str  # register(loss=...)
    family: str  # certify_linear_model family
    train_size: int
    batch_size: int
    classes: int
    weight_decay: float

    def data(self):
        bunch = load_breast_cancer() if self.name == "breast cancer" else load_digits()
        order = np.random.default_rng(0).permutation(len(bunch.data))
        train, public = order[: self.train_size], order[self.train_size :]
        mean, std = bunch.data[public].mean(axis=0), bunch.data[public].std(axis=0) + 1.0
        x = ((bunch.data - mean) / std).astype(np.float32)
        y = bunch.target.astype(np.float32 if self.classes == 2 else np.int64)
        return (torch.tensor(x[train]), torch.tensor(y[train])), (torch.tensor(x[public]), torch.tensor(y[public]))

    def certificate(self, clip_norm: float):
        return certify_linear_model(
            self.family,
            feature_norm_bound=FEATURE_NORM,
            clip_norm=clip_norm,
            bias=True,
            num_classes=self.classes if self.classes > 2 else None,
            l2=self.weight_decay,
        )

    def clip_norm(self) -> float:
        if self.classes == 2:
            return 1.0  # clipping may be active: a scalar GLM stays convex and smooth
        never_active = self.certificate(1.0).clip_norm_never_active  # softmax: clipping must be inactive
        return math.ceil(never_active * 1000) / 1000

    def learning_rate(self) -> float:
        cert = self.certificate(self.clip_norm())
        return 1.0 / (cert.smoothness + cert.strong_convexity)  # < 2/(lam + M)


TASKS = (
    Task("breast cancer", "logistic", "binary_logistic", 450, 45, 2, 0.01),
    Task("digits", "softmax", "softmax_cross_entropy", 1440, 96, 10, 0.01),
)


def calibrate(task: Task, method: str, target: float, epochs: int) -> float:
    n, b = task.train_size, task.batch_size
    if method == "opacus-rdp":
        return get_noise_multiplier(
            target_epsilon=target, target_delta=DELTA, sample_rate=b / n, epochs=epochs, accountant="rdp"
        )
    clip = task.clip_norm()
    kwargs = task.certificate(clip).loss_assumption_kwargs()
    sampling, bound = ("reshuffle", "composition") if method == "composition" else ("shuffle_once", "best")
    return lp.calibrate_noise(
        bound,
        target,
        DELTA,
        dataset_size=n,
        batch_size=b,
        epochs=epochs,
        learning_rate=task.learning_rate(),
        clip_norm=clip,
        sampling=sampling,
        **kwargs,
    )


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, classes: int) -> float:
    model.eval()
    with torch.no_grad():
        out = model(x)
        pred = (out.squeeze(-1) > 0).float() if classes == 2 else out.argmax(dim=1)
    return float((pred == y).float().mean())


def train(task: Task, method: str | None, noise: float, epochs: int, seed: int, target: float) -> float:
    """Test accuracy after ``epochs`` epochs; method None: non-private."""
    (x, y), (x_test, y_test) = task.data()
    n, dim = x.shape
    torch.manual_seed(seed)
    outputs = 1 if task.classes == 2 else task.classes
    model = nn.Sequential(lastiter_opacus.FeatureNormClip(FEATURE_NORM), nn.Linear(dim, outputs))
    lr = task.learning_rate()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=task.weight_decay)
    dataset = TensorDataset(x, y)
    loss_fn = nn.CrossEntropyLoss() if task.classes > 2 else nn.BCEWithLogitsLoss()
    squeeze = task.classes == 2
    engine = None
    if method is None:
        loader = DataLoader(
            dataset, batch_size=task.batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
        )
    elif method == "opacus-rdp":
        engine = PrivacyEngine(accountant="rdp")
        loader = DataLoader(dataset, batch_size=task.batch_size)
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=noise,
            max_grad_norm=task.clip_norm(), poisson_sampling=True,
        )  # fmt: skip
    else:
        shuffle_once = method == "last-iterate"
        name = lastiter_opacus.register(
            f"utility-{method}",
            force=True,
            bound="best" if shuffle_once else "composition",
            sampling="shuffle_once" if shuffle_once else "reshuffle",
            dataset_size=n,
            learning_rate=lr,
            model="glm",
            loss=task.loss,
            feature_norm=FEATURE_NORM,
        )
        engine = PrivacyEngine(accountant=name)
        if shuffle_once:
            loader = DataLoader(
                dataset, batch_size=task.batch_size, sampler=lastiter_opacus.ShuffleOnceSampler(n, seed=seed)
            )
        else:
            loader = DataLoader(
                dataset, batch_size=task.batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
            )
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, criterion=loss_fn, data_loader=loader, noise_multiplier=noise,
            max_grad_norm=task.clip_norm(), poisson_sampling=False,
        )  # fmt: skip
    model.train()
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            out = model(xb)
            loss_fn(out.squeeze(-1) if squeeze else out, yb).backward()
            optimizer.step()
    if engine is not None:
        spent = engine.get_epsilon(DELTA)
        if not spent <= target * (1 + 1e-9) + (0.02 if method == "opacus-rdp" else 0.0):  # Opacus' tolerance 0.01
            raise AssertionError(f"{method}: epsilon {spent} after training exceeds the target {target}")
    return accuracy(model, x_test, y_test, task.classes)


def _mean_spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run(seeds: int, grid: tuple[int, ...], fixed: int) -> dict:
    results: dict = {"grid": grid, "fixed": fixed, "seeds": seeds, "tasks": {}}
    for task in TASKS:
        entry = {"nonprivate": {}, "noise": {}, "accuracy": {}}
        for epochs in grid:
            entry["nonprivate"][epochs] = [train(task, None, 0.0, epochs, s, math.inf) for s in range(seeds)]
        for target in TARGETS:
            for method in METHODS:
                for epochs in grid:
                    z = calibrate(task, method, target, epochs)
                    entry["noise"][(target, method, epochs)] = z
                    entry["accuracy"][(target, method, epochs)] = [
                        train(task, method, z, epochs, s, target) for s in range(seeds)
                    ]
                    acc = _mean_spread(entry["accuracy"][(target, method, epochs)])
                    print(f"  {task.name:13s} eps={target:g} {method:12s} E={epochs:3d} z={z:7.3f} acc={acc[0]:.3f}")
        results["tasks"][task.name] = entry
    return results


def render(results: dict, elapsed: float, machine: str) -> str:
    grid, fixed, seeds = results["grid"], results["fixed"], results["seeds"]
    lines = [
        f"Command: `{COMMAND}` ({elapsed / 60:.1f} min on {machine}). Test accuracy, mean ± standard deviation "
        f"over {seeds} seeds; z = calibrated noise multiplier; epochs grid {list(grid)}, fixed budget E = {fixed}.",
        "",
        f"| dataset | target eps | non-private (E = {fixed}) | method | z at E = {fixed} | accuracy at E = {fixed} "
        "| best E | z at best E | accuracy at best E |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in results["tasks"].items():
        nonprivate = _mean_spread(entry["nonprivate"][fixed])
        for target in TARGETS:
            for method in METHODS:
                acc = _mean_spread(entry["accuracy"][(target, method, fixed)])
                best = max(grid, key=lambda e: statistics.fmean(entry["accuracy"][(target, method, e)]))
                best_acc = _mean_spread(entry["accuracy"][(target, method, best)])
                lines.append(
                    f"| {name} | {target:g} | {nonprivate[0]:.3f} ± {nonprivate[1]:.3f} | {method} | "
                    f"{entry['noise'][(target, method, fixed)]:.2f} | {acc[0]:.3f} ± {acc[1]:.3f} | {best} | "
                    f"{entry['noise'][(target, method, best)]:.2f} | {best_acc[0]:.3f} ± {best_acc[1]:.3f} |"
                )
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = results["grid"]
    fig, axes = plt.subplots(1, len(results["tasks"]), figsize=(11, 4.6), sharey=False)
    colours = {"opacus-rdp": "tab:blue", "composition": "tab:orange", "last-iterate": "tab:green"}
    for ax, (name, entry) in zip(np.atleast_1d(axes), results["tasks"].items(), strict=True):
        mean = [statistics.fmean(entry["nonprivate"][e]) for e in grid]
        ax.plot(grid, mean, color="black", marker="o", label="non-private")
        for target, style in zip(TARGETS, ("--", "-"), strict=True):
            for method in METHODS:
                stats = [_mean_spread(entry["accuracy"][(target, method, e)]) for e in grid]
                ax.errorbar(
                    grid, [s[0] for s in stats], yerr=[s[1] for s in stats], color=colours[method], linestyle=style,
                    marker="o", capsize=3, label=f"{method}, eps = {target:g}",
                )  # fmt: skip
        ax.set_title(f"{name} (delta = {DELTA:g})")
        ax.set_xlabel("epochs")
        ax.set_ylabel("test accuracy")
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(grid, [str(e) for e in grid])
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)


def write_doc(table: str, path: Path) -> None:
    text = path.read_text()
    pattern = re.compile(r"(<!-- results:start -->\n).*?(\n<!-- results:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no <!-- results:start --> ... <!-- results:end --> block")
    path.write_text(pattern.sub(lambda m: m.group(1) + table + m.group(2), text))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, nargs="+", default=[5, 20, 80], help="the epoch grid")
    parser.add_argument("--fixed", type=int, default=20, help="the common epoch budget (a grid value)")
    parser.add_argument("--machine", default="CPU, torch.set_num_threads(1)", help="what the doc says it ran on")
    parser.add_argument("--no-write", action="store_true", help="print the table; write neither doc nor plot")
    args = parser.parse_args(argv)
    grid = tuple(sorted(set(args.epochs)))
    fixed = args.fixed if args.fixed in grid else grid[len(grid) // 2]
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*full backward hook")
    warnings.filterwarnings("ignore", category=UserWarning, module="opacus")
    torch.set_num_threads(1)
    start = time.time()
    results = run(args.seeds, grid, fixed)
    table = render(results, time.time() - start, args.machine)
    print(table)
    if not args.no_write:
        write_doc(table, ROOT / "docs" / "utility.md")
        plot(results, ROOT / "docs" / "utility.png")
        print("wrote docs/utility.md (results block) and docs/utility.png", file=sys.stderr)


if __name__ == "__main__":
    main()
